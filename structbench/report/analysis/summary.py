"""Per-variant summary of one suite: outcomes, quality, time to target, cost — read from run rows and curves.

Splits: the final loss and metric are summarised on the test split (`final_eval_*`: the run's evaluation, the
exact objective on a quadratic) and, where the runs hold one out, on the validation split (`final_val_*`). Time to
target is measured on each run's validation curve (curve points of split "val") where it has one, else on its
evaluation curve (split "eval"); `timing_split` says which.

Which runs feed which number:
- final losses / metrics, step time, optimizer share, compile time, peak memory, state bytes: the runs
  that ended `ok` (one run counts per seed: variants.py);
- steps / seconds to target: every run that produced a result (`ok`, `diverged`, `oom`, `solver_error`);
  one that never crossed the target counts as not reached (+inf), so a diverged seed weighs against its
  optimizer instead of vanishing. `error` and `interrupted` runs are shown in the counts and the failure
  list only: they say nothing about the optimizer. A run without an evaluation curve falls back on the
  runner's stored first evaluation at the target; for a target from a baseline (`baseline_target`) the
  runner stored none, so such a run's time to target is unknown and left out.

Budget warnings: an ok run with fewer than FEW_EVALUATIONS evaluations on its timing split (`few_evaluations`), and
a crossing interpolated over one interval longer than a quarter of the run (targets.WIDE_SPAN: `wide_crossings`),
are flagged beside the numbers they affect.
"""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from structbench.report.analysis.curve_index import CurveIndex
from structbench.report.analysis.provenance import source_of
from structbench.report.analysis.selection import column_values
from structbench.report.analysis.stats import EMPTY, Estimate, median_ci, sorted_median
from structbench.report.analysis.targets import Crossing, Target, interpolate
from structbench.report.analysis.variants import Variant
from structbench.store.write import STATUSES

RESULT_STATUSES = ("ok", "diverged", "oom", "solver_error")
FEW_EVALUATIONS = 3
"""An ok run evaluated fewer times than this (the one before training and the final one included) is flagged."""


@dataclass(frozen=True)
class Evaluations:
    """Each run's evaluation curves by split: the validation split's ("val") and the test split's ("eval")."""

    val: CurveIndex
    test: CurveIndex

    def timing(self, run_id: str) -> tuple[CurveIndex, str] | None:
        """The curve a run's time to target is measured on and its split's name; None without one."""
        if run_id in self.val:
            return self.val, "validation"
        if run_id in self.test:
            return self.test, "test"
        return None


@dataclass(frozen=True, eq=False)
class VariantSummary:
    variant: Variant
    statuses: Mapping[str, int]
    target: Target | None
    final_loss: Estimate
    """On the test split (module docstring)."""
    final_metric: Estimate
    final_val_loss: Estimate
    """On the validation split; EMPTY without one."""
    final_val_metric: Estimate
    final_train_loss: Estimate
    """The training loss of the last step (one minibatch's), over the ok runs."""
    steps_to_target: Estimate
    seconds_to_target: Estimate
    crossings: Mapping[int, Crossing]
    """Per seed, for the runs that count towards time to target."""
    final_metric_by_seed: Mapping[int, float]
    reached: int
    step_time_s: float
    optim_share: float
    compile_s: float
    peak_mem_bytes: float
    mem_source: str
    state_bytes: float
    analytic_state_bytes: float
    """NaN when the store has no analytic figure for this variant."""
    throughput_per_s: float
    """Median items (tokens, images) per second of training; NaN when the task reports none."""
    throughput_unit: str
    routing: str
    routing_detail: str
    stored_target_used: int
    """Runs without an evaluation curve, whose stored first-evaluation time stands in for the interpolation."""
    evaluations: Mapping[int, int]
    """Per seed of an ok run with a curve: its evaluations on its timing split."""
    timing_split: str
    """Where time to target is measured: "validation", "test", "validation and test" (runs differ), "" (no curves)."""
    hparams_source: str
    """provenance.source_of the variant."""

    @property
    def label(self) -> str:
        return self.variant.label

    @property
    def optim(self) -> str:
        return self.variant.optim

    @property
    def has_ok(self) -> bool:
        return self.statuses.get("ok", 0) > 0

    @property
    def few_evaluations(self) -> dict[int, int]:
        """Seeds of ok runs evaluated fewer than FEW_EVALUATIONS times, with their counts."""
        return {s: n for s, n in self.evaluations.items() if n < FEW_EVALUATIONS}

    @property
    def wide_crossings(self) -> dict[int, Crossing]:
        """Seeds whose crossing was interpolated over more than a quarter of the run (targets.WIDE_SPAN)."""
        return {s: c for s, c in self.crossings.items() if c.wide}

    @property
    def validated(self) -> bool:
        return self.final_val_metric.n > 0 or self.final_val_loss.n > 0


def _median(values: np.ndarray) -> float:
    return sorted_median(np.sort(values[~np.isnan(values)]))


@functools.lru_cache(maxsize=1024)
def routing_summary(routing_json: str | None) -> tuple[str, str]:
    """("3 structured · 2 fallback (adamw)", the parameter names) from a run's routing record."""
    try:
        record = json.loads(routing_json) if routing_json else None
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        return "-", ""
    structured, fallback = record.get("structured") or [], record.get("fallback") or []
    text = f"{len(structured)} structured"
    if fallback:
        text += f" · {len(fallback)} fallback"
        if record.get("fallback_optimizer"):
            text += f" ({record['fallback_optimizer']})"
    detail = f"structured: {', '.join(structured) or '-'}; fallback: {', '.join(fallback) or '-'}"
    return text, detail


