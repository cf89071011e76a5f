"""The accuracy of linalg.cholesky_qr2's Q, bounded from the CholeskyQR2 theorem and QR's perturbation bound."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def unit_columns(x: Tensor) -> Tensor:
    """X D^{-1}, D its column norms, in float64: the matrix cholesky_qr2 factors, with the same Q as X."""
    x = x.double()
    return x / torch.linalg.vector_norm(x, dim=-2, keepdim=True)


def cholesky_qr2_q_error(x: Tensor, u: float) -> float:
    """A bound on ||Q_hat - Q(X)||_F for cholesky_qr2's Q_hat of one (m, n) X computed with unit roundoff u, Q(X) the
    exact Q with diag(R) > 0.

    The columns are scaled to unit norm first: X~ = fl(X D^{-1}) = X D^{-1} + E, |E| <= u |X D^{-1}|, with Q(X D^{-1})
    = Q(X). Yamamoto, Nakatsukasa, Yanagisawa & Fukaya (2015), for 8 kappa(X~) sqrt(b) <= 1 with b = m n u +
    n (n + 1) u: ||Q_hat^T Q_hat - I||_F <= w = 6 b and Q_hat R_hat = X~ + F, ||F||_F <= 5 n^2 sqrt(n) u ||X~||_2,
    R_hat upper triangular with a positive diagonal. The polar factor P of Q_hat is within w of it in the Frobenius
    norm (|s - 1| <= |s^2 - 1| for each singular value s), and P R_hat = X D^{-1} + E + F + (P - Q_hat) R_hat is a QR
    factorisation with diag(R_hat) > 0, so P = Q(X D^{-1} + dX), ||dX||_F <= e = ||E||_F + ||F||_F + w ||R_hat||_2,
    ||R_hat||_2 <= ||X~ + F||_2 / sqrt(1 - w). Sun's QR perturbation bound (1991): ||P - Q(X)||_F <= sqrt(2) a e /
    (1 - a e), a = ||(X D^{-1})^{-1}||_2. Raises ValueError where the theorem's condition fails.
    """
    m, n = x.shape
    scaled = unit_columns(x)
    values = torch.linalg.svdvals(scaled)
    scaling = u * float(torch.linalg.matrix_norm(scaled))
    largest, smallest = float(values[0]) + scaling, float(values[-1]) - scaling
    b = m * n * u + n * (n + 1) * u
    if not smallest > 0 or 8 * largest / smallest * math.sqrt(b) > 1:
        raise ValueError(f"CholeskyQR2's theorem needs 8 kappa sqrt(b) <= 1; kappa = {largest / smallest:.3g}")
    w = 6 * b
    residual = 5 * n**2 * math.sqrt(n) * u * largest
    e = scaling + residual + w * (largest + residual) / math.sqrt(1 - w)
    a = 1 / float(values[-1])
    if not a * e < 1:
        raise ValueError("Sun's bound needs ||X^-1|| ||dX|| < 1")
    return w + math.sqrt(2) * a * e / (1 - a * e)
