"""Which of an optimizer's settings represents it: chosen on validation, else training loss, never the test split.

The suite's evaluation (`final_eval_loss`, `final_eval_metric`, the eval curves and so time to target) is the
split the report compares optimizers on, so choosing a setting by it would tune on the test set. A setting is
therefore chosen by a selection metric, the first of these that the optimizer's runs record:

1. `final_val_metric` — the task's metric (its name and direction are the eval metric's) on a validation split;
2. `final_val_loss` — the loss on a validation split (lower is better);
3. `final_train_loss` — the training loss of the run's last step (lower is better): "no validation split".

A validation column counts as recorded when the store has it and every setting with an ok run has a value in
at least one of its ok runs; otherwise (no column, or only some settings have one) the training loss is used for
all of the optimizer's settings, so they are all compared on one metric. A setting's score is the median over
its ok seeds of the selection metric (the runs' min and max are kept for the plots). The training loss is one
minibatch's loss at the last step, so it is noisy; the median over seeds is what damps it (averaging the last
logged training points would need every run's curve, which the report does not read for this).

Order: first the settings with a score whose runs never failed the optimizer's way (`diverged`, `oom`,
`solver_error`, or `timeout`: a run that did not finish its budget in the time allowed; `error` and `interrupted`
runs say nothing about the optimizer), then the settings with a score and such a failure, then the settings
without a score; within each group the best score, then the label. So a setting that diverged on some seed is
never chosen over one that did not, whatever their scores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from structbench.report.analysis.variants import Variant

VALIDATION_METRIC = "final_val_metric"
VALIDATION_LOSS = "final_val_loss"
TRAINING_LOSS = "final_train_loss"
OPTIMIZER_FAILURES = ("diverged", "oom", "solver_error", "timeout")


@dataclass(frozen=True)
class Criterion:
    """The selection metric of one optimizer's settings."""

    column: str
    """The run column it reads ("" when the runs record none of the three)."""
    mode: str
    """"min" or "max"."""
    name: str
    """In words: "validation accuracy", "validation loss", "training loss"."""

    @property
    def validated(self) -> bool:
        return self.column in (VALIDATION_METRIC, VALIDATION_LOSS)

    def describe(self) -> str:
        """How the setting was chosen, as the report says it."""
        if self.column == TRAINING_LOSS:
            return "selected on training loss (no validation split)"
        if self.column:
            return f"selected on {self.name}"
        return "not selected on any metric (the runs record no validation or training loss): first setting by label"

    @property
    def arrow(self) -> str:
        return "↓" if self.mode == "min" else "↑"


@dataclass(frozen=True)
class Score:
    """A setting's selection metric over its ok seeds."""

    median: float
    lo: float
    """The smallest seed's value (NaN without one)."""
    hi: float
    """The largest seed's value."""
    n: int
    """Ok seeds with a value."""
    runs: int
    """Runs that count (one per seed: variants.py), whatever their status."""
    failures: Mapping[str, int]
    """Runs that failed the optimizer's way, by status."""

    @property
    def group(self) -> int:
        """0: a score and no optimizer failure; 1: a score and a failure; 2: no score."""
        if self.n == 0:
            return 2
        return 1 if self.failures else 0


def column_values(variant: Variant, column: str) -> np.ndarray:
    """The column over the variant's runs as floats; all NaN when the store has no such column."""
    if column not in variant.latest.frame.columns:
        return np.full(len(variant.rows), np.nan)
    values = variant.values(column)
    return values if values.dtype == float else pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(float)


def _ok_values(variant: Variant, column: str) -> np.ndarray:
    values = column_values(variant, column)[variant.values("status") == "ok"]
    return values[np.isfinite(values)]


def criterion_for(variants: Sequence[Variant], metric_name: str, metric_mode: str) -> Criterion:
    """The selection metric of one optimizer's settings (module docstring)."""
    with_ok = [v for v in variants if (v.values("status") == "ok").any()]
    candidates = (
        Criterion(VALIDATION_METRIC, metric_mode, f"validation {metric_name}"),
        Criterion(VALIDATION_LOSS, "min", "validation loss"),
    )
    for criterion in candidates:
        if with_ok and all(len(_ok_values(v, criterion.column)) for v in with_ok):
            return criterion
    if any(len(_ok_values(v, TRAINING_LOSS)) for v in with_ok):
        return Criterion(TRAINING_LOSS, "min", "training loss")
    return Criterion("", "min", "no selection metric")


def score(variant: Variant, criterion: Criterion) -> Score:
    """The setting's selection metric: median, min and max over its ok seeds."""
    values = _ok_values(variant, criterion.column) if criterion.column else np.array([])
    statuses = variant.values("status").tolist()
    failures = {s: statuses.count(s) for s in OPTIMIZER_FAILURES if s in statuses}
    if not len(values):
        return Score(math.nan, math.nan, math.nan, 0, len(statuses), failures)
    median, lo, hi = float(np.median(values)), float(values.min()), float(values.max())
    return Score(median, lo, hi, len(values), len(statuses), failures)


def order_key(s: Score, criterion: Criterion, label: str) -> tuple[int, float, str]:
    """Sort key: better settings first (module docstring)."""
    if s.n == 0:
        return (2, math.inf, label)
    return (s.group, s.median if criterion.mode == "min" else -s.median, label)


@dataclass(frozen=True, eq=False)
class Selection:
    """One optimizer's settings, their scores and the chosen one."""

    criterion: Criterion
    variants: tuple[Variant, ...]
    scores: tuple[Score, ...]
    chosen: int
    """Index of the chosen setting in `variants`."""

    @property
    def variant(self) -> Variant:
        return self.variants[self.chosen]

    def score_of(self, variant: Variant) -> Score:
        return self.scores[self.variants.index(variant)]


def choose(variants: Sequence[Variant], metric_name: str, metric_mode: str) -> Selection:
    """Score one optimizer's settings and choose one (module docstring); `variants` must not be empty."""
    criterion = criterion_for(variants, metric_name, metric_mode)
    scores = tuple(score(v, criterion) for v in variants)
    chosen = min(range(len(variants)), key=lambda i: order_key(scores[i], criterion, variants[i].label))
    return Selection(criterion, tuple(variants), scores, chosen)
