"""What the report reads from the built-in suite files (directly, without the spec module, which loads torch).

- `expand(name)`: a --suite name as the suite names runs are stored under: a suite that includes others stands for
  them (recursively), an alias for its suite (`cifar`: `cifar10`); any other name stands for itself.
- `tuned_optimizers(name, source)`: the optimizers a suite file tunes (suite_lookup.tuned_optimizers: its
  `[hparams.<optim>]` table sets `lr`, or its `tuned` list names them), read from the run's suite file where it still
  is, else from the built-in suite of that name; None when neither can be read.
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


def tuned_optimizers(name: str, source: object = None) -> set[str] | None:
    """The optimizers the suite tunes (module docstring); `source`: the suite file's path a run stored."""
    path = Path(source) if isinstance(source, str) and source.endswith(".toml") else None
    if path is None or not path.is_file():
        path = _path(name)
    if not path.is_file():
        return None
    try:
        return suite_lookup.tuned_optimizers(_read_path(path))
    except (UsageError, OSError, UnicodeDecodeError):
        return None


def is_smoke(name: str) -> bool:
    return name.startswith(SMOKE) or name in expand(SMOKE)
