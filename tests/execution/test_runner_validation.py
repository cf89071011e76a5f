"""The runner with a task that evaluates a validation split beside the test split.

The task's evaluations are scripted: the k-th evaluation (k = 1 before training) reports a validation loss of 1/k
and a test loss of 2/k, so which split the runner used for the target, the curves and the row is read off the
numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from structbench.execution.runner import execute
from structbench.plan import spec as spec_module
from structbench.tasks.base import EvalResult, TaskContext
from tests.support.tasks import register_task


class ScriptedEvaluations:
    metric_name = "error"
    metric_mode = "min"
    data_source = "scripted in the test"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        self.model = nn.Linear(2, 1, bias=False)
        self.evaluations = 0
        self.nan_at = args["nan_validation_at"]

    def train_loss(self, step: int) -> torch.Tensor:
        return self.model(torch.ones(2)).pow(2).sum()

    def evaluate(self) -> EvalResult:
        self.evaluations += 1
        k = self.evaluations
        val_loss = math.nan if k == self.nan_at else 1.0 / k
        return EvalResult(loss=2.0 / k, metric=20.0 / k, val_loss=val_loss, val_metric=10.0 / k)

    def stream_state(self) -> dict[str, Any]:
        return {}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        return None


@pytest.fixture
def scripted(monkeypatch):
    return register_task(monkeypatch, "scripted", ScriptedEvaluations, {"nan_validation_at": 0})


def _run(tmp_path: Path, *overrides: str):
    path = tmp_path / "scripted.toml"
    path.write_text(
        'task = "scripted"\noptims = ["sgd"]\nseeds = [0]\n[budget]\nsteps = 10\neval_every = 1\nlog_every = 1\n'
        '[target]\nmetric = "loss"\nvalue = 0.3\n'
    )
    [suite], _ = spec_module.load_suites(str(path), overrides)
    return execute(suite, "sgd", 0, torch.device("cpu"), tmp_path)


def test_target_curves_and_row_use_each_split(scripted, tmp_path):
    outcome = _run(tmp_path)
    row = outcome.row
    # Evaluation k is at step k - 1; the validation loss 1/k first reaches 0.3 at k = 4 (step 3), the test loss
    # 2/k only at k = 7 (step 6): the runner's target step is the validation split's.
    assert row["status"] == "ok" and row["target_step"] == 3
    evaluations = 11
    # The scripted values pass through float32 at most once (rel error <= u = 2^-24 < approx's default 1e-6).
    assert row["final_val_loss"] == pytest.approx(1.0 / evaluations)
    assert row["final_val_metric"] == pytest.approx(10.0 / evaluations)
    assert row["final_eval_loss"] == pytest.approx(2.0 / evaluations)
    assert row["final_eval_metric"] == pytest.approx(20.0 / evaluations)
    for split, scale in (("val", 1.0), ("eval", 2.0)):
        points = [p for p in outcome.curves if p["split"] == split]
        assert [p["step"] for p in points] == list(range(11))
        losses = [p["loss"] for p in points]
        assert losses == pytest.approx([scale / k for k in range(1, 12)])


def test_a_non_finite_validation_loss_ends_the_run_diverged(scripted, tmp_path):
    row = _run(tmp_path, "task_args.nan_validation_at=3").row  # evaluation 3: after step 2
    assert row["status"] == "diverged" and row["steps"] == 2
    assert row["error"] == "non-finite evaluation loss (nan) at step 2"
    assert row["final_val_loss"] is None and row["final_eval_loss"] is None
