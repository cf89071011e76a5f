"""Random SPD matrices with a prescribed spectrum, for problems whose conditioning is known exactly."""

from __future__ import annotations

import math

import torch

from structbench.errors import UsageError

SPECTRA = ("geometric", "linear", "power")


def eigenvalues(size: int, cond: float, spectrum: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """`size` eigenvalues in [1/cond, 1] (largest first) with condition number exactly `cond`.

    geometric: log-uniformly spaced; linear: uniformly spaced; power: lambda_i proportional to
    i^(-a) with a chosen so that lambda_1 / lambda_size = cond (a decaying spectrum).
    """
    if cond < 1:
        raise UsageError(f"condition number must be >= 1, got {cond}.")
    if size == 1:
        return torch.ones(1, dtype=dtype)
    if spectrum == "geometric":
        return torch.logspace(0.0, -math.log10(cond), size, dtype=dtype)
    if spectrum == "linear":
        return torch.linspace(1.0, 1.0 / cond, size, dtype=dtype)
    if spectrum == "power":
        index = torch.arange(1, size + 1, dtype=dtype)
        return index.pow(-math.log(cond) / math.log(size))
    raise UsageError(f"unknown spectrum {spectrum!r}; valid: {', '.join(SPECTRA)}.")


def random_orthogonal(size: int, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A Haar-distributed orthogonal matrix (QR of a Gaussian matrix with the sign of diag(R) fixed)."""
    gaussian = torch.randn(size, size, generator=generator, dtype=dtype)
    q, r = torch.linalg.qr(gaussian)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def random_spd(
    size: int, cond: float, spectrum: str, generator: torch.Generator, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Q diag(lambda) Q^T with random orthogonal Q and the spectrum of `eigenvalues`."""
    q = random_orthogonal(size, generator, dtype)
    return (q * eigenvalues(size, cond, spectrum, dtype)) @ q.T
