"""What the report reads from the built-in suite files (directly, without the spec module, which loads torch).

- `expand(name)`: a --suite name as the suite names runs are stored under: a suite that includes others stands for
  them (recursively), an alias for its suite (`cifar`: `cifar10`); any other name stands for itself.
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
from structbench.plan import suite_lookup

SMOKE = "smoke"


@functools.lru_cache(maxsize=256)
def _path(name: str) -> Path:
    return Path(str(resources.files("structbench") / "suites")) / f"{name}.toml"


def read(name: str) -> dict[str, Any] | None:
    """The built-in suite file's table, or None when there is no built-in suite of that name."""
    path = _path(name)
    return _read_path(path) if path.is_file() else None


@functools.lru_cache(maxsize=256)
def _read_path(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"suite file {path} is not valid TOML: {exc}") from None


def expand(name: str) -> list[str]:
    """The suite names `--suite name` stands for, the suite found as `run --suite` finds it
    (structbench.plan.suite_lookup: the user's suites, the built-in ones, aliases such as cifar for cifar10)."""
    found = suite_lookup.find(name)
    if found is None:
        return [name]
    children = _read_path(found.path).get("include", [])
    return [n for child in children for n in expand(child)] or [found.stored_as]


def named_optimizers(name: str) -> set[str] | None:
    raw = read(name)
    if raw is None:
        return None
    return ({o for o in raw.get("optims", []) if o != "*"}) | set(raw.get("hparams", {}))


def is_smoke(name: str) -> bool:
    return name.startswith(SMOKE) or name in expand(SMOKE)
