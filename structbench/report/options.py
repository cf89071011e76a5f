"""The `report` command's options that need parsing: output formats, --suite names and the --since cut-off."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

import pandas as pd

from structbench.errors import UsageError

FORMATS = {"term": {"term"}, "md": {"md"}, "html": {"html"}, "all": {"term", "md", "html"}}


def formats(fmt: str) -> set[str]:
    """--format as the set of outputs to produce."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be term, md, html or all, got {fmt!r}.")
    return FORMATS[fmt]


def since(text: str | None) -> pd.Timestamp | None:
    """--since as a UTC timestamp (a date means its midnight; a time without a zone is UTC)."""
    if text is None:
        return None
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError):
        stamp = pd.NaT
    if pd.isna(stamp):
        raise UsageError(f"--since expects a date or date-time such as 2025-01-31 or 2025-01-31T12:00, got {text!r}.")
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def expand_suite(name: str) -> list[str]:
    """A --suite name as the suite names runs are stored under: a built-in suite that includes others stands for
    them (recursively); any other name stands for itself. Reads the suite files directly, without the spec module
    (which loads torch)."""
    path = Path(str(resources.files("structbench") / "suites")) / f"{name}.toml"
    if not path.is_file():
        return [name]
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"suite file {path} is not valid TOML: {exc}") from None
    return [n for child in raw.get("include", []) for n in expand_suite(child)] or [name]
