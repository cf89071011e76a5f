"""Aggregation of the run store into one row per suite x optimizer (reads the store only)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from structbench.store import STATUSES

SUMMARY_COLUMNS = [
    "suite",
    "optim",
    "status",
    "final_eval_loss",
    "final_eval_metric",
    "eval_metric_name",
    "wall_s",
    "step_time_median_s",
    "peak_mem_bytes",
    "peak_mem_source",
    "state_bytes",
]


def summarize(runs: pd.DataFrame, suites: Sequence[str] = ()) -> pd.DataFrame:
    """Per suite x optimizer: run count, status counts, and medians over the runs that ended `ok`."""
    if suites:
        runs = runs[runs["suite"].isin(list(suites))]
    rows = []
    for (suite, optim_name), group in runs.groupby(["suite", "optim"], sort=True):
        ok = group[group["status"] == "ok"]
        counts = group["status"].value_counts()
        rows.append(
            {
                "suite": suite,
                "optim": optim_name,
                "runs": len(group),
                **{status: int(counts.get(status, 0)) for status in STATUSES},
                "eval_metric_name": group["eval_metric_name"].iloc[0],
                "final_eval_loss": ok["final_eval_loss"].median(),
                "final_eval_metric": ok["final_eval_metric"].median(),
                "wall_s": ok["wall_s"].median(),
                "step_time_median_s": ok["step_time_median_s"].median(),
                "peak_mem_bytes": ok["peak_mem_bytes"].median(),
                "peak_mem_source": ",".join(sorted(group["peak_mem_source"].dropna().unique())),
                "state_bytes": ok["state_bytes"].median(),
            }
        )
    return pd.DataFrame(rows)
