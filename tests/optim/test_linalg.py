"""Tests for structbench.optim.linalg against independent facts.

Test matrices are built from known factors (A = U diag(s) V^T with U, V orthonormal from the QR of a
Gaussian in float64), so the exact polar factor U V^T, eigenvalues and inverse roots are known
independently of the code under test; float64 torch.linalg results serve as a second reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.overrides import TorchFunctionMode

from structbench.errors import SolverError
from structbench.optim.linalg import (
    NS_CUBIC,
    NS_QUINTIC,
    bjorck_orthonormalize,
    eigh_with_retry,
    from_eigenpairs,
    inverse_root_eigh,
    inverse_root_newton,
    newton_schulz,
    polar_svd,
    power_iteration,
    randomized_range_finder,
    subspace_iteration,
    symmetrize,
    truncated_svd,
)
from tests.support.newton_schulz import gamma, ns_bound

FAST = settings(max_examples=15, deadline=None)
F64 = torch.float64
SEEDS = st.integers(min_value=0, max_value=2**31 - 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _orthonormal(batch: tuple[int, ...], n: int, k: int, gen: torch.Generator) -> Tensor:
    """(*batch, n, k) float64 with orthonormal columns: Q of the QR of a Gaussian matrix."""
    q, _ = torch.linalg.qr(torch.randn(*batch, n, k, generator=gen, dtype=F64))
    return q


def _with_spectrum(s: Tensor, m: int, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """A = U diag(s) V^T (float64) with s of shape (*batch, min(m, n)); returns (A, U, V)."""
    batch, k = tuple(s.shape[:-1]), s.size(-1)
    u = _orthonormal(batch, m, k, gen)
    v = _orthonormal(batch, n, k, gen)
    return (u * s.unsqueeze(-2)) @ v.mT, u, v


def _spd(eigenvalues: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Symmetric A = U diag(eigenvalues) U^T (float64); returns (A, U)."""
    n = eigenvalues.size(-1)
    u = _orthonormal(tuple(eigenvalues.shape[:-1]), n, n, gen)
    return symmetrize((u * eigenvalues.unsqueeze(-2)) @ u.mT), u


def _geometric(k: int, cond: float) -> Tensor:
    """k distinct values from 1 down to 1/cond, geometric (float64)."""
    return torch.logspace(0.0, -math.log10(cond), k, dtype=F64)


def _eye(n: int) -> Tensor:
    return torch.eye(n, dtype=F64)


def _orthonormality_defect(x: Tensor) -> Tensor:
    """||X^T X - I||_F for tall X, ||X X^T - I||_F for wide X (float64)."""
    x = x.to(F64)
    gram = x.mT @ x if x.size(-2) >= x.size(-1) else x @ x.mT
    return torch.linalg.matrix_norm(gram - _eye(gram.size(-1)))


def _close(actual: Tensor, expected: Tensor, atol: float, rtol: float = 0.0) -> None:
    torch.testing.assert_close(actual.to(F64), expected.to(F64), atol=atol, rtol=rtol)


# Rounding-error bounds behind the tolerances below. Unit roundoff u = 2^-24 (float32), 2^-53 (float64), 2^-8
# (bfloat16). Conventions (Higham, "Accuracy and Stability of Numerical Algorithms"): a sum or dot product of k terms
# errs by at most gamma_k = k u / (1 - k u) relative to the sum of the terms' magnitudes, so a product with inner size k
# by gamma_k |A| |B| entrywise; eigh, SVD and Householder QR of a matrix with largest side d are backward stable, with
# factors within c d u of orthonormal (2-norm) that decompose A + E exactly, ||E||_2 <= 3 c d u ||A||_2 (c d u for the
# decomposition itself and for each factor's distance from an orthonormal one). LAPACK's p(n) is "a modestly growing
# function of n": we take c d with c = C = 4 (the backward errors and orthogonality defects measured here reach about
# 2 d u). Float64 references computed in the test add O(2^-53) terms, left out of the float32 bounds. C-S below is
# Cauchy–Schwarz.
U32, U64, UBF16 = 2.0**-24, 2.0**-53, 2.0**-8
C = 4


def _factor_defect(k: int, d: int, u: float = U32) -> float:
    """Bound on ||X^T X - I||_F for an orthonormal factor with k columns (rows, if wide) of a decomposition of a matrix
    with largest side d: within c d u of orthonormal in the 2-norm, so X^T X - I <= 2 c d u + (c d u)^2 there, and the
    Frobenius norm adds sqrt(k)."""
    return math.sqrt(k) * (2 * C * d * u + (C * d * u) ** 2)


def _polar_rounding(rows: int, cols: int, u: float = U32) -> float:
    """Frobenius distance of polar_svd's U V^T from U' V'^T, the polar factor of A + E with orthonormal U', V'
    (||E||_2 <= 3 c d u ||A||_2): U and V are within c d u of U', V' (2 sqrt(r) c d u) and the r-term product rounds by
    gamma_r |U| |V|^T, whose Frobenius norm is at most r gamma_r since the rows of U and V have norm <= 1."""
    d, r = max(rows, cols), min(rows, cols)
    return 2 * math.sqrt(r) * C * d * u + r * gamma(r, u)


def _polar_bound(a: Tensor, input_error: float, u: float = U32) -> float:
    """Frobenius bound on ||polar_svd(A^) - U V^T|| for the full-rank (float64) A = U S V^T and A^ within `input_error`
    of it (Frobenius), first order: Li (1995) gives ||polar(A + E) - polar(A)||_F <= 2 ||E||_F / sigma_min(A)
    (sqrt(2) / sigma_min for m != n), applied to the input's error and the SVD's backward error (Frobenius <= sqrt(r)
    times its 2-norm bound), plus `_polar_rounding`."""
    rows, cols = a.shape[-2:]
    s = torch.linalg.svdvals(a.to(F64))
    backward = 3 * C * math.sqrt(min(rows, cols)) * max(rows, cols) * u * s[..., 0]
    return float((2 * (input_error + backward) / s[..., -1]).max()) + _polar_rounding(rows, cols, u)


# --------------------------------------------------------------------------------------------------
# polar_svd


@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (2, 3, 5, 5)])
def test_polar_svd_matches_float64_svd_and_is_orthogonal(shape: tuple[int, ...]) -> None:
    gen = _gen(0)
    *batch, m, n = shape
    s = torch.rand(*batch, min(m, n), generator=gen, dtype=F64) * 1.5 + 0.5
    a, u, v = _with_spectrum(s, m, n, gen)
    o = polar_svd(a.to(torch.float32))
    assert o.shape == a.shape and o.dtype == torch.float32
    u64, _, vh64 = torch.linalg.svd(a, full_matrices=False)
    # cond(A) <= 4 and the float32 cast moves A by <= u ||A||_F: `_polar_bound`, ~4e-5 here. A transposed or
    # unnormalised factor is off by O(1).
    atol = _polar_bound(a, U32 * float(torch.linalg.matrix_norm(a).max()))
    _close(o, u64 @ vh64, atol=atol)
    _close(o, u @ v.mT, atol=atol)
    # O^T O - I = (U'V'^T + D)^T (U'V'^T + D) - I <= 2 ||D||_F to first order, D the `_polar_rounding` part.
    assert float(_orthonormality_defect(o).max()) <= 2 * _polar_rounding(m, n)


def test_polar_svd_returns_input_dtype() -> None:
    gen = _gen(1)
    a, u, v = _with_spectrum(_geometric(4, 10.0), 6, 4, gen)
    _close(polar_svd(a), u @ v.mT, atol=_polar_bound(a, 0.0, U64))  # float64 throughout: ~3e-13; float32 would be ~1e-5
    assert polar_svd(a).dtype == F64
    assert polar_svd(a.to(torch.bfloat16)).dtype == torch.bfloat16


