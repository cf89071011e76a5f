"""The runner's budget features: epochs, gradient accumulation, gradient clipping, throughput, resolved task args.

A small task with known data (a linear model and fixed micro-batches) is registered for these tests, so each
effect can be computed by hand: the accumulated gradient is the mean of the micro-batch gradients, the
clipped update is the gradient rescaled to the clip norm, epochs multiply the task's steps per epoch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from structbench.errors import UsageError
from structbench.execution.runner import execute
from structbench.plan import spec as spec_module
from structbench.tasks.base import EvalResult, TaskContext
from tests.support.store import read_runs
from tests.support.tasks import register_task

INPUTS = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 1.0]])
TARGETS = torch.tensor([1.0, -1.0, 2.0, 0.0])


class FixedBatches:
    """Least squares on a linear model; call k of train_loss uses example k mod 4 (one example per call)."""

    metric_name = "loss"
    metric_mode = "min"
    data_source = "fixed in the test"
    item_unit = "examples"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        self.model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.model.weight.copy_(torch.tensor([[0.5, -0.25]]))
        self.calls = 0
        self.steps_per_epoch = int(args["calls_per_epoch"])
        self.items_per_call = ctx.batch_size
        self.resolved_args = {**args, "seen_batch_size": ctx.batch_size}

    def train_loss(self, step: int) -> torch.Tensor:
        k = self.calls % len(TARGETS)
        self.calls += 1
        return 0.5 * (self.model(INPUTS[k]).squeeze() - TARGETS[k]) ** 2

    def evaluate(self) -> EvalResult:
        loss = float(0.5 * ((self.model(INPUTS).squeeze(1) - TARGETS) ** 2).mean())
        return EvalResult(loss=loss, metric=loss)

    def stream_state(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.calls = state["calls"]


@pytest.fixture
def fixed_task(monkeypatch):
    return register_task(monkeypatch, "fixed-batches", FixedBatches, {"calls_per_epoch": 4})


def _suite(tmp_path: Path, budget: str, hparams: str = "lr = 0.1\nmomentum = 0.0") -> Path:
    path = tmp_path / "fixed.toml"
    path.write_text(
        f'task = "fixed-batches"\noptims = ["sgd"]\nseeds = [0]\n[budget]\n{budget}\n[hparams.sgd]\n{hparams}\n'
    )
    return path


def _run(path: Path, *overrides: str):
    [suite], _ = spec_module.load_suites(str(path), overrides)
    return execute(suite, "sgd", 0, torch.device("cpu"), path.parent)


def _grad(weight: torch.Tensor, k: int) -> torch.Tensor:
    """d/dw of 0.5 (w.x - y)^2 = (w.x - y) x, by hand."""
    return (weight @ INPUTS[k] - TARGETS[k]) * INPUTS[k]


def test_gradient_accumulation_steps_on_the_mean_of_the_micro_batch_gradients(fixed_task, tmp_path):
    outcome = _run(_suite(tmp_path, "steps = 1\nbatch_size = 2\ngrad_accum = 2\nlog_every = 1"))
    w0 = torch.tensor([0.5, -0.25])
    expected = w0 - 0.1 * (_grad(w0, 0) + _grad(w0, 1)) / 2
    stored = json.loads(outcome.row["spec"])
    assert stored["task_args_resolved"]["seen_batch_size"] == 1
    first_losses = [0.5 * float(w0 @ INPUTS[k] - TARGETS[k]) ** 2 for k in (0, 1)]
    train = [c for c in outcome.curves if c["split"] == "train"]
    # float32 losses of a 2-weight model: a length-2 dot product, a square and a mean of 2, each within a few u
    # (u = 2^-24) relative: below 1e-6 (pytest.approx's default rel); a sum instead of a mean is off by 2x.
    assert train[0]["loss"] == pytest.approx(sum(first_losses) / 2)
    weight = _final_weight(tmp_path, "steps = 1\nbatch_size = 2\ngrad_accum = 2\nlog_every = 1")
    torch.testing.assert_close(weight, expected)


def _final_weight(tmp_path: Path, budget: str) -> torch.Tensor:
    """Re-run and capture the model's weight after training (the runner does not return the model)."""
    captured: dict[str, torch.Tensor] = {}
    original = FixedBatches.evaluate

    def capture(self):
        captured["w"] = self.model.weight.detach().clone().squeeze(0)
        return original(self)

    FixedBatches.evaluate = capture
    try:
        _run(_suite(tmp_path, budget))
    finally:
        FixedBatches.evaluate = original
    return captured["w"]


