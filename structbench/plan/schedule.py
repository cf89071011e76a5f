"""Learning-rate schedules: the multiplier of every parameter group's base learning rate at each 0-based step.

A schedule is a table (the suite's `[schedule]`): `kind`, a linear warm-up of `warmup_steps` steps (or, when that is
0, of `round(warmup_fraction * total_steps)` steps), and the kind's own fields. With T the budget's steps and w the
warm-up length:

- `constant`, `cosine`, `linear`, `step` warm up as (t + 1) / w for t < w (the first step already moves), then
  - `constant`: 1;
  - `cosine`: floor + (1 - floor) (1 + cos(pi p)) / 2 with p = (t - w) / (T - w) (Loshchilov & Hutter's SGDR
    annealing without restarts, ICLR 2017, Eq. 5), floor = `min_lr_ratio`;
  - `linear`: floor + (1 - floor) (1 - p);
  - `step`: gamma^k, k = the number of `milestones` m (fractions of the budget) with t >= round(m T): PyTorch's
    MultiStepLR after the warm-up, as in the 4-bit Shampoo paper's CNN recipe ("multiplied by 0.1 for every 30%
    epochs with a linear warmup at the first 5 epochs", Appendix G); `min_lr_ratio` does not apply.
- `onecycle`: the piecewise-linear one-cycle policy of Smith & Topin ("Super-convergence", 2019) in the two-phase,
  linear-annealing form of Jordan's CIFAR-10 speedruns (airbench's `triangle`): the multiplier interpolates linearly
  through (0, `start_lr_ratio`), (w, 1) and (T, floor), so warm-up starts at `start_lr_ratio` and peaks at step w.

The cosine and linear decays reach the floor at t = T, one step after the last step taken (as PyTorch's
CosineAnnealingLR with T_max = T); onecycle likewise.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from structbench.errors import UsageError

SCHEDULES = ("constant", "cosine", "linear", "onecycle", "step")
SCHEDULE_DEFAULTS: dict[str, Any] = {
    "kind": "constant",
    "warmup_steps": 0,
    "warmup_fraction": 0.0,
    "min_lr_ratio": 0.0,
    "start_lr_ratio": 0.0,
    "milestones": [],
    "gamma": 0.1,
}


def validate_schedule(schedule: dict[str, Any]) -> None:
    """Raise UsageError for a schedule table no run could use."""
    if schedule["kind"] not in SCHEDULES:
        raise UsageError(f"unknown schedule.kind {schedule['kind']!r}; valid: {', '.join(SCHEDULES)}.")
    if schedule["warmup_steps"] < 0 or not 0.0 <= schedule["min_lr_ratio"] <= 1.0:
        raise UsageError("schedule.warmup_steps must be >= 0 and schedule.min_lr_ratio in [0, 1].")
    if not 0.0 <= schedule["warmup_fraction"] < 1.0:
        raise UsageError(f"schedule.warmup_fraction must be in [0, 1), got {schedule['warmup_fraction']}.")
    if schedule["warmup_steps"] > 0 and schedule["warmup_fraction"] > 0:
        raise UsageError("give schedule.warmup_steps or schedule.warmup_fraction, not both.")
    if not 0.0 <= schedule["start_lr_ratio"] <= 1.0 or not schedule["gamma"] > 0:
        raise UsageError("schedule.start_lr_ratio must be in [0, 1] and schedule.gamma > 0.")
    milestones = schedule["milestones"]
    numbers = all(isinstance(m, (int, float)) and not isinstance(m, bool) for m in milestones)
    if not (numbers and all(0 < m < 1 for m in milestones) and list(milestones) == sorted(milestones)):
        raise UsageError(f"schedule.milestones must be increasing fractions of the budget in (0, 1), got {milestones}.")


def warmup_length(total_steps: int, schedule: dict[str, Any]) -> int:
    """Warm-up steps: `warmup_steps`, or `warmup_fraction` of the budget when `warmup_steps` is 0."""
    return schedule["warmup_steps"] or round(schedule["warmup_fraction"] * total_steps)


def lr_factor(step: int, total_steps: int, schedule: dict[str, Any]) -> float:
    """Multiplier of the base learning rate for 0-based step `step` of `total_steps`; see the module docstring.

    Fields missing from `schedule` take their SCHEDULE_DEFAULTS values."""
    schedule = {**SCHEDULE_DEFAULTS, **schedule}
    kind = schedule["kind"]
    warmup = warmup_length(total_steps, schedule)
    floor = schedule["min_lr_ratio"]
    if kind == "onecycle":
        start = schedule["start_lr_ratio"]
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        return 1.0 + (floor - 1.0) * min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    if kind == "step":
        passed = sum(step >= round(m * total_steps) for m in schedule["milestones"])
        return schedule["gamma"] ** passed
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if kind == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * (1.0 - progress)


def make_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, schedule: dict[str, Any]
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, schedule))
