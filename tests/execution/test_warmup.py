"""Each run's warm-up (structbench.execution.warmup): its real first steps run before the clock and are undone.

Two facts are checked. (1) What the warm-up pays stays out of the run's clock: a task whose first training step in
the process advances a fake clock by FIRST_LAUNCH_S (a stand-in for first kernel launches) puts that time into
`warmup_s` with the warm-up and into `wall_s` and time to target without it. (2) The warm-up changes nothing the run
computes: with and without it, every logged loss and the final evaluation are bit-identical on a CPU, for
optimizers with state built at their first step, refreshes, random projections and per-shape stacks, on a model
with BatchNorm (buffers) and dropout (the global generator) fed by the task's own seeded stream.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from structbench import measure
from structbench.errors import UsageError
from structbench.execution.runner import execute
from structbench.plan import grid
from structbench.plan import spec as spec_module
from structbench.tasks.base import EvalResult, TaskContext
from tests.support.tasks import SeededBatches, register_task

FIRST_LAUNCH_S = 1000.0
"""What the fake clock advances at the task's first training step in the process: far above what a few steps of a
tiny model take on any machine, so the comparisons below cannot be decided by real time."""


class FakeClock:
    """`time.perf_counter` plus an offset that the task's first step raises."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.real = time.perf_counter

    def __call__(self) -> float:
        return self.real() + self.offset


class Classifier(SeededBatches):
    """A small classifier with BatchNorm and dropout, fed by its own seeded generator; its first step in the process
    (counted on the class) advances `clock` by FIRST_LAUNCH_S when a clock is set."""

    metric_name = "loss"
    metric_mode = "min"
    data_source = "drawn in the test"
    item_unit = "examples"
    clock: FakeClock | None = None
    stepped = False

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        torch.manual_seed(ctx.seed)
        self.model = nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.25), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)
        )
        self.steps_per_epoch = 100
        self.items_per_call = ctx.batch_size
        self.resolved_args = dict(args)
        self.batch_gen = torch.Generator().manual_seed(ctx.seed + 1)
        self.batch_size = ctx.batch_size
        fixed = torch.Generator().manual_seed(7)
        self.test_x, self.test_y = torch.randn(32, 6, generator=fixed), torch.randint(0, 3, (32,), generator=fixed)

    def train_loss(self, step: int) -> torch.Tensor:
        if Classifier.clock is not None and not Classifier.stepped:
            Classifier.clock.offset += FIRST_LAUNCH_S
        Classifier.stepped = True
        x = torch.randn(self.batch_size, 6, generator=self.batch_gen)
        y = torch.randint(0, 3, (self.batch_size,), generator=self.batch_gen)
        return nn.functional.cross_entropy(self.model(x), y)

    def evaluate(self) -> EvalResult:
        loss = float(nn.functional.cross_entropy(self.model(self.test_x), self.test_y))
        return EvalResult(loss=loss, metric=loss)


@pytest.fixture
def classifier(monkeypatch):
    definition = register_task(monkeypatch, "warmup-classifier", Classifier)
    monkeypatch.setattr(Classifier, "clock", None)
    monkeypatch.setattr(Classifier, "stepped", False)
    return definition


def _suite(tmp_path: Path, optim: str, warmup_steps: int, steps: int = 6, target: str = "") -> Any:
    path = tmp_path / f"{optim}-{warmup_steps}.toml"
    path.write_text(
        f'task = "warmup-classifier"\noptims = ["{optim}"]\nseeds = [0]\n'
        f"[budget]\nsteps = {steps}\nbatch_size = 16\nlog_every = 1\neval_every = 1\nwarmup_steps = {warmup_steps}\n"
        f"{target}"
    )
    [suite], _ = spec_module.load_suites(str(path), [])
    return suite


