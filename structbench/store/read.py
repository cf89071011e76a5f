"""The one reader of a results store (docs/results-schema.md), for the report and the exporters alike: every column
of the store's run and curve schemas (store.write.RUN_SCHEMA, CURVE_SCHEMA; a column a file lacks reads as null),
through the store index (cached_read), which `structbench run` brings up to date at the end of a grid with
`refresh_index`."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import pandas as pd
import pyarrow as pa

from structbench.store import paths
from structbench.store import write as store
from structbench.store.cached_read import read_columns
from structbench.store.write import Problem

REQUIRED_RUN_COLUMNS = ("run_id", "suite", "optim", "seed", "status")
REQUIRED_CURVE_COLUMNS = ("step", "split", "loss")


def readable_runs(table: pa.Table) -> str | None:
    """Why a run file's rows cannot be read, or None: a schema version this structbench does not read, or a run id
    that is not one plain file name (the report and the exporters name files and folders after run ids, so a crafted
    row could otherwise point them outside their directory)."""
    reason = store.unsupported_version(table)
    if reason is not None:
        return reason
    bad = next((run_id for run_id in table.column("run_id").to_pylist() if not paths.is_plain_name(str(run_id))), None)
    return None if bad is None else f"run_id {bad!r} is not one plain file name"


def _read_runs(out: Path) -> tuple[pa.Table, list[Problem]]:
    index = store.index_dir(out) / "runs.arrow"
    return read_columns(store.runs_dir(out), store.RUN_SCHEMA, REQUIRED_RUN_COLUMNS, index, validate=readable_runs)


def _read_curves(out: Path, only: Collection[str] | None) -> tuple[pa.Table, list[Problem]]:
    index = store.index_dir(out) / "curves.arrow"
    return read_columns(store.curves_dir(out), store.CURVE_SCHEMA, REQUIRED_CURVE_COLUMNS, index, only)


def refresh_index(out: Path) -> None:
    """Bring the store index up to date with every run and curve file in the store (`structbench run` calls this
    once at the end of a grid). The index is an optimisation: a failure to read or write it is ignored, and the
    files it could not read are left for the report to warn about."""
    try:
        _read_runs(out)
        _read_curves(out, None)
    except store.READ_ERRORS:
        return


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Text columns as Python objects: one consolidated block, so slicing thousands of small groups stays fast."""
    text = [c for c in frame.columns if pd.api.types.is_string_dtype(frame[c])]
    return frame.astype(dict.fromkeys(text, object))


def load_runs(out: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """Every readable run row of the store, in (suite, optimizer, seed, start, run id) order (the report's and the
    exporters' filters are report.analysis.filters').

    Files of a schema version this structbench does not read, or with a run id that is not a plain file name, are
    reported as problems and skipped (`readable_runs`)."""
    table, problems = _read_runs(out)
    runs = _plain(table.to_pandas())
    return runs.sort_values(["suite", "optim", "seed", "started_at", "run_id"]).reset_index(drop=True), problems


def load_curves(out: Path, run_ids: Collection[str]) -> tuple[pd.DataFrame, list[Problem]]:
    """Curve points of the given runs, in (run, split, step) order."""
    table, problems = _read_curves(out, {f"{r}.parquet" for r in run_ids})
    curves = _plain(table.to_pandas())
    return curves.sort_values(["run_id", "split", "step"], kind="stable").reset_index(drop=True), problems