@FAST
@given(seed=SEEDS, m=st.integers(1, 9), n=st.integers(1, 9))
def test_polar_factor_property(seed: int, m: int, n: int) -> None:
    """For full-rank A, O is the polar factor iff O has orthonormal columns (rows) and O^T A (A O^T) is
    symmetric PSD; its eigenvalues are then A's singular values."""
    a = torch.randn(m, n, generator=_gen(seed))
    o = polar_svd(a).to(F64)
    assert float(_orthonormality_defect(o)) <= 2 * _polar_rounding(m, n)
    h = o.mT @ a.to(F64) if m >= n else a.to(F64) @ o.mT
    # O = U' V'^T + D with U' S V'^T = A + E (||E||_2 <= 3 c d u ||A||_2, ||D||_2 <= `_polar_rounding`), so
    # O^T A = V' S V'^T - V' U'^T E + D^T A: symmetric PSD up to ||E|| + ||D|| ||A|| in the 2-norm, whatever cond(A)
    # (the polar factor's own error along small singular values is multiplied by them here). Weyl moves the
    # eigenvalues of sym(H) from the singular values by no more; the asymmetry is at most twice it.
    deviation = (3 * C * max(m, n) * U32 + _polar_rounding(m, n)) * float(torch.linalg.matrix_norm(a.to(F64), ord=2))
    _close(h, h.mT, atol=2 * deviation)
    expected = torch.linalg.svdvals(a.to(F64)).flip(-1)
    _close(torch.linalg.eigvalsh(symmetrize(h)), expected, atol=deviation)


# --------------------------------------------------------------------------------------------------
# Float32 -> float64 retry for the SVD-based routines


def _svd_failing_for(dtypes: set[torch.dtype], calls: list[torch.dtype]) -> Callable[..., Any]:
    real_svd = torch.linalg.svd

    def svd(x: Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(x.dtype)
        if x.dtype in dtypes:
            raise torch.linalg.LinAlgError("simulated SVD failure")
        return real_svd(x, *args, **kwargs)

    return svd


SVD_USERS: list[Callable[[Tensor], Tensor]] = [
    polar_svd,
    lambda g: truncated_svd(g, 2)[1],
    lambda g: truncated_svd(g, 2, method="randomized", generator=_gen(0))[1],
]


@pytest.mark.parametrize("solve", SVD_USERS, ids=["polar_svd", "truncated_exact", "truncated_randomized"])
def test_svd_retries_in_float64(monkeypatch: pytest.MonkeyPatch, solve: Callable[[Tensor], Tensor]) -> None:
    a = torch.randn(5, 4, generator=_gen(2))
    expected = solve(a)
    calls: list[torch.dtype] = []
    monkeypatch.setattr(torch.linalg, "svd", _svd_failing_for({torch.float32}, calls))
    # The float32 run and the float64 retry (rounded to float32 once, u) against the exact quantity: the polar factor
    # within `_polar_bound` (the float64 part negligible); singular values within the SVD's backward error
    # 3 c d u ||A||_2 (Weyl), plus gamma_d for the sketch's products (randomized: the width-4 sketch spans range(A),
    # so only the final SVD and the products count; a basis tilted by theta changes sigma only by theta^2).
    if solve is polar_svd:
        atol = _polar_bound(a, 0.0) + U32
    else:
        atol = (3 * C * 5 * U32 + 2 * gamma(5) + 2 * U32) * float(torch.linalg.matrix_norm(a, ord=2))
    _close(solve(a), expected, atol=atol)
    assert calls == [torch.float32, F64]


@pytest.mark.parametrize("solve", SVD_USERS, ids=["polar_svd", "truncated_exact", "truncated_randomized"])
def test_svd_failure_in_both_precisions_raises_solver_error(
    monkeypatch: pytest.MonkeyPatch, solve: Callable[[Tensor], Tensor]
) -> None:
    monkeypatch.setattr(torch.linalg, "svd", _svd_failing_for({torch.float32, F64}, []))
    with pytest.raises(SolverError):
        solve(torch.randn(5, 4, generator=_gen(3)))


# --------------------------------------------------------------------------------------------------
# newton_schulz


def _normalized_input_error(shape: tuple[int, ...], u: float = U32) -> float:
    """||X0^ - X0||_F for X0 = A / ||A||_F from A cast to precision u (u ||A||_F, doubled by the normalisation), the
    norm's sum of squares (gamma_{mn} / 2 after the square root, and its root u) and the division (u): relative to
    ||X0||_F = 1."""
    return 2 * u + gamma(math.prod(shape[-2:]), u) / 2 + 2 * u


@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (6, 6), (3, 2, 6, 4)])
def test_ns_cubic_converges_to_polar_factor(shape: tuple[int, ...]) -> None:
    """Well-conditioned input (cond <= 2): the classic cubic iteration reaches U V^T to float32 accuracy."""
    gen = _gen(4)
    *batch, m, n = shape
    s = torch.rand(*batch, min(m, n), generator=gen, dtype=F64) * 0.5 + 0.5
    a, u, v = _with_spectrum(s, m, n, gen)
    o = newton_schulz(a.to(torch.float32), steps=25, coefficients=NS_CUBIC)
    assert o.shape == a.shape and o.dtype == torch.float32
    # After 25 steps the exact iterate is U V^T (error (1 - 1/4)^(2^25)); float32 rounding per `ns_bound`: converged
    # directions forget it, but the skew ones carry it with gain 1 from step to step, ~1e-4 in all. A wrong
    # coefficient or transpose leaves O(1) errors.
    s0 = s / torch.linalg.vector_norm(s, dim=-1, keepdim=True)
    atol = max(
        ns_bound(values, m, n, NS_CUBIC, 25, _normalized_input_error(shape)) for values in s0.reshape(-1, s.size(-1))
    )
    _close(o, u @ v.mT, atol=atol)


