"""CSV export: `runs.csv` (one row per run, every column of the store's run rows) and `curves.csv` (one row per
logged point of those runs), written by pandas. Floats are written with enough digits to read back exactly,
timestamps with their UTC offset, integer columns as integers (empty where a run lacks the value), JSON columns
(hparams, spec, routing) as their text.

The two files always hold exactly the runs selected: a second export to the same directory replaces them (each is
written under a temporary name and renamed into place, so a reader never sees half a file).
"""

from __future__ import annotations

import os

from structbench.export import fields
from structbench.export.base import Progress, Result, Selection, destination_directory
from structbench.store.write import CURVE_SCHEMA, RUN_SCHEMA

RUNS_FILE = "runs.csv"
CURVES_FILE = "curves.csv"


def export(selection: Selection, destination: str, name: str, progress: Progress) -> Result:
    """The selected runs and their curve points as two CSV files in `destination` (`name` is not used)."""
    dest = destination_directory(destination)
    dest.mkdir(parents=True, exist_ok=True)
    runs = selection.runs[RUN_SCHEMA.names].astype({c: "Int64" for c in RUN_SCHEMA.names if fields.integer_column(c)})
    curves = selection.curves.sort_values(["run_id", "step", "split"], kind="stable")
    replaced = (dest / RUNS_FILE).exists() or (dest / CURVES_FILE).exists()
    temporaries = []
    try:
        for frame, name in ((runs, RUNS_FILE), (curves[CURVE_SCHEMA.names], CURVES_FILE)):
            temporary = dest / f".{name}.{os.getpid()}.tmp"
            temporaries.append((temporary, dest / name))  # before writing: a write cut short is removed too
            frame.to_csv(temporary, index=False)
        for temporary, final in temporaries:
            os.replace(temporary, final)
    finally:
        for temporary, _ in temporaries:
            temporary.unlink(missing_ok=True)
    for run_id in selection.runs["run_id"]:
        progress(run_id)
    note = (
        f" ({RUNS_FILE}: {len(selection.runs)} rows, {CURVES_FILE}: {len(curves)} rows"
        + ("; replaced the files of the previous export)" if replaced else ")")
    )
    return Result(len(selection.runs), 0, str(dest), note)
