"""linalg.cholesky_qr2 against float64 Householder QR (diag(R) > 0), and its Householder fallback.

Inputs are float32 numbers; the reference is the float64 QR of the same numbers with their columns scaled to unit
norm (the same Q), whose own error, about sqrt(2) kappa 4 n sqrt(n) 2^-53 (Sun's bound over Householder's backward
error, LAPACK's p(n) taken as 4 n as in test_linalg) with kappa < 100 here, is below 1e-11 and added to the bound.
"""

from __future__ import annotations

import math

import pytest
import torch

from structbench.optim.linalg import _qr_positive, cholesky_qr2, cholesky_qr2_tolerance
from tests.support.cholesky_qr import cholesky_qr2_q_error, unit_columns

U32 = 2.0**-24
U64 = 2.0**-53


def _orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q


def _with_singular_values(m: int, values: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """U diag(values) V^T (m, n), rounded to float32."""
    n = values.numel()
    return (_orthogonal(m, gen)[:, :n] * values) @ _orthogonal(n, gen).T


def _reference_error(x: torch.Tensor) -> float:
    scaled = unit_columns(x)
    n = x.size(-1)
    values = torch.linalg.svdvals(scaled)
    return math.sqrt(2) * float(values[0] / values[-1]) * 4 * n * math.sqrt(n) * U64


def _stack(m: int, n: int) -> torch.Tensor:
    """Three float32 matrices: kappa 4; the same times columns scaled over 1e-6..1 (kappa about 1e7, unit columns
    still well conditioned); and kappa 4 with columns of sizes 1e-20 and 1e15 (their squares would leave float32's
    range without the unit-column scaling)."""
    gen = torch.Generator().manual_seed(0)
    well = _with_singular_values(m, torch.linspace(1.0, 0.25, n, dtype=torch.float64), gen)
    scaled = well @ torch.diag(torch.logspace(0, -6, n, dtype=torch.float64))
    extreme = well @ torch.diag(torch.tensor([1e-20, 1e15] * (n // 2), dtype=torch.float64))
    return torch.stack([well, scaled, extreme]).float()


@pytest.mark.parametrize(("m", "n"), [(16, 16), (24, 8)])
def test_q_matches_float64_qr_within_the_choleskyqr2_bound_with_no_fallback(m, n):
    """Each Q within cholesky_qr2_q_error (the theorem's orthogonality and residual, carried by Sun's bound; about
    1e-2 at kappa 4) of float64's Q with diag(R) > 0: a column of the wrong sign or order is off by >= sqrt(2) in
    the Frobenius norm; without the unit-column scaling the third matrix's Gram leaves float32's range and it would
    fall back."""
    x = _stack(m, n)
    result = cholesky_qr2(x)
    assert result.fallbacks == ()
    assert result.q.dtype == torch.float32 and result.q.shape == x.shape
    for q, matrix in zip(result.q, x, strict=True):
        expected, _ = _qr_positive(unit_columns(matrix))
        bound = cholesky_qr2_q_error(matrix.double(), U32) + _reference_error(matrix)
        assert float(torch.linalg.matrix_norm(q.double() - expected)) <= bound


def test_float64_input_is_factored_in_float64():
    """The same bound with u = 2^-53 (about 1e-11 here): a float32 computation would miss it by 1e5."""
    x = _stack(16, 16)[0].double()
    result = cholesky_qr2(x)
    expected, _ = _qr_positive(unit_columns(x))
    assert result.q.dtype == torch.float64
    bound = cholesky_qr2_q_error(x, U64) + _reference_error(x)
    assert float(torch.linalg.matrix_norm(result.q - expected)) <= bound


def test_a_failed_check_falls_back_to_householder_for_that_matrix_only():
    """A matrix with a zero row has rank <= n - 1, and so has the Q of any Cholesky pass over it (a zero row stays
    zero through X R^{-1}): ||Q^T Q - I||_F >= 1 (an eigenvalue 0), far above the tolerance, or its Cholesky fails.
    Either way that matrix, and only it, takes Householder QR (bitwise the same as _qr_positive's on it); a
    non-finite matrix falls back too."""
    x = _stack(16, 16)
    x[1, 3] = 0.0
    x[2, 0, 0] = float("nan")
    result = cholesky_qr2(x)
    assert result.fallbacks == (1, 2)
    assert torch.equal(result.q[1], _qr_positive(x[1:2])[0][0])
    expected, _ = _qr_positive(unit_columns(x[0]))
    bound = cholesky_qr2_q_error(x[0].double(), U32) + _reference_error(x[0])
    assert float(torch.linalg.matrix_norm(result.q[0].double() - expected)) <= bound
    assert cholesky_qr2_tolerance(16, 16, torch.float32) < 1


def test_a_zero_tolerance_sends_every_matrix_to_householder_and_batches_keep_their_shape():
    x = _stack(16, 16).reshape(3, 1, 16, 16)
    result = cholesky_qr2(x, tol=0.0)
    assert result.fallbacks == (0, 1, 2)
    assert result.q.shape == x.shape
    assert torch.equal(result.q, _qr_positive(x.reshape(3, 16, 16))[0].reshape(x.shape))
    with pytest.raises(ValueError, match="rows"):
        cholesky_qr2(torch.ones(3, 4))
