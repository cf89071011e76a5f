"""Evaluation is timed apart from training (docs/measurement.md: wall-clock excludes evaluation, timed separately).

A task whose evaluation sleeps a known time and whose training step costs well under a millisecond makes the split
checkable: each evaluation adds at least its sleep to `eval_s`, and none of it may reach `train_s`, `wall_s` or the
curves' wall-clock. `wall_s == train_s + compile_s` holds by definition and cannot show this.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from structbench.execution.runner import execute
from structbench.plan import spec as spec_module
from structbench.tasks.base import EvalResult, TaskContext
from tests.support.tasks import register_task

EVAL_SLEEP_S = 0.5


class SlowEvaluation:
    """Least squares on one fixed example; evaluation sleeps EVAL_SLEEP_S."""

    metric_name = "loss"
    metric_mode = "min"
    data_source = "fixed in the test"
    item_unit = "examples"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        self.model = nn.Linear(2, 1, bias=False)
        self.steps_per_epoch = 1
        self.items_per_call = ctx.batch_size
        self.resolved_args = dict(args)
        self.x, self.y = torch.tensor([1.0, 2.0]), torch.tensor(1.0)

    def train_loss(self, step: int) -> torch.Tensor:
        return 0.5 * (self.model(self.x).squeeze() - self.y) ** 2

    def evaluate(self) -> EvalResult:
        time.sleep(EVAL_SLEEP_S)
        loss = float(self.train_loss(0))
        return EvalResult(loss=loss, metric=loss)

    def stream_state(self) -> dict[str, Any]:
        return {}  # each step's batch is a function of the step alone

    def load_stream_state(self, state: dict[str, Any]) -> None:
        assert state == {}


@pytest.fixture
def slow_task(monkeypatch):
    return register_task(monkeypatch, "slow-evaluation", SlowEvaluation)


def test_a_slow_evaluation_counts_in_eval_s_and_not_in_training_time(slow_task, tmp_path: Path):
    path = tmp_path / "slow.toml"
    path.write_text(
        'task = "slow-evaluation"\noptims = ["sgd"]\nseeds = [0]\n'
        "[budget]\nsteps = 4\nbatch_size = 1\nlog_every = 1\neval_every = 1\n"
        "[hparams.sgd]\nlr = 0.1\nmomentum = 0.0\n"
    )
    [suite], _ = spec_module.load_suites(str(path), [])
    outcome = execute(suite, "sgd", 0, torch.device("cpu"), tmp_path)
    row = outcome.row
    assert row["status"] == "ok"
    evaluations = [c for c in outcome.curves if c["split"] == "eval"]
    assert len(evaluations) >= 4  # after steps 1, 2, 3 and the final one
    assert row["eval_s"] >= len(evaluations) * EVAL_SLEEP_S * 0.99
    # Four steps of a 2-weight model take milliseconds; one evaluation alone would take EVAL_SLEEP_S.
    assert row["train_s"] + row["compile_s"] < EVAL_SLEEP_S
    assert row["wall_s"] < EVAL_SLEEP_S
    assert max(c["wall_s"] for c in outcome.curves) < EVAL_SLEEP_S
