"""What every exporter takes and gives: the runs selected with their curve points, the progress callback, and the
result in words for the command line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from structbench.errors import UsageError
from structbench.store.write import Problem

Progress = Callable[[str], None]
"""Called with each run's id once it has been exported (or found already there)."""


@dataclass
class Selection:
    """The runs to export (store rows, every column) and their curve points."""

    runs: pd.DataFrame
    curves: pd.DataFrame
    problems: list[Problem] = field(default_factory=list)

    def __iter__(self) -> Iterator[tuple[pd.Series, pd.DataFrame]]:
        """Each run's row with its curve points."""
        by_run = dict(iter(self.curves.groupby("run_id", sort=False)))
        empty = self.curves.iloc[0:0]
        for _, run in self.runs.iterrows():
            yield run, by_run.get(run["run_id"], empty)


@dataclass
class Result:
    """What an export did, in words for the command line."""

    exported: int
    skipped: int
    where: str
    note: str = ""

    def message(self) -> str:
        skipped = f"; {self.skipped} already there, skipped" if self.skipped else ""
        return f"exported {self.exported} run(s) to {self.where}{skipped}{self.note}"


def destination_directory(dest: str) -> Path:
    """`dest` as the directory a file-based export writes; a UsageError when it exists and is not a directory."""
    directory = Path(dest)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} is not a directory; the export writes a directory of files.")
    return directory
