"""Tests for structbench.optim.linalg against independent facts.

Test matrices are built from known factors (A = U diag(s) V^T with U, V orthonormal from the QR of a
Gaussian in float64), so the exact polar factor U V^T, eigenvalues and inverse roots are known
independently of the code under test; float64 torch.linalg results serve as a second reference.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

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
    _close(o, u64 @ vh64, atol=1e-5)
    _close(o, u @ v.mT, atol=1e-5)
    assert float(_orthonormality_defect(o).max()) < 1e-5


def test_polar_svd_returns_input_dtype() -> None:
    gen = _gen(1)
    a, u, v = _with_spectrum(_geometric(4, 10.0), 6, 4, gen)
    _close(polar_svd(a), u @ v.mT, atol=1e-5)
    assert polar_svd(a).dtype == F64
    assert polar_svd(a.to(torch.bfloat16)).dtype == torch.bfloat16


@FAST
@given(seed=SEEDS, m=st.integers(1, 9), n=st.integers(1, 9))
def test_polar_factor_property(seed: int, m: int, n: int) -> None:
    """For full-rank A, O is the polar factor iff O has orthonormal columns (rows) and O^T A (A O^T) is
    symmetric PSD; its eigenvalues are then A's singular values."""
    a = torch.randn(m, n, generator=_gen(seed))
    o = polar_svd(a).to(F64)
    assert float(_orthonormality_defect(o)) < 1e-5
    h = o.mT @ a.to(F64) if m >= n else a.to(F64) @ o.mT
    _close(h, h.mT, atol=1e-5)
    expected = torch.linalg.svdvals(a.to(F64)).flip(-1)
    _close(torch.linalg.eigvalsh(symmetrize(h)), expected, atol=1e-5)


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
    _close(solve(a), expected, atol=1e-5)
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


@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (6, 6), (3, 2, 6, 4)])
def test_ns_cubic_converges_to_polar_factor(shape: tuple[int, ...]) -> None:
    """Well-conditioned input (cond <= 2): the classic cubic iteration reaches U V^T to float32 accuracy."""
    gen = _gen(4)
    *batch, m, n = shape
    s = torch.rand(*batch, min(m, n), generator=gen, dtype=F64) * 0.5 + 0.5
    a, u, v = _with_spectrum(s, m, n, gen)
    o = newton_schulz(a.to(torch.float32), steps=25, coefficients=NS_CUBIC)
    assert o.shape == a.shape and o.dtype == torch.float32
    _close(o, u @ v.mT, atol=1e-5)


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
        assert error <= math.sqrt(r) * (1 - 1 / kappa) ** (2**i) + 1e-12, (i, error)


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
    assert error <= math.sqrt(m - 1) * (1 - 1 / kappa_a**2) ** (2**steps) + 1e-12


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
    if dtype == torch.float32:
        _close(polar_svd(o), u @ v.mT, atol=1e-4)


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
    _close(evals, lam.sort(dim=-1).values, atol=1e-5)
    assert bool((evals[..., 1:] >= evals[..., :-1]).all())
    assert float(_orthonormality_defect(evecs).max()) < 1e-5
    _close((evecs * evals.unsqueeze(-2)) @ evecs.mT, a, atol=1e-5)


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
    _close(evals, lam, atol=1e-5)
    _close((evecs * evals.unsqueeze(-2)) @ evecs.mT, a, atol=1e-5)


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


# --------------------------------------------------------------------------------------------------
# Inverse p-th roots


ROOT_METHODS = pytest.mark.parametrize(
    "method",
    [inverse_root_eigh, inverse_root_newton],
    ids=["eigh", "newton"],
)


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
    rel = torch.linalg.matrix_norm(r.to(F64) - expected) / torch.linalg.matrix_norm(expected)
    assert float(rel.max()) < 2e-5
    damped = a + ridge.unsqueeze(-1) * _eye(12)
    _close(torch.linalg.matrix_power(r.to(F64), p) @ damped, _eye(12).expand_as(a), atol=2e-4)


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
    _close(on_eigvecs, expected, atol=0.0, rtol=1e-3)