def _interpolated(evals: Evaluations, run_id: str, target: Target) -> Crossing | None:
    """The run's crossing interpolated on its timing split, or None when it has no evaluation points."""
    timing = evals.timing(run_id)
    if timing is None:
        return None
    curve, _ = timing
    values = curve.get(run_id, "loss" if target.metric == "loss" else "metric")
    return interpolate(curve.get(run_id, "step"), curve.get(run_id, "wall_s"), values, target)


def _evaluation_counts(variant: Variant, evals: Evaluations) -> tuple[dict[int, int], str]:
    """Per seed of an ok run with a curve, its finite evaluations on its timing split; and the splits used."""
    counts: dict[int, int] = {}
    splits: set[str] = set()
    for run_id, seed, status in zip(*(variant.values(c) for c in ("run_id", "seed", "status")), strict=True):
        timing = evals.timing(run_id)
        if timing is None:
            continue
        curve, split = timing
        splits.add(split)
        if status == "ok":
            counts[int(seed)] = int(np.isfinite(curve.get(run_id, "loss")).sum())
    return counts, " and ".join(sorted(splits, reverse=True))


def _crossings(variant: Variant, evals: Evaluations, target: Target) -> tuple[dict[int, Crossing], int]:
    """Per seed, the crossing of each run with a result; and how many used the runner's stored values."""
    crossings: dict[int, Crossing] = {}
    stored = 0
    columns = ("run_id", "seed", "status", "eval_metric_name", "target_step", "target_s")
    for run_id, seed, status, metric_name, step, seconds in zip(*(variant.values(c) for c in columns), strict=True):
        if status not in RESULT_STATUSES:
            continue
        if target.metric not in ("loss", metric_name):
            crossings[int(seed)] = Crossing(math.nan, math.nan)
            continue
        crossing = _interpolated(evals, run_id, target)
        if crossing is None and target.reference is not None:
            crossing = Crossing(math.nan, math.nan)
        elif crossing is None:
            stored += 1
            reached = not (pd.isna(step) or pd.isna(seconds))
            crossing = Crossing(float(step), float(seconds)) if reached else Crossing(math.inf, math.inf)
        crossings[int(seed)] = crossing
    return crossings, stored


def _ok_estimate(variant: Variant, column: str, ok: np.ndarray) -> Estimate:
    """Median and interval of a column over the ok runs (NaN when the store lacks the column)."""
    return median_ci(column_values(variant, column)[ok])


def summarize_variant(variant: Variant, evals: Evaluations, target: Target | None) -> VariantSummary:
    """Summary of one variant (module docstring says which runs feed which number)."""
    status = variant.values("status")
    ok = status == "ok"
    counts = Counter(status.tolist())
    timed = target is not None and target.available
    crossings, stored = _crossings(variant, evals, target) if timed else ({}, 0)
    metric = variant.values("final_eval_metric")
    seeds = variant.values("seed")
    metric_by_seed = {
        int(s): float(v) for s, v, good in zip(seeds, metric, ok, strict=True) if good and not math.isnan(v)
    }
    step_time = variant.values("step_time_median_s")[ok]
    routings = variant.values("routing")
    routing = [r for r in [*routings[ok], *routings] if isinstance(r, str)]
    routing_text, routing_detail = routing_summary(routing[0] if routing else None)
    evaluations, timing_split = _evaluation_counts(variant, evals)
    return VariantSummary(
        variant=variant,
        statuses={s: int(counts.get(s, 0)) for s in STATUSES},
        target=target,
        final_loss=median_ci(variant.values("final_eval_loss")[ok]),
        final_metric=median_ci(metric_by_seed.values()),
        final_val_loss=_ok_estimate(variant, "final_val_loss", ok),
        final_val_metric=_ok_estimate(variant, "final_val_metric", ok),
        final_train_loss=_ok_estimate(variant, "final_train_loss", ok),
        steps_to_target=median_ci(c.steps for c in crossings.values()) if timed else EMPTY,
        seconds_to_target=median_ci(c.seconds for c in crossings.values()) if timed else EMPTY,
        crossings=crossings,
        final_metric_by_seed=metric_by_seed,
        reached=sum(c.reached for c in crossings.values()),
        step_time_s=_median(step_time),
        optim_share=_median(variant.values("optim_time_median_s")[ok] / step_time),
        compile_s=_median(variant.values("compile_s")[ok]),
        peak_mem_bytes=_median(variant.values("peak_mem_bytes")[ok]),
        mem_source=", ".join(sorted({m for m in variant.values("peak_mem_source") if isinstance(m, str)})) or "-",
        state_bytes=_median(variant.values("state_bytes")[ok]),
        analytic_state_bytes=_median(variant.values("analytic_state_bytes")[ok]),
        throughput_per_s=_median(variant.values("throughput_per_s")[ok]),
        throughput_unit=next((u for u in variant.values("throughput_unit") if isinstance(u, str)), ""),
        routing=routing_text,
        routing_detail=routing_detail,
        stored_target_used=stored,
        evaluations=evaluations,
        timing_split=timing_split,
        hparams_source=source_of(variant),
    )
