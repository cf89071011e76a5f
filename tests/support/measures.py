"""Measures of models and tensors that several tests compare."""

from __future__ import annotations

import torch
from torch import nn


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in the Frobenius norm."""
    return float(torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b))
