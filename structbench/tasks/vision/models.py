"""Image-classification models by name: `build_model(name, ...)` gives an `nn.Module` mapping N,C,H,W to logits.

The classifier head is registered last, so the parameter partition recognises it as the output head.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from structbench.errors import UsageError

MODELS = ("mlp", "cnn")


def build_model(name: str, *, in_channels: int, image_size: int, num_classes: int, **options: Any) -> nn.Module:
    """`mlp`: two hidden ReLU layers of width `hidden`; `cnn`: two 3x3 conv + max-pool stages and a linear head."""
    if name == "mlp":
        hidden = int(options.get("hidden", 128))
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (image_size // 4) ** 2, num_classes),
        )
    raise UsageError(f"unknown model {name!r}; valid: {', '.join(MODELS)}.")