class _RecordShapes(TorchFunctionMode):
    """Records the shape of every tensor produced by a torch function."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, Tensor):
            self.shapes.append(tuple(out.shape))
        return out


@pytest.mark.parametrize("shape", [(40, 6), (6, 40)])
def test_ns_iterates_on_the_small_gram_matrix(shape: tuple[int, int]) -> None:
    g = torch.randn(*shape, generator=_gen(5))
    with _RecordShapes() as record:
        out = newton_schulz(g)
    assert out.shape == g.shape
    assert (6, 6) in record.shapes
    assert (40, 40) not in record.shapes


@pytest.mark.parametrize("kappa_a", [1.5, 2.0, 5.0, 10.0, 100.0])
def test_ns_cubic_obeys_sumo_lemma_3_2(kappa_a: float) -> None:
    """SUMO Lemma 3.2: ||NS_i(A) - U V^T||_F <= sqrt(r) (1 - 1/kappa)^(2^i), kappa = cond(A A^T) = cond(A)^2.

    Setting of the lemma's proof: classic (cubic) iteration, X0 = A / ||A||_2, m <= n, and r the largest
    index with sigma_r > sigma_{r+1} = ... = sigma_m; with distinct singular values r = m - 1.
    Computed in float64 with eps = 0 so rounding cannot mask a violation. (Not tested, because it does not
    hold: a bottom plateau of several equal small singular values, where that r undercounts the slow
    directions, nor Muon's Frobenius X0, which is not exact even at kappa = 1 where the bound is 0.)
    """
    m, n = 8, 32
    a, u, v = _with_spectrum(_geometric(m, kappa_a), m, n, _gen(6))
    kappa, r = kappa_a**2, m - 1
    for i in range(9):
        o = newton_schulz(a, steps=i, coefficients=NS_CUBIC, eps=0.0, dtype=F64, normalize="spectral")
        error = float(torch.linalg.matrix_norm(o - u @ v.mT))
        # The lemma bounds the exact iteration; float64 rounding adds `ns_bound` (u = 2^-53), the spectral norm's
        # relative error (its SVD's backward error 3 c d u, and the division's u) included as an input error: <= 2e-12.
        s0 = _geometric(m, kappa_a)
        rounding = ns_bound(s0, m, n, NS_CUBIC, i, (3 * C * n + 1) * U64 * float(s0.norm()), U64)
        assert error <= math.sqrt(r) * (1 - 1 / kappa) ** (2**i) + rounding, (i, error)


@FAST
@given(
    seed=SEEDS,
    m=st.integers(2, 8),
    extra=st.integers(0, 16),
    log_kappa_a=st.floats(0.01, 3.0),
    steps=st.integers(0, 8),
    tall=st.booleans(),
)
def test_ns_cubic_obeys_sumo_lemma_3_2_random_spectra(
    seed: int, m: int, extra: int, log_kappa_a: float, steps: int, tall: bool
) -> None:
    """As above for random distinct spectra in [1/cond(A), 1]; tall inputs use the transposed setting."""
    gen = _gen(seed)
    kappa_a = 10.0**log_kappa_a
    inner = torch.rand(m - 2, generator=gen, dtype=F64) * (1 - 1 / kappa_a) + 1 / kappa_a
    s = torch.cat([torch.tensor([1.0, 1 / kappa_a], dtype=F64), inner]).sort(descending=True).values
    a, u, v = _with_spectrum(s, m, m + extra, gen)
    exact = u @ v.mT
    if tall:
        a, exact = a.mT, exact.mT
    o = newton_schulz(a, steps=steps, coefficients=NS_CUBIC, eps=0.0, dtype=F64, normalize="spectral")
    error = float(torch.linalg.matrix_norm(o - exact))
    rounding = ns_bound(s, m, m + extra, NS_CUBIC, steps, (3 * C * (m + extra) + 1) * U64 * float(s.norm()), U64)
    assert error <= math.sqrt(m - 1) * (1 - 1 / kappa_a**2) ** (2**steps) + rounding  # rounding as above


def test_sumo_lemma_3_2_kappa_is_the_gram_condition_number() -> None:
    """A numpy check outside structbench: with one singular value 0.1 the cubic iteration leaves error ~0.34
    after 5 steps.

    That violates the bound if kappa is misread as cond(A) = 10 ((1 - 0.1)^32 = 0.034) and satisfies it
    with kappa = cond(A A^T) = 100 ((1 - 0.01)^32 = 0.725).
    """
    a = torch.diag(torch.tensor([1.0, 0.1], dtype=F64))
    o = newton_schulz(a, steps=5, coefficients=NS_CUBIC, eps=0.0, dtype=F64, normalize="spectral")
    error = float(torch.linalg.matrix_norm(o - _eye(2)))
    assert 0.30 < error < 0.38
    assert error > (1 - 1 / 10) ** 32
    assert error < (1 - 1 / 100) ** 32


@FAST
@given(
    seed=SEEDS,
    m=st.integers(1, 16),
    n=st.integers(1, 48),
    log_kappa_a=st.floats(0.0, 2.0),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_ns_quintic_singular_values_in_band(
    seed: int,
    m: int,
    n: int,
    log_kappa_a: float,
    dtype: torch.dtype,
) -> None:
    """Muon's NS5 maps singular values into ~U(0.5, 1.5) (Jordan et al. 2024); we check [0.5, 1.5].

    Precondition: cond(A) <= 100 and min(m, n) <= 16, so after Frobenius normalization every singular
    value is >= 1/(100 * 4) = 2.5e-3. Five steps of the scalar quintic map [2.5e-3, 1] into about
    [0.68, 1.21] (and only inputs below ~1.1e-3 end below 0.5; a numpy check outside structbench found [0.68, 1.13]
    for its
    spectra), so [0.5, 1.5] leaves room for bfloat16 rounding. In float32 the singular vectors are also
    preserved: polar(NS5(A)) = U V^T.
    """
    gen = _gen(seed)
    k = min(m, n)
    s = torch.rand(k, generator=gen, dtype=F64) * (1 - 10.0**-log_kappa_a) + 10.0**-log_kappa_a
    s[0], s[-1] = 1.0, 10.0**-log_kappa_a
    a, u, v = _with_spectrum(s, m, n, gen)
    o = newton_schulz(a.to(torch.float32), dtype=dtype)
    sv = torch.linalg.svdvals(o.to(F64))
    assert float(sv.min()) >= 0.5 and float(sv.max()) <= 1.5
    if dtype == torch.bfloat16:
        # (c) A bound in bfloat16 (d u ~ 0.2) says nothing here: measured instead, bfloat16 moved the singular
        # values at most 0.073 from the exact map's (600 spectra of this strategy; AVX2, SSE4.2-only and
        # MKL-compatible kernels gave the same), inside the band's margins 0.18 and 0.29 around [0.68, 1.21].
        return
    # float32: NS keeps U and V and maps the singular values s_i / (||s|| + 1e-7) (its eps) through five quintic
    # steps; rounding moves them by at most `ns_bound` (Weyl: ||dX||_2 <= ||dX||_F), <= 1.2e-2 at cond 100, and turns
    # the polar factor by <= 2 (that + the SVD's backward error) / sigma_min (`_polar_bound`, the NS error as input
    # error). Singular vectors that NS does not keep (a transposed product) are off by O(1).
    x0 = s / (s.norm() + 1e-7)
    drift = ns_bound(x0, m, n, NS_QUINTIC, 5, _normalized_input_error((m, n)))
    exact = x0.clone()
    for _ in range(5):
        exact = NS_QUINTIC[0] * exact + NS_QUINTIC[1] * exact**3 + NS_QUINTIC[2] * exact**5
    _close(sv, exact.sort(descending=True).values, atol=drift)
    _close(polar_svd(o), u @ v.mT, atol=_polar_bound((u * exact) @ v.mT, drift))


def test_ns_quintic_does_not_converge_to_polar_factor() -> None:
    """Muon's quintic (the NS5 SUMO cites) does not reach U V^T even for a perfectly conditioned input."""
    q = _orthonormal((), 16, 16, _gen(7))
    sv = torch.linalg.svdvals(newton_schulz(q.to(torch.float32), coefficients=NS_QUINTIC).to(F64))
    assert float((sv - 1).abs().max()) > 0.02


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
@pytest.mark.parametrize("shape", [(24, 24), (40, 96), (300, 70)])
def test_ns_in_bfloat16_is_torch_optim_muons_iteration_bit_for_bit(shape: tuple[int, int]) -> None:
    """torch.optim.Muon's NS (torch/optim/_muon.py): cast to bf16, divide by the bf16 Frobenius norm, then
    the fused addmm pair; ours with dtype=bfloat16 rounds at the same points. (300, 70) is tall (transposed)
    and has 21,000 entries, enough for a differently accumulated or rounded norm to show."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.randn(*shape, generator=_gen(10))
    theirs = _zeropower_via_newtonschulz(g, NS_QUINTIC, 5, 1e-7)
    assert torch.equal(newton_schulz(g, dtype=torch.bfloat16), theirs.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(9, 4), (4, 9), (2, 5, 5)])
def test_ns_does_not_mutate_input(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g = torch.randn(*shape, generator=_gen(8)).to(dtype)
    before = g.clone()
    for compute_dtype in (None, dtype):
        out = newton_schulz(g, dtype=compute_dtype)
        assert out.dtype == dtype and out.shape == g.shape
        assert torch.equal(g, before)


def test_ns_zero_input_gives_zero() -> None:
    assert torch.equal(newton_schulz(torch.zeros(3, 5)), torch.zeros(3, 5))


def test_ns_default_dtype_on_cpu_is_float32() -> None:
    g = torch.randn(6, 4, generator=_gen(9), dtype=F64)
    assert torch.equal(newton_schulz(g), newton_schulz(g, dtype=torch.float32))


def test_ns_rejects_bad_arguments() -> None:
    g = torch.randn(3, 3)
    with pytest.raises(ValueError, match="frobenius"):
        newton_schulz(g, normalize="nuclear")
    with pytest.raises(ValueError):
        newton_schulz(g, steps=-1)
    with pytest.raises(ValueError):
        newton_schulz(torch.randn(3))


# --------------------------------------------------------------------------------------------------
# eigh_with_retry


def test_eigh_with_retry_matches_known_decomposition() -> None:
    gen = _gen(10)
    lam = torch.rand(3, 8, generator=gen, dtype=F64) * 10 - 2
    a, _ = _spd(lam, gen)
    evals, evecs = eigh_with_retry(a.to(torch.float32))
    assert evals.dtype == evecs.dtype == torch.float32
    # float32 eigh of A + E0 (the cast and the symmetrisation, each <= u ||A||_F <= u sqrt(n) ||A||_2) is exact for
    # A + E0 + E1, ||E1||_2 <= c n u ||A||_2: Weyl bounds the eigenvalues' error by their sum (~2e-5 at ||A|| = 8).
    # Rebuilt from V, whose columns are within c n u of orthonormal (2 c n u ||A||), in float32 (gamma_{n+1} ||A|| per
    # entry by C-S). A lost or mis-sorted eigenvalue, or a transposed V, is off by O(1).
    n, norm = 8, float(lam.abs().max())
    backward = (2 * math.sqrt(n) + C * n) * U32 * norm
    _close(evals, lam.sort(dim=-1).values, atol=backward)
    assert bool((evals[..., 1:] >= evals[..., :-1]).all())
    assert float(_orthonormality_defect(evecs).max()) <= _factor_defect(n, n)
    _close((evecs * evals.unsqueeze(-2)) @ evecs.mT, a, atol=backward + (2 * C * n * U32 + gamma(n + 1)) * norm)


def _eigh_patched(fail: Callable[[Tensor], bool], calls: list[torch.dtype], nan: bool) -> Callable[..., Any]:
    real_eigh = torch.linalg.eigh

    def eigh(x: Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(x.dtype)
        if fail(x):
            if nan:
                evals, evecs = real_eigh(x, *args, **kwargs)
                return evals * float("nan"), evecs
            raise torch.linalg.LinAlgError("simulated eigh failure")
        return real_eigh(x, *args, **kwargs)

    return eigh


@pytest.mark.parametrize("nan", [False, True], ids=["raises", "returns_nan"])
def test_eigh_retries_in_float64(monkeypatch: pytest.MonkeyPatch, nan: bool) -> None:
    gen = _gen(11)
    lam = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)
    a, _ = _spd(lam, gen)
    calls: list[torch.dtype] = []
    monkeypatch.setattr(torch.linalg, "eigh", _eigh_patched(lambda x: x.dtype == torch.float32, calls, nan))
    evals, evecs = eigh_with_retry(a.to(torch.float32))
    assert calls == [torch.float32, F64]
    assert evals.dtype == torch.float32
    # The float64 eigh of the float32-cast A (u ||A||_F from A; its own error ~2^-53) rounded to float32 (u |lambda|,
    # and u per entry of V: ||dV||_2 <= sqrt(n) u), rebuilt in float32 (gamma_{n+1} ||A|| per entry). The float32 result
    # returned without the retry, or a NaN one, fails.
    n, norm = 4, float(lam.abs().max())
    _close(evals, lam, atol=(math.sqrt(n) + 1) * U32 * norm)
    _close((evecs * evals.unsqueeze(-2)) @ evecs.mT, a, atol=(3 * math.sqrt(n) * U32 + gamma(n + 1) + U32) * norm)


@pytest.mark.parametrize("nan", [False, True], ids=["raises", "returns_nan"])
def test_eigh_failure_in_both_precisions_raises_solver_error(
    monkeypatch: pytest.MonkeyPatch,
    nan: bool,
) -> None:
    calls: list[torch.dtype] = []
    monkeypatch.setattr(torch.linalg, "eigh", _eigh_patched(lambda x: True, calls, nan))
    with pytest.raises(SolverError):
        eigh_with_retry(torch.eye(3))
    assert calls == [torch.float32, F64]


def test_eigh_with_retry_non_finite_input_raises_solver_error() -> None:
    a = torch.eye(3)
    a[0, 0] = float("nan")
    with pytest.raises(SolverError):
        eigh_with_retry(a)


def test_eigh_with_retry_does_not_swallow_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    def eigh(x: Tensor) -> Any:
        raise torch.OutOfMemoryError("simulated out of memory")

    monkeypatch.setattr(torch.linalg, "eigh", eigh)
    with pytest.raises(torch.OutOfMemoryError):
        eigh_with_retry(torch.eye(3))


@pytest.mark.parametrize("error", [torch.AcceleratorError, RuntimeError])
@pytest.mark.parametrize("decompose", ["eigh", "svd"])
def test_a_device_error_is_never_a_solver_failure(monkeypatch: pytest.MonkeyPatch, decompose: str, error) -> None:
    """A device-side assert raised inside a decomposition (torch.AcceleratorError; a plain RuntimeError "CUDA error:
    ..." in torch before 2.8) propagates as it is: no float64 retry, no SolverError (which the optimizers count as
    solver failures)."""
    calls = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise error("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch.linalg, decompose, failing)
    with pytest.raises(error, match="device-side assert"):
        (eigh_with_retry if decompose == "eigh" else polar_svd)(torch.eye(3))
    assert len(calls) == 1


# --------------------------------------------------------------------------------------------------
# Inverse p-th roots


ROOT_METHODS = pytest.mark.parametrize(
    "method",
    [inverse_root_eigh, inverse_root_newton],
    ids=["eigh", "newton"],
)


class RootBounds(NamedTuple):
    """Float32 error bounds of an inverse p-th root R of A + ridge I against the exact one (`_root_bounds`)."""

    direction: Tensor
    """(..., n) relative error of u_i^T R u_i along each eigenvector u_i of A."""
    relative: Tensor
    """(...,) ||R - R_exact||_F / ||R_exact||_2."""
    residual: Tensor
    """(...,) ||R^p (A + ridge I) - I||_2."""


def _ridge_error(a: Tensor, lam: Tensor, eps: float, method: Callable[..., Tensor]) -> Tensor:
    """|ridge^ - eps lambda_max| for a relative ridge: Newton's lambda^ is power_iteration's (10 steps, the same call
    on the same float32 matrix; a Rayleigh quotient, <= lambda_max), eigh's the float32 eigh's top eigenvalue (Weyl:
    within the backward error of `_root_bounds`)."""
    n = lam.size(-1)
    if method is inverse_root_newton:
        estimate = power_iteration(symmetrize(a.to(torch.float32)), iters=10).to(F64).unsqueeze(-1)
        return eps * (lam.amax(-1, keepdim=True) - estimate).abs()
    return eps * (3 * math.sqrt(n) + C * n) * U32 * lam.abs().amax(-1, keepdim=True)


def _root_bounds(
    lam: Tensor, ridge: float | Tensor, p: int, method: Callable[..., Tensor], ridge_error: Tensor
) -> RootBounds:
    """First-order bounds for A = U diag(lam) U^T (lam >= 0 up to rounding, float64, batched) rooted in float32 with
    `ridge` (the exact one; the method's own is off by at most `ridge_error`).
    Backward error: the float32 cast, the symmetrisation and the ridge's addition (u ||A||_F each) and eigh
    (c n u ||A||_2) make the root exact for A + E, ||E||_2 <= (3 sqrt(n) + c n) u ||A||_2, plus the ridge's error. Along
    u_i that moves the root by (1/p) ||E|| / mu_i relative (mu = lam+ + ridge; clamping at 0 is 1-Lipschitz; first
    order, an eigenvector tilt only enters squared), and the whole root by (1/p) ||E|| / mu_min relative to ||R||_2
    (x^{-1/p}'s largest divided difference), <= sqrt(n) times that in Frobenius. Forming V diag(mu^{-1/p}) V^T: the
    sum and pow 3 u, V within c n u of orthonormal (2 c n u), the n-term products gamma_{n+1} |V| D |V|^T (C-S: <=
    gamma_{n+1} ||R||_2 per entry, n gamma_{n+1} ||R||_2 in Frobenius). Residual: R_0 = (A + E)^{-1/p} gives
    R_0^p A - I = -R_0^p E, <= ||E|| / mu_min, and a forming error D adds p ||D|| ||R||^{p-1} ||A|| = p kappa ||D|| /
    ||R||. The coupled Newton iteration is stable (Guo & Higham 2006, Sec. 3: its limiting accuracy is that of a
    backward-stable method), so the same bounds hold for it, plus its stopping rule max|M - I| <= tol (1e-6) with
    M = X^p A: ||R^p A - I|| <= n tol, and (1/p) n tol relative on the root (along u_i too). Newton does not clamp
    a negative eigenvalue -e at 0: along its u_i it differs from the clamped root by e / (p mu_i), by design."""
    n = lam.size(-1)
    mu = lam.clamp_min(0.0) + ridge
    backward = (3 * math.sqrt(n) + C * n) * U32 * lam.abs().amax(-1, keepdim=True) + ridge_error
    forming = 3 * U32 + 2 * C * n * U32 + n * gamma(n + 1)
    kappa = mu.amax(-1) / mu.amin(-1)
    newton = method is inverse_root_newton
    stop = n * 1e-6 if newton else 0.0
    roots = mu.pow(-1.0 / p)
    unclamped = (-lam).clamp_min(0.0) / (p * mu) if newton else 0.0
    direction = backward / (p * mu) + forming * roots.amax(-1, keepdim=True) / roots + stop / p + unclamped
    relative = (backward[..., 0] / (p * mu.amin(-1)) + stop / p) * math.sqrt(n) + forming
    residual = backward[..., 0] / mu.amin(-1) + p * kappa * forming + stop
    return RootBounds(direction, relative, residual)


@ROOT_METHODS
@pytest.mark.parametrize("p", [2, 4])
def test_inverse_root_matches_float64_reference(method: Callable[..., Tensor], p: int) -> None:
    """(A + 1e-6 lambda_max I)^{-1/p} from the known float64 eigendecomposition; batched input."""
    gen = _gen(12)
    lam = 10.0 ** (torch.rand(3, 12, generator=gen, dtype=F64) * 2 - 1)  # spectrum in [0.1, 10]
    a, u = _spd(lam, gen)
    ridge = 1e-6 * lam.amax(dim=-1, keepdim=True)
    expected = (u * (lam + ridge).pow(-1.0 / p).unsqueeze(-2)) @ u.mT
    r = method(a.to(torch.float32), p)
    assert r.dtype == torch.float32 and r.shape == a.shape
    # `_root_bounds` at cond <= 100: ~4e-4 relative and ~4e-3 on the residual. Newton's ridge comes from power
    # iteration (lambda^ <= lambda_max), off by 1e-6 (lambda_max - lambda^); eigh's by 1e-6 ||E|| (Weyl). A wrong
    # exponent, or a root of A without the ridge's I, misses by >= 1e-2.
    bounds = _root_bounds(lam, ridge, p, method, _ridge_error(a, lam, 1e-6, method))
    rel = torch.linalg.matrix_norm(r.to(F64) - expected) / torch.linalg.matrix_norm(expected, ord=2)
    assert bool((rel <= bounds.relative).all()), (rel, bounds.relative)
    damped = a + ridge.unsqueeze(-1) * _eye(12)
    residual = torch.linalg.matrix_norm(torch.linalg.matrix_power(r.to(F64), p) @ damped - _eye(12), ord=2)
    assert bool((residual <= bounds.residual).all()), (residual, bounds.residual)


@ROOT_METHODS
@pytest.mark.parametrize("p", [2, 4])
def test_relative_ridge_on_singular_matrix(method: Callable[..., Tensor], p: int) -> None:
    """Null directions (and slightly negative eigenvalues, clamped to 0) get (eps lambda_max)^{-1/p}."""
    eps, scale = 1e-3, 1e3
    lam = scale * torch.tensor([-1e-5, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 10.0], dtype=F64)
    a, u = _spd(lam, _gen(13))
    r = method(a.to(torch.float32), p, eps=eps)
    on_eigvecs = torch.diagonal(u.mT @ r.to(F64) @ u)
    ridge = eps * float(lam.max())
    expected = (lam.clamp_min(0.0) + ridge).pow(-1.0 / p)
    # Along each eigenvector (`_root_bounds`): ||E|| ~ 41 u 1e4 against mu >= ridge = 10, ~1.2e-3 relative at p = 2
    # (Newton, which does not clamp, adds 5e-4 along the negative eigenvalue's direction). A ridge of eps instead of
    # eps lambda_max puts the null directions off by O(1).
    bounds = _root_bounds(lam, ridge, p, method, _ridge_error(a, lam, eps, method))
    assert bool(((on_eigvecs - expected).abs() <= bounds.direction * expected).all())


def test_absolute_ridge_is_eps() -> None:
    eps = 1e-2
    lam = torch.tensor([0.0, 1.0, 100.0], dtype=F64)
    a, u = _spd(lam, _gen(14))
    expected = (lam + eps).pow(-0.5)
    # Along each eigenvector (`_root_bounds`, the ridge exact up to u): ||E|| ~ 17 u 100 against mu = 0.01 in the
    # null direction, ~5e-3 relative. A relative ridge (eps lambda_max = 1) would give 1 there instead of 10.
    for method in (inverse_root_eigh, inverse_root_newton):
        r = method(a.to(torch.float32), 2, eps=eps, relative_eps=False)
        bounds = _root_bounds(lam, eps, 2, method, torch.full((1,), U32 * eps, dtype=F64))
        on_eigvecs = torch.diagonal(u.mT @ r.to(F64) @ u)
        assert bool(((on_eigvecs - expected).abs() <= bounds.direction * expected).all()), method


@FAST
@given(
    seed=SEEDS,
    n=st.integers(1, 10),
    rank=st.integers(1, 10),
    log_c=st.floats(-3.0, 3.0),
    p=st.sampled_from([2, 4]),
    newton=st.booleans(),
)
def test_relative_ridge_makes_root_homogeneous(
    seed: int, n: int, rank: int, log_c: float, p: int, newton: bool
) -> None:
    """A relative ridge makes the root homogeneous: root(cA) = c^{-1/p} root(A).

    (cA + eps lambda_max(cA) I)^{-1/p} = c^{-1/p} (A + eps lambda_max(A) I)^{-1/p}, also for singular PSD A
    (rank < n); an absolute ridge would break it.
    """
    x = torch.randn(n, rank, generator=_gen(seed))
    a = x @ x.mT
    c = 10.0**log_c
    method = inverse_root_newton if newton else inverse_root_eigh
    r_a = method(a, p, eps=1e-4).to(F64)
    r_ca = method(c * a, p, eps=1e-4).to(F64)
    # Both roots within `_root_bounds` of the exact ones, which are exactly homogeneous (relative to ||R||_2; the
    # float32 c A adds u ||A||_F to its backward error): kappa <= 1e4 (mu_min = 1e-4 lambda_max on the null space), up
    # to ~1e-2. An absolute ridge changes the null directions' root by c^{1/p}, >= 1.4x at |log c| >= 1.
    lam = torch.linalg.eigvalsh(a.to(F64))
    bound_a = _root_bounds(lam, 1e-4 * float(lam.max()), p, method, _ridge_error(a, lam, 1e-4, method))
    lam_c = torch.linalg.eigvalsh((c * a).to(F64))
    cast = math.sqrt(n) * U32 * lam_c.abs().max().unsqueeze(-1)
    bound_c = _root_bounds(lam_c, 1e-4 * float(lam_c.max()), p, method, _ridge_error(c * a, lam_c, 1e-4, method) + cast)
    scale = float(torch.linalg.matrix_norm(r_a, ord=2))
    _close(r_ca * c ** (1.0 / p), r_a, atol=float(bound_a.relative + bound_c.relative) * scale)


def test_inverse_roots_reject_bad_p() -> None:
    a = torch.eye(2)
    with pytest.raises(ValueError):
        inverse_root_eigh(a, 0)
    for p in (0, 2.5, True):
        with pytest.raises(ValueError):
            inverse_root_newton(a, p)  # type: ignore[arg-type]


def test_inverse_root_newton_non_finite_raises_solver_error() -> None:
    a = torch.eye(3)
    a[1, 1] = float("nan")
    with pytest.raises(SolverError):
        inverse_root_newton(a, 4)


def test_power_iteration_finds_largest_eigenvalue() -> None:
    gen = _gen(15)
    lam = torch.cat([torch.rand(2, 9, generator=gen, dtype=F64) * 5, torch.full((2, 1), 10.0, dtype=F64)], -1)
    a, _ = _spd(lam, gen)
    rng_before = torch.random.get_rng_state()
    estimate = power_iteration(a.to(torch.float32), iters=40, tol=0.0)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    # lambda_2 / lambda_1 <= 1/2, so 40 steps leave (1/2)^80 tan^2 of the start's angle. The float32 cast moves
    # lambda_max by <= u ||A||_F (Weyl); the Rayleigh quotient v^T (A v) of a unit v errs by <= 2 gamma_n |v|^T |A| |v|
    # <= 2 gamma_n sqrt(n) ||A||_2, and v's norm by gamma_n (twice, squared): ~5e-6 relative. A step short of
    # convergence or a norm instead of the quotient is off by >= 1e-2.
    n = 10
    rtol = math.sqrt(n) * U32 + 2 * gamma(n) * math.sqrt(n) + 2 * gamma(n)
    _close(estimate, torch.full((2,), 10.0, dtype=F64), atol=0.0, rtol=rtol)
    assert torch.equal(estimate, power_iteration(a.to(torch.float32), iters=40, tol=0.0))


# --------------------------------------------------------------------------------------------------
# bjorck_orthonormalize


@pytest.mark.parametrize("shape", [(16, 16), (20, 6), (6, 20), (3, 10, 10)])
def test_bjorck_converges_quadratically(shape: tuple[int, ...]) -> None:
    """4-bit Shampoo Eq. 2. Per singular value s, d = s^2 - 1 maps to d' = -3d^2/4 + d^3/4, so
    ||V^T V - I||_F shrinks at least like 0.8 ||.||_F^2 once |d| <= 0.2; the limit is the polar factor."""
    gen = _gen(16)
    *batch, m, n = shape
    q = _orthonormal(tuple(batch), max(m, n), min(m, n), gen)
    q = q if m >= n else q.mT
    noise = torch.randn(*shape, generator=gen, dtype=F64)
    v = q + 1e-2 * noise / torch.linalg.matrix_norm(noise, keepdim=True)
    iterates = [bjorck_orthonormalize(v, steps=k) for k in range(6)]
    defects = [_orthonormality_defect(x) for x in iterates]
    assert float(defects[0].min()) > 1e-3
    # Björck is the cubic Newton–Schulz step on V itself: one float64 step errs by `ns_bound` with no steps left
    # (R), which moves ||X^T X - I||_F by <= 2 ||X||_2 R, and each defect, a float64 Gram matrix, by
    # gamma_m ||X||_F^2; ~3e-13 in all. A wrong coefficient leaves a defect of O(d), not O(d^2).
    for x, before, after in zip(iterates, defects, defects[1:], strict=False):
        singular = torch.linalg.svdvals(x).reshape(-1, min(m, n))
        step = max(ns_bound(values, m, n, NS_CUBIC, 1, 0.0, U64) for values in singular)
        slack = 2 * float(singular.max()) * step + 2 * gamma(max(m, n), U64) * float(singular.square().sum(-1).max())
        assert bool((after <= 0.8 * before**2 + slack).all())
    u, _, vh = torch.linalg.svd(v, full_matrices=False)
    # Five steps from a defect <= 2e-2 reach U V^T to (0.8 d)^32 / 0.8, nothing; float64 rounding carried along the
    # skew directions with gain 1 (`ns_bound`) and the reference SVD's polar factor (`_polar_rounding` and its
    # backward error, ~1e-14): a few 1e-13.
    singular = torch.linalg.svdvals(v).reshape(-1, min(m, n))
    atol = max(ns_bound(values, m, n, NS_CUBIC, 5, 0.0, U64) for values in singular)
    kappa = float(singular.max() / singular.min())
    atol += _polar_rounding(m, n, U64) + 6 * C * math.sqrt(min(m, n)) * max(m, n) * U64 * kappa
    _close(iterates[5], u @ vh, atol=atol)


def test_bjorck_keeps_input_dtype() -> None:
    v = torch.eye(4, dtype=torch.bfloat16) * 1.01
    out = bjorck_orthonormalize(v, steps=2)
    assert out.dtype == torch.bfloat16
    # Two float32 steps take s = 1.0078125 (1.01 in bfloat16) to f(f(s)), f(s) = 1.5 s - 0.5 s^3, a few float32 ulps
    # aside, then one rounding to bfloat16 (half an ulp below 1: 2^-9). Returning V unchanged is off by 7.8e-3.
    s0 = float(v[0, 0])
    twice = 1.5 * (1.5 * s0 - 0.5 * s0**3) - 0.5 * (1.5 * s0 - 0.5 * s0**3) ** 3
    _close(out, torch.eye(4), atol=abs(twice - 1) + 4 * U32 + UBF16 / 2)


# --------------------------------------------------------------------------------------------------
# subspace_iteration


def test_subspace_iteration_converges_to_top_eigenspace() -> None:
    """Top-3 eigenvalues 10, 9, 8 above a bulk in [0.1, 1]: the error contracts by ~1/8 per iteration."""
    gen = _gen(17)
    bulk = torch.rand(2, 17, generator=gen, dtype=F64) * 0.9 + 0.1
    lam = torch.cat([torch.tensor([10.0, 9.0, 8.0], dtype=F64).expand(2, 3), bulk], dim=-1)
    a, u = _spd(lam, gen)
    top = u[..., :3] @ u[..., :3].mT
    q0 = torch.randn(2, 20, 3, generator=gen).to(torch.float32)
    errors = []
    for iters in (1, 4, 15):
        q = subspace_iteration(a.to(torch.float32), q0, iters=iters)
        assert q.shape == (2, 20, 3) and q.dtype == torch.float32
        assert float(_orthonormality_defect(q).max()) <= _factor_defect(3, 20)
        errors.append(float(torch.linalg.matrix_norm(q.to(F64) @ q.to(F64).mT - top).max()))
    assert errors[0] > errors[1] > errors[2]
    # Each float32 step is the exact one for A + E_k: the cast (u ||A||_F), the product (gamma_n sqrt(n) ||A||_2) and
    # the QR's backward error (c n u ||A||_2); its top-3 space is within ||E|| / gap (Davis–Kahan, gap = 8 - 1), and the
    # iteration contracts the rest by lambda_4 / lambda_3 <= 1/8 per step (a geometric sum: / (1 - 1/8)), leaving
    # (1/8)^15 tan(theta_0) of the start. ||Q Q^T - P||_F <= sqrt(2 k) sin(theta) + 2 sqrt(k) c n u (k = 3). ~6e-5,
    # while 4 steps leave >= 1e-4 (checked just above) and a basis of the bottom space is off by O(1).
    n, k, norm = 20, 3, 10.0
    perturbation = (math.sqrt(n) * U32 + gamma(n) * math.sqrt(n) + C * n * U32) * norm / (8.0 - 1.0) / (1 - 1 / 8)
    start = u[..., :, k:].mT @ q0.to(F64) @ torch.linalg.inv(u[..., :, :k].mT @ q0.to(F64))
    tangent = float(torch.linalg.matrix_norm(start, ord=2).max())
    bound = math.sqrt(2 * k) * (perturbation + (1 / 8) ** 15 * tangent) + 2 * math.sqrt(k) * C * n * U32
    assert errors[2] <= bound


def test_subspace_iteration_sign_convention() -> None:
    """One step is the reduced QR A Q0 = Q R with diag(R) >= 0, so R = Q^T A Q0 is upper triangular."""
    gen = _gen(18)
    a, _ = _spd(torch.rand(8, generator=gen, dtype=F64) + 0.5, gen)
    q0 = torch.randn(8, 3, generator=gen, dtype=F64)
    q = subspace_iteration(a, q0, iters=1)
    r = q.mT @ a @ q0
    # float64: the QR of Y = A Q0 is exact for Y + E with Q' within c n u of q (||E||, c n u ||Y||_2), so
    # q^T Y = R' + (q - Q')^T Q' R' - Q'^T E: its strict lower part <= 2 c n u ||Y||_2, plus q^T Y's own rounding
    # gamma_n sqrt(n) ||Y||_2; q R adds as much again (~1e-14). A sign flip of a column makes diag(R) negative, a
    # basis of another space leaves the lower part O(1).
    y = float(torch.linalg.matrix_norm(a @ q0, ord=2))
    atol = (2 * C * 8 * U64 + gamma(8, U64) * math.sqrt(8)) * y
    _close(torch.tril(r, diagonal=-1), torch.zeros(3, 3), atol=atol)
    assert bool((torch.diagonal(r) > 0).all())
    _close(q @ r, a @ q0, atol=2 * atol)


# --------------------------------------------------------------------------------------------------
# randomized_range_finder and truncated_svd


def _low_rank(batch: tuple[int, ...], m: int, n: int, rank: int, seed: int) -> tuple[Tensor, Tensor]:
    gen = _gen(seed)
    s = torch.rand(*batch, rank, generator=gen, dtype=F64).sort(dim=-1, descending=True).values + 0.5
    u = _orthonormal(batch, m, rank, gen)
    v = _orthonormal(batch, n, rank, gen)
    return (u * s.unsqueeze(-2)) @ v.mT, s


def _sketch_residual(g: Tensor, width: int, sketch: Tensor | None, cut_back: bool) -> float:
    """Bound on ||(I - Q Q^T) G||_2 / ||G||_2 for the float32 basis Q of range(G W) of an exactly rank-r G (float64,
    batched) from the last sketch W (n x w, w = `width`): `sketch`, or None for a power step's orthonormal W, whose
    range holds range(G^T) up to the previous step's small error, so sigma_min(V^T W) >= 1/2 (V: G's right singular
    vectors). Q spans G W + E exactly, E = the cast of G (u ||G||_F ||W||), the product (gamma_n || |G| |W| ||_2 <=
    gamma_n sqrt(r w) ||G||_2 ||W||_2) and the QR's backward error (c m u ||G W||); as G = G W (V^T W)^+ V^T,
    ||(I - Q'Q'^T) G|| <= ||E|| / sigma_min(V^T W), and Q is within c m u of Q' (2 c m u). Cutting a wider basis back
    to rank r (the top-r left singular vectors of Q^T G, gap ~ sigma_r(G)) tilts it by 3 c n u kappa(G) (Davis–Kahan
    on the small SVD's backward error) and the product Q U_r adds gamma_w."""
    *_, m, n = g.shape
    right = torch.linalg.svd(g, full_matrices=False)[2]
    s = torch.linalg.svdvals(g)
    rank = int((s[..., 0:1] * 1e-12 < s).sum(-1).max())
    right = right[..., :rank, :]
    if sketch is None:
        w_norm, overlap = 1.0 + C * n * U32, 0.5
    else:
        w_norm = float(torch.linalg.matrix_norm(sketch.to(F64), ord=2).max())
        overlap = float(torch.linalg.svdvals(right @ sketch.to(F64))[..., -1].min())
    error = (U32 * math.sqrt(rank) + gamma(n) * math.sqrt(rank * width) + C * m * U32) * w_norm / overlap
    error += 2 * C * m * U32
    if cut_back:
        error += 3 * C * n * U32 * float((s[..., 0] / s[..., rank - 1]).max()) + gamma(width)
    return error


@pytest.mark.parametrize(("oversample", "power_iters"), [(0, 0), (5, 0), (0, 2), (5, 2)])
def test_range_finder_captures_exact_low_rank(oversample: int, power_iters: int) -> None:
    g, _ = _low_rank((2,), 40, 30, 5, seed=19)
    g32 = g.to(torch.float32)
    q = randomized_range_finder(g32, 5, oversample=oversample, power_iters=power_iters, generator=_gen(0))
    assert q.shape == (2, 40, 5) and q.dtype == torch.float32
    assert float(_orthonormality_defect(q).max()) <= _factor_defect(5, 40) + 2 * gamma(5)  # + the cut-back product
    q = q.to(F64)
    # `_sketch_residual`: without power steps the Gaussian sketch is the generator's first draw (the range finder is
    # deterministic given it), whose overlap with G's row space sets the bound; 1e-4 .. 1e-2. The residual has rank
    # <= 5, so its Frobenius norm is <= sqrt(5) times. A basis of a wrong space leaves O(1).
    sketch = None if power_iters else torch.randn(2, 30, 5 + oversample, generator=_gen(0))
    bound = math.sqrt(5) * _sketch_residual(g, 5 + oversample, sketch, cut_back=oversample > 0)
    residual = torch.linalg.matrix_norm(g - q @ (q.mT @ g)) / torch.linalg.matrix_norm(g, ord=2)
    assert float(residual.max()) <= bound


def test_range_finder_is_deterministic_given_generator() -> None:
    g = _low_rank((), 30, 20, 4, seed=20)[0].to(torch.float32)
    first = randomized_range_finder(g, 4, oversample=2, power_iters=1, generator=_gen(7))
    again = randomized_range_finder(g, 4, oversample=2, power_iters=1, generator=_gen(7))
    other = randomized_range_finder(g, 4, oversample=2, power_iters=1, generator=_gen(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # Each basis spans range(G) up to sin(theta) <= kappa(G) `_sketch_residual` (G exactly rank 4, both 4-dim), and
    # Q Q^T is a projector up to 2 c m u: the two projectors differ by twice that (~2e-4). A basis of another space:
    # O(1).
    g64 = g.to(F64)
    s = torch.linalg.svdvals(g64)
    sine = float(s[0] / s[3]) * _sketch_residual(g64, 6, None, cut_back=True)
    _close(first @ first.mT, other @ other.mT, atol=2 * (sine + 2 * C * 30 * U32))


def test_range_finder_meets_halko_martinsson_tropp_bound() -> None:
    """Halko–Martinsson–Tropp (2011, §1.5) tail bound, applied to (G G^T)^q G for q power steps: except
    with probability 6 p^-p, ||(I - QQ^T) G||_2 <= (1 + 11 sqrt(k + p) sqrt(min(m, n)))^(1/(2q+1)) s_{k+1}.
    Cutting the sketch back to rank k adds at most s_{k+1}: ||G - Q [Q^T G]_k|| <= s_{k+1} +
    ||(I - QQ^T) G||. Eckart–Young gives the lower bound s_{k+1}."""
    m, n, k, p, q = 40, 30, 5, 5, 2
    s = 1.0 / torch.arange(1, n + 1, dtype=F64)
    g, _, _ = _with_spectrum(s, m, n, _gen(21))
    basis = randomized_range_finder(g.to(torch.float32), k, oversample=p, power_iters=q, generator=_gen(1))
    basis = basis.to(F64)
    error = float(torch.linalg.matrix_norm(g - basis @ (basis.mT @ g), ord=2))
    factor = (1 + 11 * math.sqrt(k + p) * math.sqrt(min(m, n))) ** (1 / (2 * q + 1))
    sigma = float(s[k])
    # Eckart–Young holds for an exactly orthonormal Q'; the float32 basis is within c m u of one, which can lower the
    # residual by <= 2 c m u ||G||_2 (2e-5 against s_6 = 1/6). The upper bound's margin (~2.6 s_6) dwarfs rounding.
    assert sigma - 2 * C * m * U32 * float(s[0]) <= error <= (1 + factor) * sigma


def test_truncated_svd_exact_matches_known_factors() -> None:
    """Known distinct spectrum: S is its top-r part; the residual is Eckart–Young's sqrt(sum tail s^2)."""
    gen = _gen(22)
    s = torch.rand(2, 20, generator=gen, dtype=F64).sort(dim=-1, descending=True).values + 0.1
    g, _, _ = _with_spectrum(s, 25, 20, gen)
    u, sv, vh = truncated_svd(g.to(torch.float32), 6)
    assert u.shape == (2, 25, 6) and sv.shape == (2, 6) and vh.shape == (2, 6, 20)
    # Weyl: the float32 SVD is exact for G + E0 + E, E0 the cast (u ||G||_F <= u sqrt(20) ||G||_2), ||E|| <= c d u
    # ||G|| (d = 25; ~7e-6). The truncation U S V^T is then the best rank-6 approximation of G + E0 + E' (E' with the
    # factors' distance from orthonormal, 3 c d u ||G||), and the tail norm is 1-Lipschitz (Mirsky): the residual is
    # the tail's to 2 ||E0 + E'||_F, <= 2 (u ||G||_F + sqrt(20) 3 c d u ||G||_2). A wrong rank or order: off by O(0.1).
    norm, d = float(s.max()), 25
    _close(sv, s[..., :6], atol=(C * d + math.sqrt(20)) * U32 * norm)
    assert float(_orthonormality_defect(u).max()) <= _factor_defect(6, d)
    assert float(_orthonormality_defect(vh).max()) <= _factor_defect(6, d)
    approx = (u.to(F64) * sv.to(F64).unsqueeze(-2)) @ vh.to(F64)
    atol = 2 * (math.sqrt(20) * U32 + math.sqrt(20) * 3 * C * d * U32) * norm
    _close(torch.linalg.matrix_norm(g - approx), s[..., 6:].square().sum(-1).sqrt(), atol=atol)


def test_truncated_svd_randomized_recovers_exact_low_rank() -> None:
    g, s = _low_rank((2,), 50, 40, 5, seed=23)
    g32 = g.to(torch.float32)
    u, sv, vh = truncated_svd(g32, 5, method="randomized", generator=_gen(3))
    assert u.shape == (2, 50, 5) and sv.shape == (2, 5) and vh.shape == (2, 5, 40)
    # Two power steps, width 10: Q spans range(G) to `_sketch_residual` (eps); sigma_i(Q^T G) is within eps ||G|| of
    # sigma_i(G) (Q Q^T G and (I - Q Q^T) G split G), Q's distance from orthonormal adds c m u, the product gamma_m
    # sqrt(10) and the small SVD's backward error c n u (all times ||G||_2). U S V^T = Q [Q^T G + E]_5 leaves the
    # residual (I - Q Q^T) G and the small matrix's tail and E: (2 eps + 6 c n u) ||G||_2, rank <= 10 (sqrt(10) in
    # Frobenius). A wrong rank, or singular values of the sketch instead of Q^T G, are off by O(1).
    norm, eps = float(s.max()), _sketch_residual(g, 10, None, cut_back=False)
    _close(sv, s, atol=(eps + C * 50 * U32 + gamma(50) * math.sqrt(10) + C * 40 * U32) * norm)
    approx = (u.to(F64) * sv.to(F64).unsqueeze(-2)) @ vh.to(F64)
    residual = torch.linalg.matrix_norm(g - approx) / torch.linalg.matrix_norm(g, ord=2)
    assert float(residual.max()) <= math.sqrt(10) * (2 * eps + 6 * C * 40 * U32)
    again = truncated_svd(g32, 5, method="randomized", generator=_gen(3))
    assert all(torch.equal(x, y) for x, y in zip((u, sv, vh), again, strict=True))


def test_truncated_svd_rejects_unknown_method() -> None:
    with pytest.raises(ValueError, match=r"exact.*randomized"):
        truncated_svd(torch.randn(4, 3), 2, method="lanczos")


@pytest.mark.parametrize("rank", [0, 4])
def test_rank_out_of_range_raises(rank: int) -> None:
    g = torch.randn(5, 3)
    with pytest.raises(ValueError, match="rank"):
        truncated_svd(g, rank)
    with pytest.raises(ValueError, match="rank"):
        randomized_range_finder(g, rank)


def test_symmetrize() -> None:
    a = torch.randn(2, 4, 4, generator=_gen(24))
    s = symmetrize(a)
    assert torch.equal(s, s.mT)  # exact: fl(a + b) = fl(b + a), and halving is exact
    # (a+b)(1+d1)/2 + (a-b)(1+d2)/2 rounded once more: <= u max(|a|, |b|) + u |a| (1 + u) <= gamma_2 max|A|. A
    # transposed or unhalved sum is off by O(1).
    _close(s + (a - a.mT) / 2, a, atol=gamma(2) * float(a.abs().max()))


def test_float64_input_is_solved_in_float64() -> None:
    """An ill-conditioned float64 matrix keeps float64 accuracy (no float32 round trip)."""
    gen = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(12, 12, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(30, 12, generator=gen, dtype=torch.float64))
    s = torch.logspace(0, -6, 12, dtype=torch.float64)
    a = (u * s) @ v.T
    # `_polar_bound` in float64 at cond 1e6: ~3e-7; a float32 round trip is off by ~u cond ~ 6e-2.
    assert torch.allclose(polar_svd(a), u @ v.T, atol=_polar_bound(a, 0.0, U64), rtol=0)


def test_polar_svd_of_a_rank_deficient_matrix_is_the_compact_factor() -> None:
    """Rank 2 in 6x9: U_2 V_2^T, whose singular values are 1, 1 and then exactly 0."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(6, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, 9, generator=gen, dtype=torch.float64)
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    p = polar_svd(a)
    # The same float64 SVD of the same matrix (bit-identical factors); polar_svd multiplies the masked factors with
    # inner size 6, the test with 2: gamma_6 + gamma_2 by C-S (rows of U, V of norm <= 1). Its singular values are
    # U_2 V_2^T's, within 2 c d u (U, V within c d u of orthonormal, d = 9) and that product rounding of 1 or 0, and
    # svdvals' backward error adds c d u. A kept third direction puts a 1 where 0 is expected.
    d = 9
    assert torch.allclose(p, u[:, :2] @ vh[:2], atol=gamma(6, U64) + gamma(2, U64), rtol=0)
    atol = 3 * C * d * U64 + gamma(6, U64) + gamma(2, U64)
    expected = torch.tensor([1.0, 1, 0, 0, 0, 0], dtype=torch.float64)
    assert torch.allclose(torch.linalg.svdvals(p), expected, atol=atol, rtol=0)
    assert torch.equal(polar_svd(torch.zeros(3, 4)), torch.zeros(3, 4))


def test_from_eigenpairs_rebuilds_the_matrix_and_its_functions() -> None:
    """For symmetric positive definite A = X X^T + I with float64 eigh (lambda, V): V diag(lambda) V^T is A,
    V diag(1/lambda) V^T is A^{-1} and V diag(sqrt lambda) V^T squares to A; over a batch and for one matrix."""
    x = torch.randn(3, 5, 5, generator=_gen(31), dtype=F64)
    a = x @ x.mT + _eye(5)
    evals, evecs = torch.linalg.eigh(a)
    # float64 eigh is exact for A + E (||E||_2 <= c n u ||A||), V within c n u of orthonormal: V f(L) V^T is f(A + E)
    # up to 2 c n u ||f(L)|| and the products' gamma_{n+1} ||f(L)|| per entry (C-S), f's own rounding u ||f(L)||. Then
    # f = id: (3 c n u + gamma_{n+1}) ||A||; f = 1/x: (A + E)^{-1} A - I = -(A + E)^{-1} E, kappa c n u, and the
    # forming and the product with A add kappa (2 c n u + gamma_{n+1} + u + gamma_n); f = sqrt: squared, (3 c n u +
    # 2 (2 c n u + gamma_{n+1} + u) + gamma_n) ||A||. ~1e-13. A wrong order of V or f(L) is off by O(1).
    n, norm = 5, float(evals.max())
    kappa = float((evals[..., -1] / evals[..., 0]).max())
    _close(from_eigenpairs(evals, evecs), a, atol=(3 * C * n * U64 + gamma(n + 1, U64)) * norm)
    inverse = kappa * (3 * C * n * U64 + gamma(n + 1, U64) + U64 + gamma(n, U64))
    _close(from_eigenpairs(evals.reciprocal(), evecs) @ a, _eye(5).expand(3, 5, 5), atol=inverse)
    root = from_eigenpairs(evals.sqrt(), evecs)
    _close(root @ root, a, atol=(7 * C * n * U64 + 2 * gamma(n + 1, U64) + 2 * U64 + gamma(n, U64)) * norm)
    _close(from_eigenpairs(evals[0], evecs[0]), a[0], atol=(3 * C * n * U64 + gamma(n + 1, U64)) * norm)
