"""What every exporter writes of a stored run, named once: its parameters, summary numbers, tags and scalar curves.

- parameters: `suite`, `task`, `optim`, `seed` and each optimizer hyperparameter as `optim.<name>` (from the run's
  `hparams`; lists and other values that are not a number, text or bool as JSON text);
- summary: the run's final and timing numbers (`final_train_loss`, `final_eval_loss`, `wall_s`, `peak_mem_bytes`,
  ...), under `final/<column>`;
- tags: `run_id`, `run_key`, `status` and the environment (device, versions, git commit and dirty flag, command
  line, ...), as text;
- scalars: each curve point's values as `<split>/<field>`: `train/loss`, `train/lr`, `train/step_time_s`,
  `train/optim_time_s`, `train/grad_norm`, `eval/loss`, `eval/<metric name>` (e.g. `eval/accuracy`), `val/...`, and
  `<split>/wall_s` (the run's clock at that point). A value the store does not hold (null) is not written.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa

from structbench.store.write import ENVIRONMENT_COLUMNS, RUN_SCHEMA

SUMMARY_COLUMNS = (
    "final_train_loss",
    "final_eval_loss",
    "final_eval_metric",
    "final_val_loss",
    "final_val_metric",
    "steps",
    "wall_s",
    "train_s",
    "eval_s",
    "compile_s",
    "step_time_median_s",
    "optim_time_median_s",
    "peak_mem_bytes",
    "state_bytes",
    "param_count",
    "target_step",
    "target_s",
    "throughput_per_s",
)
TAG_COLUMNS = (
    "run_id",
    "run_key",
    "status",
    "error",
    "eval_metric_name",
    "started_at",
    "finished_at",
    *ENVIRONMENT_COLUMNS,
    "command",
)
CURVE_FIELDS = ("loss", "metric", "lr", "step_time_s", "optim_time_s", "grad_norm", "wall_s")
SUMMARY_PREFIX = "final/"


def present(value: Any) -> bool:
    """Whether the store holds a value here (not null, NaN, NA or NaT)."""
    return value is not None and not (pd.api.types.is_scalar(value) and pd.isna(value))


def _plain(value: Any) -> bool | int | float | str:
    """A parameter value as a number, text or bool (the types every tracker takes); anything else as JSON text."""
    if isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True)


def params(run: pd.Series) -> dict[str, bool | int | float | str]:
    """The run's parameters (module docstring)."""
    found: dict[str, bool | int | float | str] = {
        "suite": str(run["suite"]),
        "task": str(run["task"]),
        "optim": str(run["optim"]),
        "seed": int(run["seed"]),
    }
    hparams = json.loads(run["hparams"]) if isinstance(run.get("hparams"), str) else {}
    for name, value in sorted(hparams.items()):
        found[f"optim.{name}"] = _plain(value)
    return found


def summary(run: pd.Series) -> dict[str, float]:
    """The run's final and timing numbers that the store holds, under `final/<column>`."""
    return {
        f"{SUMMARY_PREFIX}{column.removeprefix('final_')}": float(run[column])
        for column in SUMMARY_COLUMNS
        if present(run[column])
    }


def integer_column(column: str) -> bool:
    """Whether the store keeps `column` as integers (pandas reads such a column as floats when a run lacks it)."""
    return column in RUN_SCHEMA.names and pa.types.is_integer(RUN_SCHEMA.field(column).type)


def tags(run: pd.Series) -> dict[str, str]:
    """The run's identity, status and environment as text (columns the store does not hold are left out)."""
    found = {}
    for column in TAG_COLUMNS:
        if present(run[column]):
            value = run[column]
            if isinstance(value, pd.Timestamp):
                found[column] = value.isoformat()
            else:
                found[column] = str(int(value)) if integer_column(column) else str(value)
    return found


@dataclass(frozen=True)
class Scalar:
    step: int
    key: str
    value: float
    wall_s: float | None
    """The run's clock when the point was logged (seconds since its start), when stored."""


def scalars(curves: pd.DataFrame, metric_name: str | None) -> Iterator[Scalar]:
    """The run's curve points as scalars, in step order (train before eval before val within a step)."""
    order = {"train": 0, "eval": 1, "val": 2}
    ranked = curves.assign(_split=curves["split"].map(order).fillna(3))
    metric = metric_name if isinstance(metric_name, str) and metric_name else "metric"
    for point in ranked.sort_values(["step", "_split"], kind="stable").itertuples(index=False):
        wall = float(point.wall_s) if present(point.wall_s) else None
        for name in CURVE_FIELDS:
            value = getattr(point, name, None)
            if present(value):
                field = metric if name == "metric" else name
                yield Scalar(int(point.step), f"{point.split}/{field}", float(value), wall)
