"""Notes on how a suite's runs were measured: an evaluation subset, no warm-up, contention for the CPU, step-time
outliers.

- Evaluation subset: a run whose `task_args.eval_examples` is positive was evaluated on a fixed subset of its test
  and validation splits (its spec's `task_args_resolved` says how many examples each had), not on the whole splits.
- No warm-up: a run whose spec's `budget.warmup_steps` is 0 (a `run --steps N` smoke check drops it: plan/spec.py)
  timed its first steps, whose setup (optimizer state built, first kernels) the warm-up otherwise keeps off the
  clock, in its wall-clock, step times and time to target.
- Contention: a run whose machine's 1-minute load average, at its start or its end (`load_avg_start`,
  `load_avg_end`), exceeded the cores it could use (`cpu_usable`) shared the CPU with other work, so its step times
  are inflated by an unknown amount (environment.contended).
- Step-time outliers: within one setting, a seed whose median step time is more than OUTLIER_FACTOR times the
  fastest seed's. Seeds of one setting do the same work per step, so such a gap says the machine, not the optimizer,
  changed; other work on the machine only ever slows a run down, so the fastest seed is the reference.

Stores written before these columns existed have none of them: their runs get no note.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from structbench.environment import contended
from structbench.report.analysis.summary import VariantSummary

OUTLIER_FACTOR = 2.0


def measurement_notes(variants: Sequence[VariantSummary]) -> list[str]:
    """The suite's notes on evaluation subsets, contended runs and step-time outliers (module docstring)."""
    notes = [_subset_note(variants), _warmup_note(variants), _contention_note(variants), _outlier_note(variants)]
    return [note for note in notes if note]


def _column(summary: VariantSummary, column: str) -> list[object]:
    """The column over the variant's runs that count; all None when the store predates the column."""
    if column not in summary.variant.latest.frame.columns:
        return [None] * len(summary.variant.run_ids)
    return summary.variant.values(column).tolist()


def _spec(spec_text: object) -> dict:
    """A run's stored spec, {} when it is not a JSON object."""
    try:
        spec = json.loads(str(spec_text))
    except ValueError:
        return {}
    return spec if isinstance(spec, dict) else {}


def _eval_sizes(spec_text: object) -> tuple[int, int] | None:
    """(test, validation) examples each evaluation read when the run's spec sets an evaluation subset, else None."""
    spec = _spec(spec_text)
    if not spec or int((spec.get("task_args") or {}).get("eval_examples") or 0) <= 0:
        return None
    resolved = spec.get("task_args_resolved") or {}
    count = int(spec["task_args"]["eval_examples"])
    return int(resolved.get("eval_test_size", count)), int(resolved.get("eval_val_size", 0))


def _subset_note(variants: Sequence[VariantSummary]) -> str:
    subsets = {}
    for summary in variants:
        sizes = {_eval_sizes(spec) for spec in _column(summary, "spec")} - {None}
        if sizes:
            subsets[summary.label] = ", ".join(f"{test} test and {val} validation" for test, val in sorted(sizes))
    if not subsets:
        return ""
    listed = "; ".join(f"{label} ({sizes} examples)" for label, sizes in subsets.items())
    return (
        f"evaluation subset (task_args.eval_examples): {listed}; their losses and metrics come from a fixed subset "
        "of the splits, not the whole splits."
    )


def _without_warmup(spec_text: object) -> bool:
    """Whether the run's spec sets budget.warmup_steps to 0 (a spec from before warm-up existed has no such key)."""
    budget = _spec(spec_text).get("budget") or {}
    return isinstance(budget, dict) and budget.get("warmup_steps") == 0


def _warmup_note(variants: Sequence[VariantSummary]) -> str:
    marked = [s.label for s in variants if any(_without_warmup(spec) for spec in _column(s, "spec"))]
    if not marked:
        return ""
    return (
        f"without warm-up (budget.warmup_steps 0): {'; '.join(marked)}: their wall-clock, step times and time to "
        "target include the first steps' setup (optimizer state built, first kernels)."
    )


def _is_contended(start: object, end: object, cores: object) -> bool:
    if not isinstance(cores, int | float) or math.isnan(cores):
        return False
    loads = [float(x) for x in (start, end) if isinstance(x, int | float) and not math.isnan(x)]
    return any(contended(load, int(cores)) for load in loads)


def _contention_note(variants: Sequence[VariantSummary]) -> str:
    marked = []
    for summary in variants:
        columns = zip(
            _column(summary, "seed"),
            _column(summary, "load_avg_start"),
            _column(summary, "load_avg_end"),
            _column(summary, "cpu_usable"),
            strict=True,
        )
        seeds = [int(seed) for seed, start, end, cores in columns if _is_contended(start, end, cores)]
        if seeds:
            marked.append(f"{summary.label} (seed {', '.join(map(str, seeds))})")
    if not marked:
        return ""
    return (
        f"measured under contention: {'; '.join(marked)}: the 1-minute load average at the run's start or end "
        "exceeded its usable cores, so its step times include waiting for the CPU."
    )


def _outlier_seeds(seeds: Sequence[int], times: Sequence[float]) -> list[int]:
    """The seeds whose median step time is more than OUTLIER_FACTOR times the fastest seed's (module docstring)."""
    known = [(seed, t) for seed, t in zip(seeds, times, strict=True) if t > 0 and math.isfinite(t)]
    if len(known) < 2:
        return []
    fastest = min(t for _, t in known)
    return [seed for seed, t in known if t > OUTLIER_FACTOR * fastest]


def _outlier_note(variants: Sequence[VariantSummary]) -> str:
    flagged = []
    for summary in variants:
        seeds = [int(seed) for seed in _column(summary, "seed")]
        times = [float("nan") if t is None else float(t) for t in _column(summary, "step_time_median_s")]
        outliers = _outlier_seeds(seeds, times)
        if outliers:
            flagged.append(f"{summary.label} (seed {', '.join(map(str, outliers))})")
    if not flagged:
        return ""
    return (
        f"step-time outliers: {'; '.join(flagged)}: a median step time more than {OUTLIER_FACTOR:g}x the fastest "
        "seed's of its setting; the machine's load, not the optimizer, likely differed."
    )
