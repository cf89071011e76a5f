"""Rich tables for the terminal."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
from rich.table import Table

from structbench.store import STATUSES


def fmt_num(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}g}"


def fmt_bytes(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def fmt_seconds(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


def status_counts(row: Mapping[str, Any]) -> str:
    return " ".join(f"{row[s]} {s}" for s in STATUSES if row[s]) or "-"


def summary_table(summary: pd.DataFrame) -> Table:
    table = Table(title="structbench report (medians over runs that ended ok)")
    for name in (
        "suite",
        "optim",
        "runs",
        "status",
        "final eval loss",
        "final metric",
        "wall",
        "step time",
        "peak mem",
        "state",
    ):
        table.add_column(name, justify="left" if name in ("suite", "optim", "status") else "right")
    for _, row in summary.iterrows():
        table.add_row(
            row["suite"],
            row["optim"],
            str(row["runs"]),
            status_counts(row),
            fmt_num(row["final_eval_loss"]),
            f"{fmt_num(row['final_eval_metric'])} {row['eval_metric_name']}",
            fmt_seconds(row["wall_s"]),
            fmt_seconds(row["step_time_median_s"]),
            f"{fmt_bytes(row['peak_mem_bytes'])} ({row['peak_mem_source']})",
            fmt_bytes(row["state_bytes"]),
        )
    return table


def runs_table(rows: Iterable[Mapping[str, Any]]) -> Table:
    table = Table(title="runs")
    for name in (
        "suite",
        "optim",
        "seed",
        "status",
        "steps",
        "final eval loss",
        "metric",
        "wall",
        "step time",
        "peak mem",
        "state",
    ):
        table.add_column(name, justify="left" if name in ("suite", "optim", "status") else "right")
    for row in rows:
        style = None if row["status"] == "ok" else "red"
        table.add_row(
            row["suite"],
            row["optim"],
            str(row["seed"]),
            row["status"],
            str(row["steps"]),
            fmt_num(row["final_eval_loss"]),
            f"{fmt_num(row['final_eval_metric'])} {row['eval_metric_name']}",
            fmt_seconds(row["wall_s"]),
            fmt_seconds(row["step_time_median_s"]),
            fmt_bytes(row["peak_mem_bytes"]),
            fmt_bytes(row["state_bytes"]),
            style=style,
        )
    return table
