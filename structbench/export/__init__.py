"""Export stored runs to the field's trackers: TensorBoard event files, MLflow, Weights & Biases (offline files)
and CSV, with the report's filters (--suite, --optim, --since).

Each tracker is an optional extra of the package (`pip install 'structbench[tensorboard]'`, `[mlflow]`, `[wandb]`);
CSV needs nothing beyond pandas. What each writes is fields.py's: parameters, summary numbers, tags and the curves as
scalars by step.

A second export to the same destination adds only the runs it does not hold yet (a stored run never changes, so one
already exported is skipped and counted); CSV rewrites its two files with the runs selected. A run is written whole
or not at all: event files and W&B run directories are written under a temporary name and renamed into place, and an
MLflow run is left RUNNING until its last value is logged (an export that dies midway leaves a RUNNING run, which the
next export deletes and writes again).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from structbench.errors import UsageError
from structbench.export.base import Progress, Result, Selection
from structbench.report.analysis import filters
from structbench.store import read


@dataclass(frozen=True)
class Target:
    """An exporter: the module (structbench.export.<module>) whose `export(selection, dest, name, progress)` writes
    the runs, and the modules it imports (a missing one means its extra is not installed)."""

    module: str
    needs: tuple[str, ...] = ()


TARGETS = {
    "tensorboard": Target("to_tensorboard", ("tensorboard",)),
    "mlflow": Target("to_mlflow", ("mlflow", "sqlalchemy", "alembic")),
    "wandb": Target("to_wandb", ("wandb",)),
    "csv": Target("to_csv"),
}
"""The targets `export --to` takes, in the order its messages list them."""
DEFAULT_NAME = "structbench"
"""The MLflow experiment and W&B project runs go to unless --name says otherwise."""


def check_target(target: str) -> None:
    """A UsageError unless `target` is known and its extra installed (naming the `pip install` that adds it)."""
    if target not in TARGETS:
        raise UsageError(f"--to must be one of {', '.join(TARGETS)}, got {target!r}.")
    missing = [module for module in TARGETS[target].needs if importlib.util.find_spec(module) is None]
    if missing:
        raise UsageError(
            f"--to {target} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            f"pip install 'structbench[{target}]'"
        )


def select(
    out: Path,
    suites: Mapping[str, Sequence[str]] | None = None,
    optims: Sequence[str] = (),
    since: pd.Timestamp | None = None,
) -> Selection:
    """The store's runs that the filters keep (filters.apply: a filter matching nothing is a UsageError), in
    (suite, optimizer, seed, start) order, with their curves (read as the report reads them, store.read)."""
    if not out.is_dir():
        raise UsageError(f"results directory {out} does not exist; run `structbench run` first.")
    runs, problems = read.load_runs(out)
    if runs.empty:
        raise UsageError(f"no runs in {out} to export.")
    runs = filters.apply(runs, str(out), suites, optims, baseline=None, since=since).reset_index(drop=True)
    curves, curve_problems = read.load_curves(out, runs["run_id"].tolist())
    return Selection(runs, curves, problems + curve_problems)


def export(
    target: str, selection: Selection, dest: str, name: str = DEFAULT_NAME, progress: Progress | None = None
) -> Result:
    """Write the selection to `dest` (a directory; for MLflow a tracking URI or a SQLite file path)."""
    check_target(target)
    exporter = importlib.import_module(f"structbench.export.{TARGETS[target].module}")
    return exporter.export(selection, dest, name, progress or (lambda _run_id: None))
