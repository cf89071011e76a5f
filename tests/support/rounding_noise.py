"""Perturbations standing in for float32 rounding, for the float64 transcriptions of the authors' code
(tests/optim/test_*_authors_code.py): a transcription rerun under them gives the spread that float32 rounding alone can
make, from which those tests set their tolerances."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

F64 = torch.float64
U32 = 2.0**-24


@dataclass
class Noise:
    """Perturbations standing in for float32 rounding: symmetric statistics before a decomposition or root, gradients
    on entry."""

    seed: int
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed)

    def statistic(self, s: Tensor) -> Tensor:
        """s + a random symmetric matrix of spectral norm d u ||s||_2, d its size (a float32 eigh's or QR's backward
        error)."""
        d = s.size(0)
        e = torch.randn(d, d, generator=self.generator, dtype=F64)
        e = e + e.T
        scale = d * U32 * float(torch.linalg.matrix_norm(s, ord=2)) / float(torch.linalg.matrix_norm(e, ord=2))
        return s + scale * e

    def gradient(self, g: Tensor) -> Tensor:
        """g with each entry moved by k u |g| in a random direction, k the larger side (a rotation's rounding)."""
        signs = torch.randint(0, 2, g.shape, generator=self.generator, dtype=F64) * 2 - 1
        return g * (1 + max(g.shape) * U32 * signs)
