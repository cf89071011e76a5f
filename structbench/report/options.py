"""The `report` command's options that need parsing: output formats and the --since cut-off."""

from __future__ import annotations

from typing import TYPE_CHECKING

from structbench.errors import UsageError, did_you_mean

if TYPE_CHECKING:
    import pandas as pd

FORMATS = {"term": {"term"}, "md": {"md"}, "html": {"html"}, "all": {"term", "md", "html"}}


def formats(fmt: str) -> set[str]:
    """--format as the set of outputs to produce."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be term, md, html or all, got {fmt!r}.{did_you_mean(fmt, list(FORMATS))}")
    return FORMATS[fmt]


def since(text: str | None) -> pd.Timestamp | None:
    """--since as a UTC timestamp (a date means its midnight; a time without a zone is UTC)."""
    if text is None:
        return None
    import pandas as pd  # here: a report served from the output cache without --since does not load pandas

    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError):
        stamp = pd.NaT
    if pd.isna(stamp):
        raise UsageError(f"--since expects a date or date-time such as 2025-01-31 or 2025-01-31T12:00, got {text!r}.")
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