def test_absolute_ridge_is_eps() -> None:
    eps = 1e-2
    lam = torch.tensor([0.0, 1.0, 100.0], dtype=F64)
    a, u = _spd(lam, _gen(14))
    r = inverse_root_eigh(a.to(torch.float32), 2, eps=eps, relative_eps=False)
    r_newton = inverse_root_newton(a.to(torch.float32), 2, eps=eps, relative_eps=False)
    expected = (lam + eps).pow(-0.5)
    _close(torch.diagonal(u.mT @ r.to(F64) @ u), expected, atol=0.0, rtol=1e-4)
    _close(torch.diagonal(u.mT @ r_newton.to(F64) @ u), expected, atol=0.0, rtol=1e-4)


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
    scale = float(torch.linalg.matrix_norm(r_a, ord=2))
    _close(r_ca * c ** (1.0 / p), r_a, atol=1e-3 * scale)


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
    _close(estimate, torch.full((2,), 10.0, dtype=F64), atol=0.0, rtol=1e-5)
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
    defects = [_orthonormality_defect(bjorck_orthonormalize(v, steps=k)) for k in range(5)]
    assert float(defects[0].min()) > 1e-3
    for before, after in itertools.pairwise(defects):
        assert bool((after <= 0.8 * before**2 + 1e-13).all())
    u, _, vh = torch.linalg.svd(v, full_matrices=False)
    _close(bjorck_orthonormalize(v, steps=5), u @ vh, atol=1e-12)


