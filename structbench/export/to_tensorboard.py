"""TensorBoard export: one directory of event files per run, `<dest>/<run_id>/`, written by torch's SummaryWriter.

- scalars: the curves (fields.scalars) at their steps, each stamped with the run's start time plus the point's
  `wall_s`, so TensorBoard's "relative" axis is the run's own clock; the summary numbers (`final/...`) at the run's
  last step. TensorBoard stores scalars as 32-bit floats.
- hyperparameters through the HParams plugin: the run's parameters and status, with the summary numbers as its
  metrics (bools as the text True/False: torch's summary would store them as 1.0/0.0);
- the tags (identity, environment, command line) as a Markdown table under the text tag `provenance`.

`tensorboard --logdir <dest>` shows every run; a run's directory is written under a temporary name and renamed into
place, and a run whose directory exists is skipped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from structbench.export import fields
from structbench.export.base import Progress, Result, Selection, destination_directory

PROVENANCE_TAG = "provenance"


def hparams(run: pd.Series) -> dict[str, int | float | str]:
    """What the HParams plugin shows of a run: its parameters and status (bools as text)."""
    values = {**fields.params(run), "status": str(run["status"])}
    return {k: str(v) if isinstance(v, bool) else v for k, v in values.items()}


def provenance_text(tags: dict[str, str]) -> str:
    """The tags as a two-column Markdown table (TensorBoard's text plugin renders Markdown)."""
    rows = [f"| {key} | {value.replace('|', '&#124;')} |" for key, value in tags.items()]
    return "\n".join(["| field | value |", "|---|---|", *rows])


def _write(directory: Path, run: pd.Series, curves: pd.DataFrame) -> None:
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    start = pd.Timestamp(run["started_at"]).timestamp()
    last_step = int(run["steps"]) if fields.present(run["steps"]) else 0
    finished = pd.Timestamp(run["finished_at"]).timestamp() if fields.present(run["finished_at"]) else start
    summary = fields.summary(run)
    with SummaryWriter(log_dir=str(directory)) as writer:
        for scalar in fields.scalars(curves, run.get("eval_metric_name")):
            wall = start + scalar.wall_s if scalar.wall_s is not None else start
            writer.add_scalar(scalar.key, scalar.value, global_step=scalar.step, walltime=wall)
        for key, value in summary.items():
            writer.add_scalar(key, value, global_step=last_step, walltime=finished)
        writer.add_text(PROVENANCE_TAG, provenance_text(fields.tags(run)), global_step=last_step, walltime=finished)
        for part in hparams_summary(hparams(run), summary):
            writer.file_writer.add_summary(part, walltime=finished)


def export(selection: Selection, destination: str, name: str, progress: Progress) -> Result:
    """One event-file directory per run in `destination` (`name` is not used)."""
    dest = destination_directory(destination)
    dest.mkdir(parents=True, exist_ok=True)
    exported = skipped = 0
    for run, curves in selection:
        run_id = str(run["run_id"])
        final = dest / run_id
        if final.exists():
            skipped += 1
        else:
            partial = Path(tempfile.mkdtemp(prefix=f".{run_id}.", suffix=".partial", dir=dest))
            try:
                _write(partial, run, curves)
                os.rename(partial, final)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            exported += 1
        progress(run_id)
    return Result(exported, skipped, str(dest), f" (view: tensorboard --logdir {dest})")
