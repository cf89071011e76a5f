"""Suite files: where a suite name leads (`structbench.plan.suite_lookup`), and its TOML table read and checked field
by field for type. What the fields mean, their defaults and the checks that need the optimizers and tasks are in
`structbench.plan.spec`; this module needs neither, so `structbench list suites` does not import torch."""

from __future__ import annotations

import os
import reprlib
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from structbench.errors import UsageError, unknown_name_message
from structbench.plan import suite_lookup
from structbench.store.paths import check_name


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_table_of_tables(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def _is_ints(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


SUITE_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "experiment": (lambda v: isinstance(v, str), "a string"),
    "description": (lambda v: isinstance(v, str), "a string"),
    "task": (lambda v: isinstance(v, str), "a string"),
    "task_args": (_is_table, "a table"),
    "budget": (_is_table, "a table"),
    "schedule": (_is_table, "a table"),
    "target": (_is_table, "a table"),
    "optims": (_is_names, "a non-empty list of optimizer names"),
    "seeds": (_is_ints, "a non-empty list of integers"),
    "hparams": (_is_table_of_tables, "a table of [hparams.<optim>] tables"),
    "tuned": (_is_names, "a non-empty list of optimizer names"),
    "checks": (_is_table, "a table"),
    "include": (_is_names, "a non-empty list of suite names or paths"),
    "sweep": (_is_table_of_tables, "a table of [sweep.<optim>] tables"),
    "resources": (_is_table, "a table"),
}
"""Each top-level field of a suite file: a test of its value's type, and that type in words."""
SUITE_KEYS = set(SUITE_FIELDS)


def suite_names() -> list[str]:
    """Every name `--suite` accepts: the user's suites (structbench.plan.suite_lookup), the built-in ones and
    aliases."""
    return suite_lookup.names()


def read_suite_file(name_or_path: str) -> tuple[str, Path, dict[str, Any]]:
    """Find a suite by name (structbench.plan.suite_lookup: the user's suite directories, then the built-in suites) or
    by path to a .toml file; return (the name its runs are stored under, path, raw table)."""
    path = _suite_path(name_or_path)
    raw = _parse_suite_file(path)
    unknown = set(raw) - SUITE_KEYS
    if unknown:
        raise UsageError(
            f"suite file {path}: unknown field(s) {', '.join(map(repr, sorted(unknown)))}; "
            f"valid: {', '.join(sorted(SUITE_KEYS))}."
        )
    for key, value in raw.items():
        is_valid, expected = SUITE_FIELDS[key]
        if not is_valid(value):
            raise UsageError(f"suite file {path}: field {key!r} must be {expected}, got {reprlib.repr(value)}.")
    kinds = [key for key in ("task", "experiment", "include") if key in raw]
    if len(kinds) != 1:
        named = " and ".join(kinds) or "none"
        raise UsageError(f"suite file {path} must name exactly one of task, experiment and include, got {named}.")
    check_name(f"suite file {path}: the suite name", path.stem)
    return path.stem, path, raw


def looks_like_path(name_or_path: str) -> bool:
    """Whether `--suite` was given a file's path (it ends in .toml, names a directory or starts with a dot) rather
    than a suite's name, which never does (structbench.plan.suite_lookup.find)."""
    return name_or_path.endswith(".toml") or "/" in name_or_path or os.sep in name_or_path or name_or_path[:1] == "."


def _suite_path(name_or_path: str) -> Path:
    """The suite file `--suite` means: a path to a .toml file as given, else the file a suite name leads to. A path
    that leads to no .toml file is a usage error naming it; an unknown name, one suggesting the closest known one."""
    if not looks_like_path(name_or_path):
        found = suite_lookup.find(name_or_path)
        if found is None:
            raise UsageError(unknown_name_message("suite", name_or_path, suite_names()))
        return found.path
    path = Path(name_or_path)
    if path.is_dir():
        raise UsageError(f"suite file {name_or_path} is a directory; give the path of a .toml file in it.")
    if not path.is_file():
        raise UsageError(f"no such suite file: {name_or_path} (from {Path.cwd()}).")
    if not name_or_path.endswith(".toml"):
        raise UsageError(f"suite file {name_or_path} must be a .toml file.")
    return path


def _parse_suite_file(path: Path) -> dict[str, Any]:
    """The TOML table of a suite file; a usage error naming the file when it is unreadable, not UTF-8 or not TOML."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read suite file {path}: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"suite file {path} is not UTF-8 text (byte {exc.start} cannot be decoded).") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"suite file {path} is not valid TOML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise UsageError(f"suite file {path} nests its tables or arrays too deeply to be read.") from None
