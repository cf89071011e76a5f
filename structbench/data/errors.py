"""The error a dataset reader raises for a file that exists but cannot be parsed."""

from __future__ import annotations

from pathlib import Path

from structbench.errors import UsageError


class DataFormatError(UsageError):
    """A dataset file is present but truncated, corrupt or not in the expected format.

    The message starts with the offending file (a path, or ``archive:member``), so the user knows
    what to replace.
    """

    def __init__(self, source: Path | str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem
