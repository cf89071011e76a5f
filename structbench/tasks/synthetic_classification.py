"""A labelled-synthetic classification task: an MLP on a seeded Gaussian mixture.

Used by the smoke suite only; every run of it records `data_source = "synthetic gaussian mixture"`.
Class means are drawn N(0, separation^2 I) in `dim` dimensions; samples add N(0, I) noise.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from structbench.errors import UsageError
from structbench.tasks.base import EvalResult, TaskContext, TaskDef, check_memory, to_device

DEFAULTS: dict[str, Any] = {
    "classes": 4,
    "dim": 16,
    "hidden": 32,
    "separation": 2.0,
    "train_size": 512,
    "test_size": 512,
}


def validate_args(args: dict[str, Any]) -> None:
    """Raise UsageError for sizes no run could use, or data and model too large for this machine's memory."""
    sizes = {key: int(args[key]) for key in ("classes", "dim", "hidden", "train_size", "test_size")}
    for key, size in sizes.items():
        if size < 1:
            raise UsageError(f"task_args.{key} must be >= 1, got {size}.")
    if not args["separation"] >= 0:
        raise UsageError(f"task_args.separation must be >= 0, got {args['separation']}.")
    dim, hidden, classes = sizes["dim"], sizes["hidden"], sizes["classes"]
    examples = sizes["train_size"] + sizes["test_size"]
    weights = dim * hidden + hidden * hidden + hidden * classes
    check_memory(
        f"synthetic-classification with {examples} examples of dim {dim} and hidden {hidden}: the data and model",
        4 * (examples * dim + classes * dim + weights),
    )


def mlp(dim: int, hidden: int, classes: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


class SyntheticClassificationTask:
    metric_name = "accuracy"
    metric_mode: Literal["min", "max"] = "max"
    data_source = "synthetic gaussian mixture"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        validate_args(args)
        gen = torch.Generator().manual_seed(ctx.seed)
        classes, dim = int(args["classes"]), int(args["dim"])
        means = torch.randn(classes, dim, generator=gen) * float(args["separation"])

        def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
            labels = torch.randint(classes, (count,), generator=gen)
            inputs = means[labels] + torch.randn(count, dim, generator=gen)
            return inputs.to(ctx.device), labels.to(ctx.device)

        self.train_x, self.train_y = sample(int(args["train_size"]))
        self.test_x, self.test_y = sample(int(args["test_size"]))
        torch.manual_seed(ctx.seed)
        self.model = mlp(dim, int(args["hidden"]), classes).to(ctx.device)
        self.forward: nn.Module = self.model
        self.shard = ctx.shard
        self.batch_size = ctx.batch_size
        self.batch_gen = torch.Generator().manual_seed(ctx.seed + 1)

    def train_loss(self, step: int) -> torch.Tensor:
        index = self.shard.take(torch.randint(len(self.train_y), (self.batch_size,), generator=self.batch_gen))
        index = to_device(index, self.train_x.device)
        loss = F.cross_entropy(self.forward(self.train_x[index]), self.train_y[index])
        return loss * self.shard.weight(len(index), self.batch_size)

    def distribute(self, ddp_module: nn.Module) -> None:
        self.forward = ddp_module

    def stream_state(self) -> dict[str, Any]:
        return {"batch_gen": self.batch_gen.get_state()}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.batch_gen.set_state(state["batch_gen"])

    def evaluate(self) -> EvalResult:
        logits = self.model(self.test_x)
        loss = F.cross_entropy(logits, self.test_y)
        accuracy = (logits.argmax(dim=1) == self.test_y).float().mean()
        return EvalResult(loss=float(loss), metric=float(accuracy))


SYNTHETIC_CLASSIFICATION = TaskDef(
    name="synthetic-classification",
    summary="MLP on a seeded Gaussian mixture (labelled synthetic; smoke suite only)",
    defaults=DEFAULTS,
    build=SyntheticClassificationTask,
    preflight=lambda args, data_root, batch_size: validate_args(args),
    metric_name=SyntheticClassificationTask.metric_name,
    distributable=True,
)