@pytest.mark.parametrize("warmup_steps", [0, 2])
def test_the_first_launch_cost_is_warmup_s_and_stays_out_of_wall_and_time_to_target(
    classifier, monkeypatch, tmp_path: Path, warmup_steps: int
):
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(Classifier, "clock", clock)
    suite = _suite(tmp_path, "adamw", warmup_steps, target='[target]\nmetric = "loss"\nvalue = 1e9\n')
    row = execute(suite, "adamw", 0, torch.device("cpu"), tmp_path).row
    assert row["status"] == "ok"
    assert row["target_step"] == 1, "every evaluation reaches a loss of 1e9: the target is timed at the first one"
    if warmup_steps:
        assert row["warmup_s"] >= FIRST_LAUNCH_S
        assert row["wall_s"] < FIRST_LAUNCH_S and row["target_s"] < FIRST_LAUNCH_S
    else:
        assert row["warmup_s"] == 0.0
        assert row["wall_s"] >= FIRST_LAUNCH_S and row["target_s"] >= FIRST_LAUNCH_S


OPTIMIZERS = ("adamw", "soap", "fismo", "apollo-mini", "sumo", "shampoo", "muon", "asgo")
"""State built at the first step (AdamW, SOAP's bases, Shampoo's statistics), random projections drawn from seeds
(APOLLO-mini), subspace refreshes (SUMO), per-shape stacks and deferred checks (FISMO, ASGO), Newton-Schulz (Muon)."""


@pytest.mark.parametrize("optim", OPTIMIZERS)
def test_a_warmed_up_run_computes_exactly_what_an_unwarmed_one_does(classifier, tmp_path: Path, optim: str):
    outcomes = [execute(_suite(tmp_path, optim, w), optim, 0, torch.device("cpu"), tmp_path) for w in (0, 2)]
    rows = [outcome.row for outcome in outcomes]
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert rows[0]["warmup_s"] == 0.0 and rows[1]["warmup_s"] > 0.0
    losses = [[(c["step"], c["split"], c["loss"]) for c in outcome.curves] for outcome in outcomes]
    assert len(losses[0]) == len(losses[1]) > 6
    assert losses[0] == losses[1]
    assert rows[0]["final_eval_loss"] == rows[1]["final_eval_loss"]


def test_warmup_steps_and_empty_cache_do_not_change_the_run_key(classifier, tmp_path: Path):
    base = _suite(tmp_path, "adamw", 2)
    keys = set()
    for warmup_steps, empty_cache in ((0, False), (2, False), (5, True)):
        budget = {**base.budget, "warmup_steps": warmup_steps, "empty_cache": empty_cache}
        keys.add(grid.run_key(dataclasses.replace(base, budget=budget), "adamw", 0, "cpu"))
    assert len(keys) == 1


def test_a_negative_warmup_is_a_usage_error(classifier, tmp_path: Path):
    with pytest.raises(UsageError, match=re.escape("budget.warmup_steps must be >= 0")):
        _suite(tmp_path, "adamw", -1)


def test_the_cuda_allocator_cache_is_emptied_only_when_asked(monkeypatch):
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(measure, "nvml_reader", lambda index: None)
    probe = measure.MemoryProbe(torch.device("cuda", 0))
    probe.reset()
    assert emptied == []
    probe.reset(empty_cache=True)
    assert emptied == [True]


@pytest.mark.parametrize("empty_cache", [False, True])
def test_the_run_passes_budget_empty_cache_to_its_memory_probe(classifier, monkeypatch, tmp_path: Path, empty_cache):
    asked: list[bool] = []
    real_reset = measure.MemoryProbe.reset

    def reset(self: measure.MemoryProbe, empty_cache: bool = False) -> None:
        asked.append(empty_cache)
        real_reset(self, empty_cache)

    monkeypatch.setattr(measure.MemoryProbe, "reset", reset)
    suite = _suite(tmp_path, "adamw", 0, steps=1)
    suite = dataclasses.replace(suite, budget={**suite.budget, "empty_cache": empty_cache})
    assert execute(suite, "adamw", 0, torch.device("cpu"), tmp_path).row["status"] == "ok"
    assert asked == [empty_cache]
