"""Log points that do not stall the device (structbench.execution.loop): a log window that no evaluation,
checkpoint, time limit or end of run follows is copied to the host without blocking and read when the next window
closes.

The facts checked: the values a run logs that way (losses, learning rates, gradient norms, step counts) are exactly
those of the same run with every window read at once (an evaluation after every step forces that, and evaluating
changes nothing the training computes); no log point but the last reads at once; a divergence inside a deferred
window ends the run at the step it happened; an interrupt records the window still on its way; curve times never go
backwards, and each point of a deferred window has the time its own window ended.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from structbench.execution import loop
from structbench.execution.runner import execute
from structbench.plan import spec as spec_module
from structbench.tasks.base import EvalResult, TaskContext
from tests.support.tasks import SeededBatches, register_task

STEPS = 12


class Regression(SeededBatches):
    """Least squares on a small MLP, batches from its own seeded generator; `poison_at` makes that step's loss NaN,
    `interrupt_at` raises KeyboardInterrupt at that step (both 0-based step indices, None: never)."""

    metric_name = "loss"
    metric_mode = "min"
    data_source = "drawn in the test"
    item_unit = "examples"
    poison_at: int | None = None
    interrupt_at: int | None = None

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        torch.manual_seed(ctx.seed)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.batch_gen = torch.Generator().manual_seed(ctx.seed + 1)
        self.steps_per_epoch = 100
        self.items_per_call = ctx.batch_size
        self.resolved_args = dict(args)
        fixed = torch.Generator().manual_seed(3)
        self.test_x, self.test_y = torch.randn(16, 4, generator=fixed), torch.randn(16, 1, generator=fixed)

    def train_loss(self, step: int) -> torch.Tensor:
        if step == Regression.interrupt_at:
            raise KeyboardInterrupt
        x, y = torch.randn(8, 4, generator=self.batch_gen), torch.randn(8, 1, generator=self.batch_gen)
        loss = nn.functional.mse_loss(self.model(x), y)
        return loss * math.nan if step == Regression.poison_at else loss

    def evaluate(self) -> EvalResult:
        loss = float(nn.functional.mse_loss(self.model(self.test_x), self.test_y))
        return EvalResult(loss=loss, metric=loss)


@pytest.fixture
def regression(monkeypatch):
    definition = register_task(monkeypatch, "log-points-regression", Regression)
    monkeypatch.setattr(Regression, "poison_at", None)
    monkeypatch.setattr(Regression, "interrupt_at", None)
    return definition


def _run(tmp_path: Path, eval_every: int, log_every: int = 1) -> Any:
    path = tmp_path / f"e{eval_every}-l{log_every}.toml"
    path.write_text(
        'task = "log-points-regression"\noptims = ["adamw"]\nseeds = [0]\n'
        f"[budget]\nsteps = {STEPS}\nbatch_size = 8\nlog_every = {log_every}\neval_every = {eval_every}\n"
        "grad_clip = 0.5\n[schedule]\nkind = \"cosine\"\nwarmup_steps = 3\n"
    )
    [suite], _ = spec_module.load_suites(str(path), [])
    return execute(suite, "adamw", 0, torch.device("cpu"), tmp_path)


def _train_points(outcome: Any) -> list[tuple[Any, ...]]:
    return [(c["step"], c["loss"], c["lr"], c["grad_norm"]) for c in outcome.curves if c["split"] == "train"]


@pytest.mark.parametrize("log_every", [1, 5])
def test_deferred_log_points_log_exactly_what_immediate_ones_do(regression, tmp_path: Path, log_every: int):
    deferred, immediate = _run(tmp_path, 0, log_every), _run(tmp_path, 1, log_every)
    assert deferred.row["status"] == immediate.row["status"] == "ok"
    assert _train_points(deferred) == _train_points(immediate)
    assert len(_train_points(deferred)) == STEPS // log_every + (STEPS % log_every > 0)
    assert deferred.row["steps"] == immediate.row["steps"] == STEPS
    assert deferred.row["final_train_loss"] == immediate.row["final_train_loss"]


def test_only_the_last_log_point_reads_at_once(regression, monkeypatch, tmp_path: Path):
    reads: list[int] = []
    real = loop._read_now

    def counted(*args: Any) -> Any:
        window = real(*args)
        reads.append(window.done)
        return window

    monkeypatch.setattr(loop, "_read_now", counted)
    assert _run(tmp_path, 0).row["status"] == "ok"
    assert reads == [STEPS]


@pytest.mark.parametrize("log_every", [1, 5])
@pytest.mark.parametrize("poisoned", [2, 6, STEPS - 1])
def test_a_divergence_in_a_deferred_window_ends_the_run_at_its_step(
    regression, monkeypatch, tmp_path, poisoned, log_every
):
    monkeypatch.setattr(Regression, "poison_at", poisoned)
    deferred, immediate = _run(tmp_path, 0, log_every), _run(tmp_path, 1, log_every)
    for outcome in (deferred, immediate):
        assert outcome.row["status"] == "diverged"
        assert outcome.row["steps"] == poisoned + 1
        assert f"at step {poisoned + 1}" in outcome.row["error"]
    assert _train_points(deferred) == _train_points(immediate)


def test_an_interrupt_keeps_the_window_still_on_its_way(regression, monkeypatch, tmp_path: Path):
    monkeypatch.setattr(Regression, "interrupt_at", 7)
    outcome = _run(tmp_path, 0)
    assert outcome.interrupted and outcome.row["status"] == "interrupted"
    assert [point[0] for point in _train_points(outcome)] == list(range(1, 8))


def test_curve_times_never_go_backwards(regression, tmp_path: Path):
    outcome = _run(tmp_path, 4)
    walls = [c["wall_s"] for c in outcome.curves if c["split"] == "train"]
    assert all(earlier < later for earlier, later in itertools.pairwise(walls)), walls
    assert walls[-1] <= outcome.row["wall_s"]
