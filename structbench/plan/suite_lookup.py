"""Where a suite name's file is: the user's own suite directories first, then the built-in suites.

`--suite NAME` looks for `NAME.toml` in, in this order:

1. `./suites/` (the directory the command runs in: a project keeps its suites beside its `results/`),
2. each directory of `$STRUCTBENCH_SUITES` (separated by `os.pathsep`, `:` on POSIX), in the order given,
3. the suites that ship with structbench, where a few short names are aliases of others (`cifar` is `cifar10`).

The first file found wins. A user's file that has the name of a built-in suite (or alias) hides it; the clash is
reported, never silent. This module reads no TOML and imports no torch (the report uses it too).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

SUITES_ENV = "STRUCTBENCH_SUITES"
LOCAL_DIR = Path("suites")
ALIASES: dict[str, str] = {"cifar": "cifar10"}
"""Built-in short names: alias -> the built-in suite it stands for (runs are stored under the latter's name)."""


@dataclass(frozen=True)
class SuiteFile:
    """One suite as `--suite` finds it.

    `name` is the name asked for; `stored_as` the name its runs are stored under (the file's stem: an alias's
    target); `origin` says where it was found ("./suites", "$STRUCTBENCH_SUITES", "built-in", "alias of cifar10");
    `hides` is the built-in suite file this user file hides, if any.
    """

    name: str
    path: Path
    origin: str
    hides: Path | None = None

    @property
    def stored_as(self) -> str:
        return self.path.stem

    def clash_note(self) -> str | None:
        """One sentence naming the clash with a built-in suite, or None."""
        if self.hides is None:
            return None
        return (
            f"suite {self.name!r} is {self.path} ({self.origin}), which takes precedence over the built-in suite "
            "of that name"
        )


def tuned_optimizers(raw: Mapping[str, Any]) -> set[str]:
    """The optimizers a suite file's table tunes: those whose `[hparams.<optim>]` table sets `lr`, and those its
    `tuned` list names. An optimizer the suite lists without either runs at the registry's defaults, untuned here."""
    tables = raw.get("hparams", {})
    marked = raw.get("tuned", [])
    setting_lr = {name for name, table in tables.items() if isinstance(table, Mapping) and "lr" in table}
    return setting_lr | ({name for name in marked if isinstance(name, str)} if isinstance(marked, list) else set())


def builtin_dir() -> Path:
    return Path(str(resources.files("structbench") / "suites"))


def user_dirs() -> list[tuple[Path, str]]:
    """The user's suite directories, in lookup order, each with how it was named."""
    dirs = [(LOCAL_DIR, f"./{LOCAL_DIR}")]
    dirs += [(Path(d).expanduser(), f"${SUITES_ENV}") for d in os.environ.get(SUITES_ENV, "").split(os.pathsep) if d]
    return dirs


def _builtin(name: str) -> SuiteFile | None:
    path = builtin_dir() / f"{name}.toml"
    if path.is_file():
        return SuiteFile(name, path, "built-in")
    target = ALIASES.get(name)
    if target is not None:
        return SuiteFile(name, builtin_dir() / f"{target}.toml", f"alias of {target}")
    return None


def find(name: str) -> SuiteFile | None:
    """The suite file `--suite name` means, or None when no directory has it."""
    if not name or "/" in name or os.sep in name or name.startswith("."):
        return None
    builtin = _builtin(name)
    for directory, origin in user_dirs():
        path = directory / f"{name}.toml"
        if path.is_file():
            return SuiteFile(name, path, origin, builtin.path if builtin is not None else None)
    return builtin


def every_suite() -> list[SuiteFile]:
    """Every suite name `--suite` accepts, sorted by name, each as `find` resolves it."""
    names = {p.stem for p in builtin_dir().glob("*.toml")} | set(ALIASES)
    for directory, _ in user_dirs():
        if directory.is_dir():
            names |= {p.stem for p in directory.glob("*.toml") if p.is_file()}
    found = (find(name) for name in sorted(names))
    return [suite for suite in found if suite is not None]


def names() -> list[str]:
    return [suite.name for suite in every_suite()]


def origin_text(suite: SuiteFile) -> str:
    """Where a suite comes from, as `structbench list suites` shows it: "built-in", "alias of cifar10", or the
    user's directory and file, saying when it hides a built-in suite."""
    if suite.path.parent == builtin_dir():
        return suite.origin
    hides = " (hides the built-in suite)" if suite.hides is not None else ""
    return f"{suite.origin}: {suite.path}{hides}"


def notes(name: str) -> list[str]:
    """What `run --suite name` says about the lookup: an alias it followed, a built-in suite a user's file hides."""
    found = find(name)
    if found is None:
        return []
    if found.origin.startswith("alias of "):
        return [f"suite {name!r} is an alias of {found.stored_as!r}; its runs are stored under {found.stored_as!r}."]
    clash = found.clash_note()
    return [f"{clash}."] if clash else []
