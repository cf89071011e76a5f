"""What the report reads from the built-in suite files (directly, without the spec module, which loads torch).

- `expand(name)`: a --suite name as the suite names runs are stored under: a built-in suite that includes others
  stands for them (recursively); any other name stands for itself.
- `named_optimizers(name)`: the optimizers a built-in suite names (its `optims` list, "*" excepted, and its
  `[hparams.<optim>]` tables), for runs stored before runs recorded where their hyperparameters came from; None for
  a suite that is not built in.
- `is_smoke(name)`: a smoke suite (a few dozen steps to check that everything runs: the built-in `smoke` suite's
  members, or a name starting with "smoke"), left out of the cross-suite aggregates unless asked for.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from structbench.errors import UsageError

SMOKE = "smoke"


def _path(name: str) -> Path:
    return Path(str(resources.files("structbench") / "suites")) / f"{name}.toml"


@functools.lru_cache(maxsize=256)
def read(name: str) -> dict[str, Any] | None:
    """The built-in suite file's table, or None when there is no built-in suite of that name."""
    path = _path(name)
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"suite file {path} is not valid TOML: {exc}") from None


def expand(name: str) -> list[str]:
    raw = read(name)
    if raw is None:
        return [name]
    return [n for child in raw.get("include", []) for n in expand(child)] or [name]


def named_optimizers(name: str) -> set[str] | None:
    raw = read(name)
    if raw is None:
        return None
    return ({o for o in raw.get("optims", []) if o != "*"}) | set(raw.get("hparams", {}))


def is_smoke(name: str) -> bool:
    return name.startswith(SMOKE) or name in expand(SMOKE)
