"""Learning-rate schedules: linear warm-up, then constant, cosine or linear decay to a floor."""

from __future__ import annotations

import math
from typing import Any

import torch


def lr_factor(step: int, total_steps: int, schedule: dict[str, Any]) -> float:
    """Multiplier of the base learning rate for 0-based step `step`."""
    warmup = schedule["warmup_steps"]
    if step < warmup:
        return (step + 1) / warmup
    kind = schedule["kind"]
    if kind == "constant":
        return 1.0
    floor = schedule["min_lr_ratio"]
    progress = (step - warmup) / max(1, total_steps - warmup)
    if kind == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return floor + (1.0 - floor) * max(0.0, 1.0 - progress)


def make_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, schedule: dict[str, Any]
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, schedule))
