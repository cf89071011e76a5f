"""CIFAR ResNet-18/34 (He et al., CVPR 2016, Table 1 stage layout) in the kuangliu/pytorch-cifar form.

The ImageNet stem (7x7 stride-2 conv + 3x3 max-pool) is replaced by one 3x3 stride-1 conv with 64 channels, so a
32x32 image keeps its resolution into stage 1. Four stages of `BasicBlock`s with 64/128/256/512 channels (strides
1/2/2/2; 2-2-2-2 blocks for ResNet-18, 3-4-6-3 for ResNet-34), global average pooling and a linear head. The 4-bit
Shampoo paper's CIFAR-100 ResNet-34 is this network (its code adopts kuangliu's). Global pooling makes any input size
work; 32x32 and 28x28 inputs both end in a 4x4 map after the three stride-2 stages.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from structbench.tasks.vision.blocks import BasicBlock, narrow

STAGE_WIDTHS = (64, 128, 256, 512)
STAGE_STRIDES = (1, 2, 2, 2)
BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class CifarResNet(nn.Module):
    """Stem conv-BN-ReLU, four BasicBlock stages, global average pool, linear head (registered last)."""

    def __init__(self, depth: int, *, in_channels: int, num_classes: int, width_div: int = 1) -> None:
        super().__init__()
        widths = [narrow(w, width_div) for w in STAGE_WIDTHS]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages = []
        channels = widths[0]
        for width, stride, count in zip(widths, STAGE_STRIDES, BLOCKS[depth], strict=True):
            blocks = [BasicBlock(channels, width, stride)] + [BasicBlock(width, width, 1) for _ in range(count - 1)]
            stages.append(nn.Sequential(*blocks))
            channels = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.linear(F.adaptive_avg_pool2d(out, 1).flatten(1))
