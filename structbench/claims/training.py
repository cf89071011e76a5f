"""Training comparisons behind the claims: each optimizer's learning rate chosen on a small grid, then its runs
on the evaluation seeds.

Tuning: every learning rate of an optimizer's grid trains on the tuning seeds; the one with the best median of the
selection value wins. The selection value is the validation split's metric (vision, language) where the task holds
one out, never the test split; a quadratic has no split (its evaluation is the exact objective f(W) - f*), so its
tuning runs use seeds disjoint from the evaluation seeds (other noise, other W_0). A grid of one value is no tuning:
the outcome then says the learning rate is the suite's (or the registry's) and untuned here.

Runs go through `structbench.execution.runner.execute`, the same code as `structbench run`; they are not stored as runs
(the claims table holds what the verdict needs). Identical runs requested by several claims in one process run once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from structbench.execution.runner import execute
from structbench.plan.spec import SuiteSpec, load_suites

Row = dict[str, Any]
CURVES = "curves"
"""The key under which a kept run row also holds its logged points (runner.execute's curves)."""
_CACHE: dict[tuple[Any, ...], Row] = {}


@dataclass(frozen=True)
class Comparison:
    suite: str
    optims: tuple[str, ...]
    eval_seeds: tuple[int, ...]
    tuning_seeds: tuple[int, ...] = ()
    lr_grid: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Learning rates tried per optimizer; an optimizer not named keeps the suite's (or the registry's) lr."""
    overrides: tuple[str, ...] = ()
    """`--set` assignments applied to the suite (budget, task arguments, hyperparameters); one on
    `hparams.<name>.` applies to the runs of that optimizer only."""
    lower_is_better: bool = True
    select: str = "val_metric"
    """The run-row field the tuning minimises or maximises: "val_metric", "val_loss" or "eval_loss"."""


@dataclass(frozen=True)
class Result:
    rows: dict[str, dict[int, Row]]
    """optimizer -> seed -> run row (evaluation seeds, chosen learning rate)."""
    chosen_lr: dict[str, float | None]
    tuning: dict[str, dict[float, float]]
    """optimizer -> lr -> median selection value on the tuning seeds."""
    budget: str
    spec: SuiteSpec

    def values(self, optim_name: str, column: str) -> dict[int, float]:
        return {seed: _number(row.get(column)) for seed, row in self.rows[optim_name].items()}

    def failures(self) -> list[str]:
        return [
            f"{o} seed {s}: {row['status']}"
            for o, by_seed in self.rows.items()
            for s, row in by_seed.items()
            if row["status"] != "ok"
        ]

    def tuning_text(self) -> str:
        parts = []
        for optim_name, lr in self.chosen_lr.items():
            tried = self.tuning.get(optim_name, {})
            if len(tried) > 1:
                grid = ", ".join(f"{v:g}" for v in tried)
                edge = " (at the grid's edge)" if lr in (min(tried), max(tried)) else ""
                parts.append(f"{optim_name} lr {lr:g} from {{{grid}}}{edge}")
            else:
                parts.append(f"{optim_name} lr {lr if lr is None else format(lr, 'g')} (untuned here)")
        return "; ".join(parts)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def budget_text(spec: SuiteSpec) -> str:
    budget = spec.budget
    length = f"{budget['epochs']} epochs" if budget.get("epochs") else f"{budget['steps']} steps"
    return f"suite {spec.name}: {length}, batch {budget['batch_size']}"


def run_comparison(
    comparison: Comparison,
    device: torch.device,
    data_root: Path,
    progress: Callable[[str], None] | None = None,
) -> Result:
    chosen: dict[str, float | None] = {}
    tuning: dict[str, dict[float, float]] = {}
    rows: dict[str, dict[int, Row]] = {}
    spec = _spec(comparison, comparison.optims[0], None)
    for optim_name in comparison.optims:
        grid = comparison.lr_grid.get(optim_name, ())
        if len(grid) > 1:
            tuning[optim_name] = {
                lr: _selection(comparison, optim_name, lr, device, data_root, progress) for lr in grid
            }
            pick = min if comparison.lower_is_better else max
            finite = {lr: v for lr, v in tuning[optim_name].items() if math.isfinite(v)}
            chosen[optim_name] = pick(finite, key=finite.__getitem__) if finite else grid[0]
        elif grid:
            chosen[optim_name] = grid[0]
        else:
            chosen[optim_name] = _spec(comparison, optim_name, None).hparams[optim_name].get("lr")
        rows[optim_name] = {
            seed: _run(comparison, optim_name, chosen[optim_name] if grid else None, seed, device, data_root, progress)
            for seed in comparison.eval_seeds
        }
    return Result(rows, chosen, tuning, budget_text(spec), spec)


def _selection(
    comparison: Comparison,
    optim_name: str,
    lr: float,
    device: torch.device,
    data_root: Path,
    progress: Callable[[str], None] | None,
) -> float:
    values = []
    for seed in comparison.tuning_seeds:
        row = _run(comparison, optim_name, lr, seed, device, data_root, progress)
        value = _number(row.get(f"final_{comparison.select}")) if row["status"] == "ok" else math.nan
        values.append(value if math.isfinite(value) else math.nan)
    finite = sorted(v for v in values if not math.isnan(v))
    if len(finite) < len(values) or not finite:
        return math.nan
    middle = len(finite) // 2
    return finite[middle] if len(finite) % 2 else (finite[middle - 1] + finite[middle]) / 2


def _spec(comparison: Comparison, optim_name: str, lr: float | None) -> SuiteSpec:
    overrides = [
        o for o in comparison.overrides if not o.startswith("hparams.") or o.startswith(f"hparams.{optim_name}.")
    ]
    if lr is not None:
        overrides.append(f"hparams.{optim_name}.lr={lr!r}")
    specs, _ = load_suites(comparison.suite, overrides, optims=[optim_name], seeds=[0])
    return specs[0]


def _run(
    comparison: Comparison,
    optim_name: str,
    lr: float | None,
    seed: int,
    device: torch.device,
    data_root: Path,
    progress: Callable[[str], None] | None,
) -> Row:
    key = (comparison.suite, comparison.overrides, optim_name, lr, seed, str(device))
    if key not in _CACHE:
        if progress is not None:
            progress(f"{comparison.suite}: {optim_name}" + (f" lr={lr:g}" if lr is not None else "") + f" seed {seed}")
        outcome = execute(_spec(comparison, optim_name, lr), optim_name, seed, device, data_root)
        _CACHE[key] = {**outcome.row, CURVES: outcome.curves}
    return _CACHE[key]


def steps_to_reach(row: Row, target: float, split: str = "val") -> float:
    """The first evaluated step whose `split` metric is at or below `target` (a metric to minimise); inf if none."""
    for point in sorted(row[CURVES], key=lambda p: p["step"]):
        if point["split"] == split and point["metric"] is not None and point["metric"] <= target:
            return float(point["step"])
    return math.inf


def forget_runs() -> None:
    """Drop the runs kept for reuse (a test that changes an optimizer must not see runs of the unchanged one)."""
    _CACHE.clear()


def seeds_of(result: Result) -> list[int]:
    return sorted(next(iter(result.rows.values())))


def all_ok(result: Result, optims: Sequence[str]) -> bool:
    return all(row["status"] == "ok" for o in optims for row in result.rows[o].values())
