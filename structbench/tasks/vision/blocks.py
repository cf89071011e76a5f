"""Pieces shared by the CIFAR conv nets: channel narrowing and the ResNet basic block.

`BasicBlock` is the two-conv residual block of He et al., *Deep Residual Learning for Image Recognition*
(CVPR 2016, Fig. 2 left, option B shortcuts), in the form of the widely used kuangliu/pytorch-cifar code:
bias-free 3x3 convs, BatchNorm after each, and a 1x1 conv + BatchNorm projection shortcut exactly when the
stride or the channel count changes. SimpleDLA (dla.py) reuses it as its tree leaf.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from structbench.errors import UsageError


def narrow(width: int, width_div: int) -> int:
    """`width / width_div`, for the `width_div` option that shrinks a net for CPU runs; it must divide exactly."""
    if width_div < 1 or width % width_div:
        raise UsageError(f"width_div={width_div} must be a positive divisor of every channel count, e.g. {width}.")
    return width // width_div


class BasicBlock(nn.Module):
    """relu(bn(conv3x3(relu(bn(conv3x3_stride(x))))) + shortcut(x))."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))
