"""Each variant's target: a fixed value, or a baseline's final value (`target.from_baseline`, RACS/Alice's definition).

RACS/Alice (arXiv 2502.07752, Sec. 7.1, Table 2's caption): the target is Adam's final eval perplexity under the
same budget; the speed-up is
Adam's total steps over the candidate's steps to first reach it; the effective throughput is the tokens the Adam run
consumed over the wall time the candidate needs to reach it. Here, for the variants of one suite that share a setup
(every stored spec field but the hyperparameters: same task, budget, schedule and target) and name baseline B:

- B's variant with that setup is the reference (with several, a sweep: among those with an ok run, the one
  selection.py chooses — on a validation metric, else the training loss, never on the evaluation T comes from);
  its runs that ended ok with a finite final value count;
- T = the median over those runs of their final evaluation of the target's metric on the validation split
  (`final_val_metric`, or `final_val_loss` for "loss") where every one of them records it, else on the evaluation
  split (`final_eval_metric`, `final_eval_loss`: runs without a validation split). Time to T is then measured on
  the same split (summary.py), so the test split neither sets the target nor times it;
- B's budget: the medians over the same runs of `steps` (the step of the last evaluation), of `wall_s` (training
  seconds, evaluation excluded, at that evaluation) and, where the runs record a throughput, of the items trained
  on. A run records its throughput over the steps after the first (the first one compiles / warms up, and its
  time is `compile_s`), and every step trains on the same number of items, so the items of a run of n steps are
  throughput_per_s x (wall_s - compile_s) x n / (n - 1) — an estimate, high by the loop's time outside the
  timed steps times the rate;
- speed-up in steps (time) of a variant: B's steps (seconds) over the variant's median steps (seconds) to T;
  effective throughput: B's items over the variant's median seconds to T.

Without an ok run of B the target is unavailable (NaN), and so is every time to it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from structbench.report.analysis.selection import choose, column_values
from structbench.report.analysis.targets import Reference, Target
from structbench.report.analysis.variants import Variant


def setup_key(config: Mapping[str, Any]) -> str:
    """A variant's stored spec without its hyperparameters: runs with equal keys share task, budget and target."""
    return json.dumps({k: v for k, v in config.items() if not k.startswith("hparams.")}, sort_keys=True, default=str)


def final_column(variant: Variant, metric: str) -> str:
    """The column the variant's final value of `metric` is read from (module docstring): the validation split's
    when every ok run records it, else the evaluation split's."""
    ok = variant.values("status") == "ok"
    validation = "final_val_loss" if metric == "loss" else "final_val_metric"
    if ok.any() and np.isfinite(column_values(variant, validation)[ok]).all():
        return validation
    return "final_eval_loss" if metric == "loss" else "final_eval_metric"


def _ok_finals(variant: Variant, metric: str) -> np.ndarray:
    """Mask over the variant's runs: ended ok with a finite final value of `metric`."""
    finals = column_values(variant, final_column(variant, metric))
    return (variant.values("status") == "ok") & np.isfinite(finals)


def _median_final(variant: Variant, metric: str) -> float:
    counted = _ok_finals(variant, metric)
    finals = column_values(variant, final_column(variant, metric))[counted]
    return float(np.median(finals)) if len(finals) else math.nan


def _nan_median(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(np.median(finite)) if len(finite) else math.nan


def _reference_variant(candidates: Sequence[Variant], metric: str, metric_mode: str) -> Variant | None:
    """The baseline's setting that selection.py chooses among those with an ok final value; None without one."""
    usable = [v for v in candidates if _ok_finals(v, metric).any()]
    if not usable:
        return None
    names = [n for v in usable for n in v.values("eval_metric_name") if isinstance(n, str)]
    return choose(usable, names[0] if names else "metric", metric_mode).variant


def _derive(candidates: Sequence[Variant], optim: str, metric: str, mode: str, metric_mode: str) -> Target:
    variant = _reference_variant(candidates, metric, metric_mode)
    if variant is None:
        return Target(metric, math.nan, mode, Reference(optim, "", 0, "-", math.nan, math.nan, math.nan, ""))
    counted = _ok_finals(variant, metric)
    wall, steps = variant.values("wall_s")[counted], variant.values("steps")[counted].astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        timed_fraction = np.where(steps > 1, (steps - 1) / steps, np.nan)
        items = variant.values("throughput_per_s")[counted] * (wall - variant.values("compile_s")[counted])
    reference = Reference(
        optim=optim,
        label=variant.label,
        seeds=int(counted.sum()),
        split="validation" if final_column(variant, metric).startswith("final_val") else "test",
        steps=_nan_median(steps),
        seconds=_nan_median(wall),
        items=_nan_median(items / timed_fraction),
        rate_unit=next((u for u in variant.values("throughput_unit")[counted] if isinstance(u, str)), ""),
    )
    return Target(metric, _median_final(variant, metric), mode, reference)


def targets_of(variants: Sequence[Variant], metric_mode: str) -> list[Target | None]:
    """Each variant's target: fixed, derived from its baseline (module docstring), or None without one."""
    derived: dict[tuple[str, str], Target] = {}
    targets: list[Target | None] = []
    for variant in variants:
        metric, baseline = variant.config.get("target.metric"), variant.config.get("target.from_baseline")
        if not (metric and baseline):
            targets.append(fixed_target(variant.config, metric_mode))
            continue
        key = (setup_key(variant.config), variant.store)
        if key not in derived:
            same_setup = [
                v
                for v in variants
                if v.optim_name == baseline and v.store == variant.store and setup_key(v.config) == key[0]
            ]
            mode = "min" if metric == "loss" else metric_mode
            derived[key] = _derive(same_setup, str(baseline), str(metric), mode, metric_mode)
        targets.append(derived[key])
    return targets


def fixed_target(config: Mapping[str, Any], metric_mode: str) -> Target | None:
    """The target of a suite's fixed `target.value`; None without a metric or a value."""
    metric, value = config.get("target.metric"), config.get("target.value")
    if not metric or value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return Target(str(metric), float(value), "min" if metric == "loss" else metric_mode)
