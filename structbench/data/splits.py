"""What every dataset reader returns: tensors per split, where they came from, and a lookup result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

IMAGE_LAYOUT = "N,C,H,W"
"""Layout of every image tensor the readers return; single-channel images keep C = 1."""


@dataclass(frozen=True)
class ArraySplit:
    """One split of a dataset: ``inputs`` (uint8, N,C,H,W) and ``labels`` (int64, N)."""

    inputs: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            raise ValueError(f"labels must be a 1-D int64 tensor, got {self.labels.dtype} {tuple(self.labels.shape)}")
        if self.inputs.shape[0] != self.labels.shape[0]:
            raise ValueError(f"{self.inputs.shape[0]} inputs but {self.labels.shape[0]} labels")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class DatasetMeta:
    """Facts about one loaded dataset, to be recorded with a run.

    ``pixel_max`` is the largest value a pixel can take (255 for 8-bit images, 16 for sklearn
    digits), so a task can scale inputs to [0, 1] without guessing. ``notes`` holds checksum
    outcomes worth reporting; ``options`` the reader options that shaped the result (label set,
    split seed, ...).
    """

    name: str
    num_classes: int
    class_names: tuple[str, ...]
    source: Path
    files: tuple[Path, ...]
    pixel_max: int = 255
    layout: str = IMAGE_LAYOUT
    notes: tuple[str, ...] = ()
    options: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """A complete copy of a dataset on disk.

    ``kind`` names the on-disk form (``"folder"``, ``"archive"``, ``"idx"``, ``"csv"``), ``where``
    is what to report as its location, ``files`` maps each role the reader needs to its path.
    """

    kind: str
    where: Path
    files: dict[str, Path]


@dataclass(frozen=True)
class Search:
    """The outcome of looking for a dataset: what was found (if anything), every path looked
    at (in order, ``[.gz]`` marking an optional gzip suffix), and remarks on incomplete copies."""

    found: Found | None
    looked_at: tuple[str, ...]
    partial: tuple[str, ...] = ()
