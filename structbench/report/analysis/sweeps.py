"""The Sweeps section: how each optimizer's selection metric moves with the hyperparameters it was run under.

A sweep is an optimizer whose settings in a suite differ only in hyperparameters (spec fields `hparams.*`); the
hyperparameters that differ are its swept keys. For each swept key the section shows the selection metric
(selection.py: validation metric, else validation loss, else training loss; median over the ok seeds, with the
smallest and largest seed's value) against the key's values, with the selected setting marked and the number
of ok seeds at each point. With two or more swept keys, each key is shown with the others held at the selected
setting's values (the settings that share them). The x axis is logarithmic for a learning rate (`lr`,
`learning_rate`, `*_lr`) or whenever every value is positive and the largest is more than `LOG_SPAN` times the
smallest, linear for other numbers, and categorical for values that are not numbers.

Edge of the grid: when the selected value of a swept numeric key is the smallest or the largest value run (with
the other keys as above), the best value may lie outside the grid, and the section says so: "best lr 0.04 is at
the upper edge of the grid [0.01, 0.04]: widen the grid". No warning is given when the selected setting has no
ok run (then nothing was selected on a metric).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from structbench.report.analysis.selection import Criterion, Score, Selection
from structbench.report.analysis.summary import VariantSummary
from structbench.report.analysis.variants import sort_key, varying_keys

LOG_SPAN = 10.0
LR_NAMES = ("lr", "learning_rate")


def short(key: str) -> str:
    return key.removeprefix("hparams.")


def value_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_lr_like(key: str) -> bool:
    """Whether the key names a learning rate: `lr`, `learning_rate`, or a name ending in `_lr` (`fallback_lr`)."""
    name = key.split(".")[-1]
    return name in LR_NAMES or name.endswith(tuple(f"_{n}" for n in LR_NAMES))


def log_scale(key: str, values: Sequence[Any]) -> bool:
    """A log axis: every value a positive number, and a learning rate or a span over LOG_SPAN."""
    if not values or not all(is_number(v) and v > 0 for v in values):
        return False
    return is_lr_like(key) or max(values) / min(values) > LOG_SPAN


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text).strip("-").lower()


@dataclass(frozen=True, eq=False)
class Point:
    """One setting of a sweep, at its value of a key."""

    variant: VariantSummary
    value: Any
    score: Score
    selected: bool


@dataclass(frozen=True, eq=False)
class Axis:
    """The selection metric against one swept key, the other swept keys held at the selected setting's values."""

    key: str
    points: tuple[Point, ...]
    """In value order."""
    fixed: Mapping[str, Any]
    """The other swept keys (short names) and the selected setting's values of them."""
    numeric: bool
    log: bool
    warning: str
    """The edge-of-grid warning, "" when none."""

    @property
    def name(self) -> str:
        return short(self.key)

    @property
    def fixed_text(self) -> str:
        return ", ".join(f"{k}={value_text(v)}" for k, v in self.fixed.items())


@dataclass(frozen=True, eq=False)
class Sweep:
    suite: str
    optim: str
    criterion: Criterion
    keys: tuple[str, ...]
    """The swept keys (full spec names, `hparams.*`), learning rates first."""
    settings: tuple[Point, ...]
    """Every setting, in the suite's order (`value` is None here)."""
    axes: tuple[Axis, ...]

    @property
    def names(self) -> list[str]:
        return [short(k) for k in self.keys]

    @property
    def selected(self) -> Point:
        return next(p for p in self.settings if p.selected)

    @property
    def warnings(self) -> list[str]:
        return [f"{self.optim}: {a.warning}" for a in self.axes if a.warning]

    @property
    def figure_name(self) -> str:
        """The name of the figure that holds the sweep: its suite's sweeps figure, one panel per optimizer and swept
        key (plots.py draws it, the writers place it)."""
        return f"{_slug(self.suite)}-sweeps"

    def setting_text(self, point: Point) -> str:
        """The setting's values of the swept keys: "lr=0.01, weight_decay=0"."""
        config = point.variant.variant.config
        return ", ".join(f"{short(k)}={value_text(config.get(k))}" for k in self.keys)


def swept_keys(variants: Sequence[VariantSummary]) -> list[str] | None:
    """The hyperparameters the settings differ in, learning rates first; None when they differ in anything else
    (budget, schedule, target: not a sweep) or there is one setting."""
    if len(variants) < 2:
        return None
    configs = [dict(v.variant.config) for v in variants]
    differing = varying_keys(configs, {k for c in configs for k in c})
    if not differing or any(not k.startswith("hparams.") for k in differing):
        return None
    return sorted(differing, key=lambda k: (not is_lr_like(k), k))


def _edge_warning(axis_key: str, points: Sequence[Point], fixed: Mapping[str, Any]) -> str:
    values = [p.value for p in points]
    chosen = next((p for p in points if p.selected), None)
    if chosen is None or chosen.score.n == 0 or len(values) < 2 or not all(is_number(v) for v in values):
        return ""
    low, high = min(values), max(values)
    if chosen.value not in (low, high):
        return ""
    edge = "upper" if chosen.value == high else "lower"
    text = (
        f"best {short(axis_key)} {value_text(chosen.value)} is at the {edge} edge of the grid "
        f"[{value_text(low)}, {value_text(high)}]: widen the grid"
    )
    if fixed:
        text += " (with " + ", ".join(f"{k}={value_text(v)}" for k, v in fixed.items()) + ")"
    return text


def _axis(key: str, keys: Sequence[str], settings: Sequence[Point], chosen: Point) -> Axis:
    config = chosen.variant.variant.config
    others = [k for k in keys if k != key]
    members = [p for p in settings if all(_same(p.variant.variant.config.get(k), config.get(k)) for k in others)]
    points = sorted(
        (Point(p.variant, p.variant.variant.config.get(key), p.score, p.selected) for p in members),
        key=lambda p: sort_key(p.value),
    )
    values = [p.value for p in points]
    fixed = {short(k): config.get(k) for k in others}
    return Axis(
        key=key,
        points=tuple(points),
        fixed=fixed,
        numeric=all(is_number(v) for v in values),
        log=log_scale(key, values),
        warning=_edge_warning(key, points, fixed),
    )


def sweeps_of(by_optim: Mapping[str, Sequence[VariantSummary]], selections: Mapping[str, Selection]) -> list[Sweep]:
    """The suite's sweeps, by optimizer name."""
    sweeps = []
    for optim in sorted(by_optim):
        variants = by_optim[optim]
        keys = swept_keys(variants)
        if keys is None:
            continue
        selection = selections[optim]
        settings = tuple(
            Point(v, None, selection.score_of(v.variant), v.variant is selection.variant) for v in variants
        )
        chosen = next(p for p in settings if p.selected)
        axes = tuple(_axis(key, keys, settings, chosen) for key in keys)
        sweeps.append(Sweep(variants[0].variant.suite, optim, selection.criterion, tuple(keys), settings, axes))
    return sweeps
