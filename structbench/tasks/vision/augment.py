"""On-device batched training augmentation: random crop with zero padding and horizontal flip.

This is the standard CIFAR augmentation (He et al., CVPR 2016, Sec. 4.2: "4 pixels are padded on each side, and a
32x32 crop is randomly sampled from the padded image or its horizontal flip"), as torchvision's
`RandomCrop(size, padding=p)` followed by `RandomHorizontalFlip()` computes it: the image is padded with zeros (black
pixels, applied to the raw uint8 image before normalisation), an `H x W` window is taken at an offset drawn
uniformly from `{0, ..., 2p}` in each axis, and the window is mirrored left-right with probability 1/2.

The random draws come from a caller's `torch.Generator` (on the CPU, so a seed gives the same augmentation on every
device); the crop and the flip are then one gather on the device, for a whole batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class CropFlip:
    """Per-example augmentation draws: `offsets` (n, 2) int64 top-left corner (row, column) of each window in the
    padded image, each in [0, 2 * padding]; `flips` (n,) bool, True where the window is mirrored left-right."""

    offsets: torch.Tensor
    flips: torch.Tensor

    def __getitem__(self, rows: slice) -> CropFlip:
        return CropFlip(self.offsets[rows], self.flips[rows])

    def to(self, device: torch.device) -> CropFlip:
        return CropFlip(self.offsets.to(device), self.flips.to(device))


def draw_crop_flip(count: int, padding: int, generator: torch.Generator) -> CropFlip:
    """`count` independent draws: offsets uniform on {0, ..., 2 * padding}^2, flips Bernoulli(1/2)."""
    offsets = torch.randint(0, 2 * padding + 1, (count, 2), generator=generator)
    flips = torch.randint(0, 2, (count,), generator=generator).bool()
    return CropFlip(offsets, flips)


def zero_pad(images: torch.Tensor, padding: int) -> torch.Tensor:
    """N,C,H,W images with `padding` zero rows and columns added on every side (any dtype, uint8 included)."""
    return F.pad(images, (padding, padding, padding, padding))


def crop_flip(
    padded: torch.Tensor, draws: CropFlip, size: tuple[int, int], index: torch.Tensor | None = None
) -> torch.Tensor:
    """Windows of `size` = (H, W) cut from N,C,H+2p,W+2p `padded` images at `draws.offsets`, mirrored where
    `draws.flips`; example k of the result comes from image `index[k]` (from image k when `index` is None).

    One gather: output pixel (k, c, i, j) is padded[index[k], c, row_k + i, col_k + j], or
    padded[index[k], c, row_k + i, col_k + W - 1 - j] when flipped (crop, then flip, as torchvision). The result is
    laid out channels-last (the gather runs over N,H,W with the channels contiguous).
    """
    height, width = size
    device = padded.device
    sources = torch.arange(len(draws.flips), device=device) if index is None else index
    rows = draws.offsets[:, :1] + torch.arange(height, device=device)
    columns = torch.arange(width, device=device)
    columns = draws.offsets[:, 1:] + torch.where(draws.flips[:, None], width - 1 - columns, columns)
    windows = padded.permute(0, 2, 3, 1)[sources[:, None, None], rows[:, :, None], columns[:, None, :]]
    return windows.permute(0, 3, 1, 2)


def random_crop_flip(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """The augmentation of one N,C,H,W batch: zero-pad by `padding`, crop back to H x W at random, flip at random."""
    draws = draw_crop_flip(len(images), padding, generator).to(images.device)
    return crop_flip(zero_pad(images, padding), draws, (images.shape[-2], images.shape[-1]))
