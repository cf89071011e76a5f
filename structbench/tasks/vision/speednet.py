"""speed-net: the network of Keller Jordan's airbench94 CIFAR-10 speedrun (94% in under 10 epochs on one GPU).

The airbench94 architecture (github.com/KellerJordan/cifar10-airbench, `airbench94.py`; descended from tysam-code's
hlb-CIFAR10 and Page's "How to train your ResNet"), written anew here:

- `whiten`: a 2x2 conv, padding 0, with bias, from C input channels to 2*C*2*2 = 24 channels (C = 3). Its weight is
  frozen (`requires_grad=False`); airbench sets it from the data with `init_whitening` (the eigenvectors of the
  2x2-patch second-moment matrix, scaled by 1/sqrt(eigenvalue + 5e-4), and their negatives). Its bias starts at 0.
  Then GELU.
- three conv groups of widths 64, 256, 256, each `conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU`.
  The convs are bias-free with padding 1 and start as PyTorch's default init with the first `in_channels` filters
  overwritten by a Dirac (identity) kernel, an implicit residual. BatchNorm has eps 1e-12, running-stat momentum
  0.4 (airbench's "0.6" in its 1 - momentum convention) and a frozen unit scale: only the BN shift is trained.
- a global max-pool (airbench's `MaxPool2d(3)` on the final 3x3 map), a bias-free `Linear(256, classes)` head
  with PyTorch's default init (registered last), and a fixed output scale `scale` = 1/9.

What airbench94 does outside the module, and what a training recipe must do to reach its 94%: call
`init_whitening` on (normalised) training images before training; train the whitening bias for the first 3
epochs only; run in fp16 with channels_last (BN in fp32); Nesterov SGD (lr 11.5 and wd 0.0153 per 1024 examples
in its decoupled form, momentum 0.85, BN-shift lr x64) at batch 1024 for 9.9 epochs on a triangular schedule;
label smoothing 0.2; flip + 2-pixel translate augmentation; Lookahead-style EMA; and test-time augmentation
(mirror + 1-pixel translations). Its Muon variant (`airbench94_muon.py`) uses the same network.

Spatial sizes: 32 -> 31 (whiten) -> 15 -> 7 -> 3 -> 1, and 28 -> 27 -> 13 -> 6 -> 3 -> 1.
"""

from __future__ import annotations

import torch
from torch import nn

from structbench.tasks.vision.blocks import narrow

WHITEN_KERNEL = 2
GROUP_WIDTHS = (64, 256, 256)


def identity_init_conv(in_channels: int, out_channels: int) -> nn.Conv2d:
    """Bias-free 3x3 conv (padding 1) whose first `in_channels` filters are the identity (Dirac) kernel."""
    conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
    nn.init.dirac_(conv.weight.data[:in_channels])
    return conv


def shift_only_batchnorm(channels: int) -> nn.BatchNorm2d:
    """BatchNorm with eps 1e-12, running-stat momentum 0.4 and a frozen scale of one."""
    norm = nn.BatchNorm2d(channels, eps=1e-12, momentum=0.4)
    norm.weight.requires_grad_(False)
    return norm


class ConvGroup(nn.Module):
    """conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = identity_init_conv(in_channels, out_channels)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = shift_only_batchnorm(out_channels)
        self.conv2 = identity_init_conv(out_channels, out_channels)
        self.norm2 = shift_only_batchnorm(out_channels)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class SpeedNet(nn.Module):
    """Frozen whitening conv, three conv groups, global max-pool, bias-free linear head times a fixed scale."""

    def __init__(self, *, in_channels: int, num_classes: int, width_div: int = 1, scale: float = 1 / 9) -> None:
        super().__init__()
        whiten_width = 2 * in_channels * WHITEN_KERNEL**2
        self.whiten = nn.Conv2d(in_channels, whiten_width, WHITEN_KERNEL, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        nn.init.zeros_(self.whiten.bias)
        widths = [narrow(width, width_div) for width in GROUP_WIDTHS]
        self.layers = nn.Sequential(
            nn.GELU(),
            ConvGroup(whiten_width, widths[0]),
            ConvGroup(widths[0], widths[1]),
            ConvGroup(widths[1], widths[2]),
            nn.AdaptiveMaxPool2d(1),
        )
        self.head = nn.Linear(widths[2], num_classes, bias=False)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.whiten(x)).flatten(1)) * self.scale

    @torch.no_grad()
    def init_whitening(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the frozen whitening filters from N,C,H,W training images (airbench94's `init_whitening_conv`).

        With M the uncentred second-moment matrix of all 2x2 patches (flattened channel-major, like the conv
        weight) and M = sum_i l_i e_i e_i^T, the filters are e_i / sqrt(l_i + eps) (largest l_i first) followed by
        their negatives, so the first half of the outputs has second moments l_i / (l_i + eps), nearly one.
        """
        channels, k = images.shape[1], WHITEN_KERNEL
        patches = images.float().unfold(2, k, 1).unfold(3, k, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, channels * k * k)
        moments = patches.T @ patches / patches.shape[0]
        eigenvalues, eigenvectors = torch.linalg.eigh(moments)
        filters = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).flip(0).reshape(-1, channels, k, k)
        self.whiten.weight.copy_(torch.cat((filters, -filters)).to(self.whiten.weight))
