"""Steps and seconds to target, interpolated on a run's evaluation curve.

The runner records `target_step` / `target_s` as the first evaluation at or past the target; evaluations
are sparse, so that over-states the time by up to one evaluation interval. The report instead
interpolates:

    Let the run's evaluations be (s_0, w_0, v_0), ..., (s_k, w_k, v_k) in step order — step s, cumulative
    training seconds w (evaluation excluded; w_0 = 0 at s_0 = 0, the evaluation before training) and the
    target quantity v (the eval metric, or the eval loss when the target's metric is "loss"); points whose
    v is not finite are skipped. "Reached" means v <= T for a quantity that is minimised and v >= T for one
    that is maximised. Let i be the first index with v_i reached:

    - no such i: not reached (+inf steps and seconds);
    - i = 0: reached at the first evaluation (s_0, w_0: 0 steps and 0 s when it is the one before training);
    - otherwise f = (v_{i-1} - T) / (v_{i-1} - v_i), which lies in (0, 1], and
      steps to target = s_{i-1} + f (s_i - s_{i-1}),  seconds to target = w_{i-1} + f (w_i - w_{i-1}).

Linear in v between the two evaluations that bracket the crossing: the estimate assumes the quantity moves
linearly between them. So the crossing records how much of the run that assumption covers, its span
(s_i - s_{i-1}) / s_k (s_k: the run's last evaluation); a span over WIDE_SPAN (a quarter of the run) is flagged in the
report. The evaluations are the validation split's where the run records one (build.py), else the run's evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

NOT_REACHED = math.inf
WIDE_SPAN = 0.25
"""A crossing interpolated over one interval longer than this fraction of the run is flagged."""


@dataclass(frozen=True)
class Reference:
    """The baseline a target was derived from and what it spent over its whole run: medians over its ok seeds."""

    optim: str
    label: str
    """The baseline variant's label (the one chosen among its settings)."""
    seeds: int
    split: str
    """Which final evaluation the target is: "validation" or "test" (runs without a validation split)."""
    steps: float
    """The step of its last evaluation."""
    seconds: float
    """Its training seconds (evaluation excluded) at that evaluation."""
    items: float
    """Items (tokens, images) it trained on, estimated from its throughput (baseline_target); NaN without one."""
    rate_unit: str
    """The throughput's unit, e.g. "tokens/s"."""

    def describe(self) -> str:
        return f"{self.optim}'s final {self.split} value, median of {self.seeds} seed{'' if self.seeds == 1 else 's'}"

    def effective_throughput(self, seconds_to_target: float) -> float:
        """The baseline's items over the seconds another run needs to reach the target (RACS/Alice Table 2)."""
        return self.items / seconds_to_target


@dataclass(frozen=True)
class Target:
    metric: str
    value: float
    mode: str
    reference: Reference | None = None
    """The baseline whose final value the target is (a suite's `target.from_baseline`); None for a fixed value."""

    @property
    def available(self) -> bool:
        """False for a target from a baseline without an ok run: it has no value."""
        return not math.isnan(self.value)

    def describe(self) -> str:
        sign = "<=" if self.mode == "min" else ">="
        threshold = f"{self.metric} {sign} {self.value:g}"
        if self.reference is None:
            return threshold
        if not self.available:
            return f"{self.metric}: unavailable: no ok {self.reference.optim} runs"
        return f"{threshold} ({self.reference.describe()})"


@dataclass(frozen=True)
class Crossing:
    steps: float
    seconds: float
    interval: tuple[float, float] | None = None
    """The steps of the two evaluations it was interpolated between; None when not interpolated."""
    span: float = math.nan
    """That interval as a fraction of the run (module docstring); NaN when not interpolated."""

    @property
    def reached(self) -> bool:
        return math.isfinite(self.steps)

    @property
    def wide(self) -> bool:
        return self.span > WIDE_SPAN


NEVER = Crossing(NOT_REACHED, NOT_REACHED)


def interpolate(steps: np.ndarray, seconds: np.ndarray, values: np.ndarray, target: Target) -> Crossing:
    """Steps and seconds to `target` on one run's evaluation curve (module docstring); arrays in step order."""
    finite = np.isfinite(values)
    steps, seconds, values = steps[finite], seconds[finite], values[finite]
    hit = values <= target.value if target.mode == "min" else values >= target.value
    if not hit.any():
        return NEVER
    i = int(np.argmax(hit))
    if i == 0:
        return Crossing(float(steps[0]), float(seconds[0]))
    before, after = float(values[i - 1]), float(values[i])
    f = (before - target.value) / (before - after)
    run = float(steps[-1])
    return Crossing(
        float(steps[i - 1] + f * (steps[i] - steps[i - 1])),
        float(seconds[i - 1] + f * (seconds[i] - seconds[i - 1])),
        (float(steps[i - 1]), float(steps[i])),
        float(steps[i] - steps[i - 1]) / run if run > 0 else math.nan,
    )
