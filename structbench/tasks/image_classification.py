"""Image classification on a real on-disk dataset (digits, MNIST, Fashion-MNIST, CIFAR) held on the device.

The whole dataset is loaded through `structbench.data` (never downloaded, never substituted), scaled to
[0, 1] by the dataset's pixel maximum and standardised per channel with the training split's mean and
standard deviation. Each step draws a seeded random minibatch; evaluation runs on the whole test split.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from structbench.data import load, require
from structbench.tasks.base import EvalResult, TaskContext, TaskDef
from structbench.tasks.vision.models import build_model

DEFAULTS: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "hidden": 128,
    "label_smoothing": 0.0,
    "eval_batch_size": 1024,
}


class ImageClassificationTask:
    metric_name = "accuracy"
    metric_mode: Literal["min", "max"] = "max"

    def __init__(self, args: dict[str, Any], ctx: TaskContext) -> None:
        train, test, meta = load(args["dataset"], ctx.data_root)
        self.data_source = f"{meta.name} from {meta.source}"
        scale = float(meta.pixel_max)
        train_x = train.inputs.float() / scale
        mean = train_x.mean(dim=(0, 2, 3), keepdim=True)
        std = train_x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
        self.train_x = ((train_x - mean) / std).to(ctx.device)
        self.test_x = ((test.inputs.float() / scale - mean) / std).to(ctx.device)
        self.train_y, self.test_y = train.labels.to(ctx.device), test.labels.to(ctx.device)
        _, channels, height, _ = self.train_x.shape
        torch.manual_seed(ctx.seed)
        self.model = build_model(
            args["model"],
            in_channels=channels,
            image_size=height,
            num_classes=meta.num_classes,
            hidden=int(args["hidden"]),
        )
        self.model = self.model.to(ctx.device)
        self.label_smoothing = float(args["label_smoothing"])
        self.eval_batch_size = int(args["eval_batch_size"])
        self.batch_size = ctx.batch_size
        self.batch_gen = torch.Generator().manual_seed(ctx.seed + 1)

    def train_loss(self, step: int) -> torch.Tensor:
        index = torch.randint(len(self.train_y), (self.batch_size,), generator=self.batch_gen).to(self.train_x.device)
        logits = self.model(self.train_x[index])
        return F.cross_entropy(logits, self.train_y[index], label_smoothing=self.label_smoothing)

    def evaluate(self) -> EvalResult:
        total_loss, correct = 0.0, 0
        for start in range(0, len(self.test_y), self.eval_batch_size):
            logits = self.model(self.test_x[start : start + self.eval_batch_size])
            labels = self.test_y[start : start + self.eval_batch_size]
            total_loss += float(F.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(dim=1) == labels).sum())
        return EvalResult(loss=total_loss / len(self.test_y), metric=correct / len(self.test_y))


IMAGE_CLASSIFICATION = TaskDef(
    name="image-classification",
    summary="MLP or small CNN on a real on-disk image dataset (digits, MNIST, Fashion-MNIST, CIFAR)",
    defaults=DEFAULTS,
    build=ImageClassificationTask,
    preflight=lambda args, data_root: require(args["dataset"], data_root),
)