def test_gradient_clipping_rescales_the_gradient_to_the_clip_norm_and_logs_the_norm(fixed_task, tmp_path):
    w0 = torch.tensor([0.5, -0.25])
    grad = _grad(w0, 0)
    clip = 0.1 * float(grad.norm())
    budget = f"steps = 1\nbatch_size = 1\ngrad_clip = {clip}\nlog_every = 1"
    outcome = _run(_suite(tmp_path, budget))
    train = [c for c in outcome.curves if c["split"] == "train"]
    # The norm of a float32 2-vector (two squares, a sum, a square root) is within 3u = 1.8e-7 relative: rel 1e-6.
    assert train[0]["grad_norm"] == pytest.approx(float(grad.norm()), rel=1e-6)
    weight = _final_weight(tmp_path, budget)
    # One clipped SGD step in float32, w - lr g (clip / ||g||): a handful of roundings of entries below 1, each within
    # u |value|: rtol 1e-5 and atol 1e-6 hold them with margin; an unclipped step would be off by 0.9 lr ||g||.
    torch.testing.assert_close(weight, w0 - 0.1 * grad * (clip / float(grad.norm())), rtol=1e-5, atol=1e-6)


def test_without_clipping_no_gradient_norm_is_logged(fixed_task, tmp_path):
    outcome = _run(_suite(tmp_path, "steps = 2\nbatch_size = 1\nlog_every = 1"))
    assert all(c["grad_norm"] is None for c in outcome.curves)


def test_epochs_set_the_steps_and_evaluate_at_every_epoch_end(fixed_task, tmp_path):
    outcome = _run(
        _suite(tmp_path, "epochs = 2.5\nbatch_size = 2\ngrad_accum = 1\nlog_every = 1"), "task_args.calls_per_epoch=4"
    )
    assert outcome.row["status"] == "ok"
    assert outcome.row["steps"] == 10
    evals = [c["step"] for c in outcome.curves if c["split"] == "eval"]
    assert evals == [0, 4, 8, 10]
    stored = json.loads(outcome.row["spec"])
    assert stored["budget"]["steps"] == 10


def test_epochs_count_optimizer_steps_when_accumulating(fixed_task, tmp_path):
    outcome = _run(
        _suite(tmp_path, "epochs = 1.0\nbatch_size = 2\ngrad_accum = 2\nlog_every = 1"), "task_args.calls_per_epoch=8"
    )
    assert outcome.row["steps"] == 4


def test_epochs_on_a_task_without_epochs_is_a_usage_error(tmp_path):
    path = tmp_path / "q.toml"
    path.write_text('task = "quadratic"\noptims = ["sgd"]\n[budget]\nepochs = 1.0\n')
    with pytest.raises(UsageError, match="epoch"):
        _run(path)


def test_throughput_is_items_over_the_timed_steps(fixed_task, tmp_path):
    outcome = _run(_suite(tmp_path, "steps = 6\nbatch_size = 4\ngrad_accum = 2\nlog_every = 1"))
    row = outcome.row
    train = [c for c in outcome.curves if c["split"] == "train"]
    timed = [c["step_time_s"] for c in train[1:]]
    assert row["throughput_unit"] == "examples/s"
    assert row["throughput_per_s"] == pytest.approx(2 * 2 * len(timed) / sum(timed))


def test_a_task_without_items_has_no_throughput(tmp_path):
    path = tmp_path / "q.toml"
    path.write_text('task = "quadratic"\noptims = ["sgd"]\n[budget]\nsteps = 3\n')
    row = _run(path).row
    assert row["throughput_per_s"] is None and row["throughput_unit"] is None


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ("batch_size = 6\ngrad_accum = 4", "grad_accum"),
        ("grad_accum = 0", "grad_accum"),
        ("epochs = -1.0", "epochs"),
        ("grad_clip = -0.5", "grad_clip"),
        ("grad_clip = nan", "grad_clip"),
    ],
)
def test_bad_budget_values_are_usage_errors(fixed_task, tmp_path, budget, message):
    with pytest.raises(UsageError, match=message):
        spec_module.load_suites(str(_suite(tmp_path, budget)))


def test_clip_norm_matches_torch_clip_grad_norm_definition(fixed_task, tmp_path):
    """The logged norm is the global 2-norm over all parameters (torch's definition), here one weight."""
    w0 = torch.tensor([0.5, -0.25])
    outcome = _run(_suite(tmp_path, "steps = 1\nbatch_size = 1\ngrad_clip = 1e6\nlog_every = 1"))
    grad = _grad(w0, 0)
    # A float32 2-vector's norm either way: within 3u = 1.8e-7 relative of each other (rel 1e-6).
    assert outcome.curves[1]["grad_norm"] == pytest.approx(math.sqrt(float((grad**2).sum())), rel=1e-6)


def test_the_steps_flag_replaces_an_epoch_budget(fixed_task, cli, tmp_path):
    path = _suite(tmp_path, "epochs = 3.0\nbatch_size = 1\nlog_every = 1")
    result = cli("run", "--suite", path, "--steps", "2", "--out", tmp_path / "r", "--quiet")
    assert result.exit_code == 0, result.output
    assert read_runs(tmp_path / "r").steps.tolist() == [2]
