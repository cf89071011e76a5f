"""CIFAR VGG-19 with batch norm (Simonyan & Zisserman, ICLR 2015, Table 1 column E; BN after every conv).

The layout is the kuangliu/pytorch-cifar one that the 4-bit Shampoo paper's reference code adopts for its CIFAR-100
VGG19: sixteen 3x3 convs (with bias) each followed by BatchNorm and ReLU in the configuration
64,64,M,128,128,M,256x4,M,512x4,M,512x4,M, global average pooling, and a single `Linear(512, classes)` head instead
of VGG's three fully connected layers (the 32x32 input is 1x1 after the five pools, so the head sees 512 features).

One deliberate difference: the max-pools use `ceil_mode=True`. On even sizes (every stage of a 32x32 input) this is
identical to the reference; it lets a 28x28 input through (28-14-7-4-2-1) instead of pooling a 1x1 map to nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from structbench.tasks.vision.blocks import narrow

VGG19_LAYOUT: tuple[int | str, ...] = (
    *(64, 64, "M"),
    *(128, 128, "M"),
    *(256, 256, 256, 256, "M"),
    *(512, 512, 512, 512, "M"),
    *(512, 512, 512, 512, "M"),
)


class CifarVGG(nn.Module):
    """`features` (conv-BN-ReLU and max-pool layers), global average pool, linear `classifier` (registered last)."""

    def __init__(self, *, in_channels: int, num_classes: int, width_div: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for item in VGG19_LAYOUT:
            if item == "M":
                layers.append(nn.MaxPool2d(2, stride=2, ceil_mode=True))
                continue
            width = narrow(int(item), width_div)
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.features(x)).flatten(1))