def test_bjorck_keeps_input_dtype() -> None:
    v = torch.eye(4, dtype=torch.bfloat16) * 1.01
    out = bjorck_orthonormalize(v, steps=2)
    assert out.dtype == torch.bfloat16
    _close(out, torch.eye(4), atol=1e-2)


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
        assert float(_orthonormality_defect(q).max()) < 1e-5
        errors.append(float(torch.linalg.matrix_norm(q.to(F64) @ q.to(F64).mT - top).max()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-5


def test_subspace_iteration_sign_convention() -> None:
    """One step is the reduced QR A Q0 = Q R with diag(R) >= 0, so R = Q^T A Q0 is upper triangular."""
    gen = _gen(18)
    a, _ = _spd(torch.rand(8, generator=gen, dtype=F64) + 0.5, gen)
    q0 = torch.randn(8, 3, generator=gen, dtype=F64)
    q = subspace_iteration(a, q0, iters=1)
    r = q.mT @ a @ q0
    _close(torch.tril(r, diagonal=-1), torch.zeros(3, 3), atol=1e-12)
    assert bool((torch.diagonal(r) > 0).all())
    _close(q @ r, a @ q0, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# randomized_range_finder and truncated_svd


def _low_rank(batch: tuple[int, ...], m: int, n: int, rank: int, seed: int) -> tuple[Tensor, Tensor]:
    gen = _gen(seed)
    s = torch.rand(*batch, rank, generator=gen, dtype=F64).sort(dim=-1, descending=True).values + 0.5
    u = _orthonormal(batch, m, rank, gen)
    v = _orthonormal(batch, n, rank, gen)
    return (u * s.unsqueeze(-2)) @ v.mT, s


@pytest.mark.parametrize(("oversample", "power_iters"), [(0, 0), (5, 0), (0, 2), (5, 2)])
def test_range_finder_captures_exact_low_rank(oversample: int, power_iters: int) -> None:
    g, _ = _low_rank((2,), 40, 30, 5, seed=19)
    g32 = g.to(torch.float32)
    q = randomized_range_finder(g32, 5, oversample=oversample, power_iters=power_iters, generator=_gen(0))
    assert q.shape == (2, 40, 5) and q.dtype == torch.float32
    assert float(_orthonormality_defect(q).max()) < 1e-5
    q = q.to(F64)
    residual = torch.linalg.matrix_norm(g - q @ (q.mT @ g)) / torch.linalg.matrix_norm(g)
    assert float(residual.max()) < 1e-5


def test_range_finder_is_deterministic_given_generator() -> None:
    g = _low_rank((), 30, 20, 4, seed=20)[0].to(torch.float32)
    first = randomized_range_finder(g, 4, oversample=2, power_iters=1, generator=_gen(7))
    again = randomized_range_finder(g, 4, oversample=2, power_iters=1, generator=_gen(7))
    other = randomized_range_finder(g, 4, oversample=2, power_iters=1, generator=_gen(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    _close(first @ first.mT, other @ other.mT, atol=1e-5)


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
    assert sigma * (1 - 1e-5) <= error <= (1 + factor) * sigma


def test_truncated_svd_exact_matches_known_factors() -> None:
    """Known distinct spectrum: S is its top-r part; the residual is Eckart–Young's sqrt(sum tail s^2)."""
    gen = _gen(22)
    s = torch.rand(2, 20, generator=gen, dtype=F64).sort(dim=-1, descending=True).values + 0.1
    g, _, _ = _with_spectrum(s, 25, 20, gen)
    u, sv, vh = truncated_svd(g.to(torch.float32), 6)
    assert u.shape == (2, 25, 6) and sv.shape == (2, 6) and vh.shape == (2, 6, 20)
    _close(sv, s[..., :6], atol=1e-5)
    assert float(_orthonormality_defect(u).max()) < 1e-5
    assert float(_orthonormality_defect(vh).max()) < 1e-5
    approx = (u.to(F64) * sv.to(F64).unsqueeze(-2)) @ vh.to(F64)
    _close(torch.linalg.matrix_norm(g - approx), s[..., 6:].square().sum(-1).sqrt(), atol=1e-5)


def test_truncated_svd_randomized_recovers_exact_low_rank() -> None:
    g, s = _low_rank((2,), 50, 40, 5, seed=23)
    g32 = g.to(torch.float32)
    u, sv, vh = truncated_svd(g32, 5, method="randomized", generator=_gen(3))
    assert u.shape == (2, 50, 5) and sv.shape == (2, 5) and vh.shape == (2, 5, 40)
    _close(sv, s, atol=0.0, rtol=1e-5)
    approx = (u.to(F64) * sv.to(F64).unsqueeze(-2)) @ vh.to(F64)
    assert float((torch.linalg.matrix_norm(g - approx) / torch.linalg.matrix_norm(g)).max()) < 1e-5
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
    assert torch.equal(s, s.mT)
    _close(s + (a - a.mT) / 2, a, atol=1e-6)


def test_float64_input_is_solved_in_float64() -> None:
    """An ill-conditioned float64 matrix keeps float64 accuracy (no float32 round trip)."""
    gen = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(12, 12, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(30, 12, generator=gen, dtype=torch.float64))
    s = torch.logspace(0, -6, 12, dtype=torch.float64)
    a = (u * s) @ v.T
    assert torch.allclose(polar_svd(a), u @ v.T, atol=1e-8)


def test_polar_svd_of_a_rank_deficient_matrix_is_the_compact_factor() -> None:
    """Rank 2 in 6x9: U_2 V_2^T, whose singular values are 1, 1 and then exactly 0."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(6, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, 9, generator=gen, dtype=torch.float64)
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    p = polar_svd(a)
    assert torch.allclose(p, u[:, :2] @ vh[:2], atol=1e-10)
    assert torch.allclose(torch.linalg.svdvals(p), torch.tensor([1.0, 1, 0, 0, 0, 0], dtype=torch.float64), atol=1e-10)
    assert torch.equal(polar_svd(torch.zeros(3, 4)), torch.zeros(3, 4))


def test_from_eigenpairs_rebuilds_the_matrix_and_its_functions() -> None:
    """For symmetric positive definite A = X X^T + I with float64 eigh (lambda, V): V diag(lambda) V^T is A,
    V diag(1/lambda) V^T is A^{-1} and V diag(sqrt lambda) V^T squares to A; over a batch and for one matrix."""
    x = torch.randn(3, 5, 5, generator=_gen(31), dtype=F64)
    a = x @ x.mT + _eye(5)
    evals, evecs = torch.linalg.eigh(a)
    _close(from_eigenpairs(evals, evecs), a, atol=1e-12)
    _close(from_eigenpairs(evals.reciprocal(), evecs) @ a, _eye(5).expand(3, 5, 5), atol=1e-12)
    root = from_eigenpairs(evals.sqrt(), evecs)
    _close(root @ root, a, atol=1e-12)
    _close(from_eigenpairs(evals[0], evecs[0]), a[0], atol=1e-12)
