"""SimpleDLA: the simplified Deep Layer Aggregation net of kuangliu/pytorch-cifar (`models/dla_simple.py`).

Deep Layer Aggregation is Yu, Wang, Shelhamer & Darrell (CVPR 2018); kuangliu's "simple" variant, which the FISMO
paper's CIFAR-10 experiment names, keeps only the hierarchical tree aggregation:

- stem: three 3x3 conv-BN-ReLU layers, in -> 16 -> 16 -> 32 channels, stride 1;
- four trees with 64/128/256/512 channels, levels 1/2/2/1 and strides 1/2/2/2. A level-1 tree is two
  `BasicBlock`s (the first carries the stride) whose outputs are concatenated and merged by a root
  (1x1 conv-BN-ReLU, 2c -> c); a level-2 tree is the same with two level-1 trees as its children;
- global average pooling (kuangliu's `avg_pool2d(4)` on the final 4x4 map) and a linear head.

All convs are bias-free. About 15.1M parameters at full width; `width_div` divides every channel count for CPU
runs (structbench's option, not in kuangliu's code).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from structbench.tasks.vision.blocks import BasicBlock, narrow

STEM_WIDTHS = (16, 16, 32)
TREES = ((64, 1, 1), (128, 2, 2), (256, 2, 2), (512, 1, 2))  # (channels, level, stride)


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    """Bias-free `kernel_size` conv (same padding, stride 1), BatchNorm, ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class Tree(nn.Module):
    """root(cat(left(x), right(left(x)))): the children are BasicBlocks at level 1, level-1 lower trees above it."""

    def __init__(self, in_channels: int, out_channels: int, level: int, stride: int) -> None:
        super().__init__()
        self.root = conv_bn_relu(2 * out_channels, out_channels, 1)
        if level == 1:
            self.left_tree: nn.Module = BasicBlock(in_channels, out_channels, stride)
            self.right_tree: nn.Module = BasicBlock(out_channels, out_channels, 1)
        else:
            self.left_tree = Tree(in_channels, out_channels, level - 1, stride)
            self.right_tree = Tree(out_channels, out_channels, level - 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = self.left_tree(x)
        right = self.right_tree(left)
        return self.root(torch.cat((left, right), dim=1))


class SimpleDLA(nn.Module):
    """Stem, four aggregation trees, global average pool, linear head (registered last)."""

    def __init__(self, *, in_channels: int, num_classes: int, width_div: int = 1) -> None:
        super().__init__()
        stem: list[nn.Module] = []
        channels = in_channels
        for width in STEM_WIDTHS:
            stem.append(conv_bn_relu(channels, narrow(width, width_div), 3))
            channels = narrow(width, width_div)
        self.stem = nn.Sequential(*stem)
        trees = []
        for width, level, stride in TREES:
            trees.append(Tree(channels, narrow(width, width_div), level, stride))
            channels = narrow(width, width_div)
        self.trees = nn.Sequential(*trees)
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.trees(self.stem(x))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))
