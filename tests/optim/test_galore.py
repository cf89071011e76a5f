"""Tests for structbench.optim.galore against independent facts.

- Hand-derived updates: the projected HF-style Adam update (RACS/Alice paper Alg. 8 with the reference
  code's eps placement, bias correction in the step size, decoupled weight decay after the update) is
  recomputed here in float64 from the equations, with the projection from a float64 SVD of the gradient.
  Gradients are built from known factors with well-separated singular values, so the top-r subspace is
  well determined; the update is invariant to the signs of the singular vectors while the basis is fixed.
- Invariants: orthonormal projections, the update lies in the projected subspace, the refresh schedule,
  exact moment rotation, sign invariance with re-projection.
- Parity with pytorch_optimizer 4.1.0 `GaLore` (test-only oracle); see `test_parity_with_pytorch_optimizer`
  for the semantic differences and the switches used.
- Exact state bytes from the format: float32 projection (r x n or m x r) + two float32 moments of the
  projected shape, + torch AdamW's state for the fallback parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from structbench import measure
from structbench.errors import SolverError
from structbench.optim import linalg, registry
from structbench.optim.galore import GaLore
from tests.support.lowrank_helpers import (
    F64,
    Svd,
    assert_resume_is_bit_identical,
    bucket_case,
    hand_projected_adam,
    known_matrix,
    step_together,
    steps_beside_oracle,
    top_basis,
)
from tests.support.newton_schulz import gamma

TRUNCATED_SVD = linalg.truncated_svd


def spread(k: int) -> list[float]:
    """k well-separated singular values, 8, 6.4, 5.12, ... (ratio 0.8; the shared `lowrank_helpers.spread` uses 0.7)."""
    return [8.0 * 0.8**i for i in range(k)]


def hand_adam_steps(w0: Tensor, grads: list[Tensor], basis: Tensor, right: bool, hp: dict[str, Any]) -> Tensor:
    """W after len(grads) GaLore steps with a fixed basis (n x r right, m x r left), all in float64."""
    w = w0.to(F64).reshape(w0.shape[0], -1)
    for step in hand_projected_adam(grads, basis, right, hp["lr"], (hp["beta1"], hp["beta2"]), hp["eps"]):
        back = step.normalized @ basis.T if right else basis @ step.normalized
        w = w - step.step_size * hp["scale"] * back
        w = w - hp["lr"] * hp["weight_decay"] * w
    return w.reshape(w0.shape)


HP = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "scale": 0.25, "weight_decay": 0.1}

# Rounding-error bounds behind the tolerances (Higham, "Accuracy and Stability of Numerical Algorithms"): float32 unit
# roundoff u = 2^-24; a product with inner size k errs by <= gamma_k |A| |B| entrywise, gamma_k = k u / (1 - k u); a
# float32 SVD of a matrix with largest side d is exact for G + E, ||E||_2 <= c d u ||G||_2, with factors within c d u
# of orthonormal, c = C = 4 (LAPACK's "modestly growing" p(d), taken as 4 d); a singular vector then turns by
# sin(theta_i) <= ||E|| / gap_i (Wedin), gap_i its distance to the other singular values. Float64 references add
# O(2^-53), left out.
U = 2.0**-24
C = 4


def basis_error(g: Tensor, r: int) -> Tensor:
    """(r,) bounds on how far each of the float32 SVD's top-r singular vectors of the float32 matrix g is from the exact
    one (2-norm, up to sign): sin(theta_i) <= c d u ||G|| / gap_i, plus c d u for its distance from orthonormal."""
    s = torch.linalg.svdvals(g.to(F64).reshape(g.shape[0], -1))
    d = max(g.shape[0], math.prod(g.shape[1:]))
    gaps = torch.stack([(s[i] - torch.cat([s[:i], s[i + 1 :]])).abs().min() for i in range(r)])
    return C * d * U * s[0] / gaps + C * d * U


def hand_adam_bound(
    w0: Tensor, grads: list[Tensor], basis: Tensor, right: bool, hp: dict[str, Any], tilt: Tensor
) -> Tensor:
    """Entrywise bound on |W_float32 - W_hand| after GaLore steps with a fixed basis (`hand_adam_steps`), the float32
    basis's columns within `tilt` (each) of the exact ones. Carried along: sigma = G P (or P^T G) off by
    |G| |dP| + gamma_k |G| |P|; m (a product and a scaled add) by (1 - b1) dsigma + gamma_4 of its terms; v by
    (1 - b2) (2 |sigma| dsigma + dsigma^2) + gamma_5 of its terms; N = m / (sqrt(v) + eps) by (dm + |N| dden) / den +
    u |N|, dden = dv / (2 sqrt(v)) + 2 u den; the update a back(N) (a = step size x scale; one addmm into W) by
    a (|dN| |P|^T + |N| |dP|^T) + gamma_{r+2} (a |N| |P|^T + |W|); the decay W - lr wd W by gamma_3 |W|, carrying the
    earlier error scaled by 1 - lr wd."""
    b1, b2, r = hp["beta1"], hp["beta2"], basis.size(1)
    p, dp = basis.abs(), tilt.expand_as(basis)
    w = w0.to(F64).reshape(w0.shape[0], -1)
    dw = torch.zeros_like(w)
    m = v = dm = dv = None
    for t, g in enumerate(grads, start=1):
        g = g.to(F64).reshape(w.shape)
        if right:
            sigma, dsigma = g @ basis, g.abs() @ dp + gamma(g.size(1)) * g.abs() @ p
        else:
            sigma, dsigma = basis.T @ g, dp.T @ g.abs() + gamma(g.size(0)) * p.T @ g.abs()
        if m is None:
            m, v, dm, dv = (torch.zeros_like(sigma) for _ in range(4))
        dm = b1 * dm + (1 - b1) * dsigma + gamma(4) * (b1 * m.abs() + (1 - b1) * sigma.abs())
        m = b1 * m + (1 - b1) * sigma
        dv = b2 * dv + (1 - b2) * (2 * sigma.abs() * dsigma + dsigma**2) + gamma(5) * (b2 * v + (1 - b2) * sigma**2)
        v = b2 * v + (1 - b2) * sigma**2
        den = v.sqrt() + hp["eps"]
        n = m / den
        dn = (dm + n.abs() * (dv / (2 * v.sqrt()) + 2 * U * den)) / den + U * n.abs()
        a = hp["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t) * hp["scale"]
        if right:
            back, size, dback = n @ basis.T, n.abs() @ p.T, dn @ p.T + n.abs() @ dp.T
        else:
            back, size, dback = basis @ n, p @ n.abs(), p @ dn + dp @ n.abs()
        dw = dw + a * dback + gamma(r + 2) * (a * size + w.abs())
        w = w - a * back
        dw = (1 - hp["lr"] * hp["weight_decay"]) * dw + gamma(3) * w.abs()
        w = w - hp["lr"] * hp["weight_decay"] * w
    return dw.reshape(w0.shape)


def make(params: list[nn.Parameter], **overrides: Any) -> GaLore:
    return GaLore(params, **{**HP, "rank": 3, "update_proj_gap": 1000, **overrides})


def set_grads(params: list[nn.Parameter], grads: list[Tensor]) -> None:
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()


# --- hand-derived updates -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "right"),
    [((10, 6), True), ((6, 10), False), ((4, 2, 3, 3), False), ((9, 9), True)],
    ids=["tall", "wide", "conv-4d", "square"],
)
def test_steps_equal_hand_derived_projected_adam(shape: tuple[int, ...], right: bool) -> None:
    """Three steps (the first refreshes, the others reuse the basis) equal the float64 equations."""
    rows, cols = shape[0], math.prod(shape[1:])
    w0 = known_matrix(rows, cols, spread(min(rows, cols)), seed=1).reshape(shape)
    # gradients of size ~1e-4, comparable to eps / sqrt(1 - b2) = 3e-5: the eps placement is visible
    grads = [1e-4 * known_matrix(rows, cols, spread(min(rows, cols)), seed=2).reshape(shape)]
    gen = torch.Generator().manual_seed(3)
    grads += [grads[0] + 3e-5 * torch.randn(shape, generator=gen) for _ in range(2)]
    param = nn.Parameter(w0.clone())
    opt = make([param])
    for g in grads:
        set_grads([param], [g])
        opt.step()
    basis = top_basis(grads[0].reshape(rows, cols), 3, right)
    expected = hand_adam_steps(w0, grads, basis, right, HP)
    # `hand_adam_bound` with the float32 SVD's basis tilt (`basis_error`; gap sigma_3 - sigma_4 = 0.2 sigma_3): the
    # projected gradients sit near eps / sqrt(1 - b2), where N's slope is largest, so the tilt dominates (~8e-6).
    # eps inside the root (eps sqrt(1 - b2) outside) moves W by >= 2e-3.
    bound = hand_adam_bound(w0, grads, basis, right, HP, basis_error(grads[0], 3))
    assert bool(((param.detach().to(F64) - expected).abs() <= bound).all())


def test_each_matrix_of_a_bucket_steps_as_it_would_alone() -> None:
    """Same-shape matrices are stepped as one stack (one batched projection and back-projection, foreach moments and
    adds): each keeps its own basis, moments and step size. Matrix 2 (a filter in a bucket of plain matrices)
    starts a step late, so its step size differs from its bucket's; weight decay on. Each matrix equals the
    float64 equations with the float64 basis of its own first gradient within `hand_adam_bound`. Another matrix's
    basis, moments or step size moves W by >= 1e-3 relative."""
    case = bucket_case(seed=30)
    params, opt = step_together(make, case)
    for param, start, grads, right in zip(params, case.starts, case.grads, case.rights, strict=True):
        rows = start.shape[0]
        w0, grads = start.reshape(rows, -1), [g.reshape(rows, -1) for g in grads]
        basis = top_basis(grads[0], 3, right)
        expected = hand_adam_steps(w0, grads, basis, right, HP)
        bound = hand_adam_bound(w0, grads, basis, right, HP, basis_error(grads[0], 3))
        assert bool(((param.detach().reshape(rows, -1).to(F64) - expected).abs() <= bound).all())
    assert opt.state[params[2]]["step"] == opt.state[params[0]]["step"] - 1


def test_bfloat16_parameter_gets_the_float32_update_rounded_once() -> None:
    w0 = known_matrix(8, 12, spread(8), seed=4).bfloat16()
    g = known_matrix(8, 12, spread(8), seed=5)
    param = nn.Parameter(w0.clone())
    opt = make([param], weight_decay=0.0)
    set_grads([param], [g.bfloat16()])
    opt.step()
    state = opt.state[param]
    assert all(state[k].dtype == torch.float32 for k in ("projection", "exp_avg", "exp_avg_sq"))
    expected = hand_adam_steps(
        w0.float(), [g.bfloat16().float()], top_basis(g.bfloat16(), 3, False), False, {**HP, "weight_decay": 0.0}
    )
    assert param.dtype == torch.bfloat16
    # The float32 result is within `hand_adam_bound` (delta) of the hand value, then rounded once to bfloat16: half a
    # bfloat16 ulp (8 significant bits: 2^(e - 8) for |x| in [2^e, 2^(e+1))) of the float32 value, whose binade is that
    # of |expected| + delta at most. A float32 update rounded twice, or applied in bfloat16, errs by up to a full ulp.
    g16 = g.bfloat16().float()
    delta = hand_adam_bound(
        w0.float(), [g16], top_basis(g16, 3, False), False, {**HP, "weight_decay": 0.0}, basis_error(g16, 3)
    )
    half_ulp = torch.exp2(torch.floor(torch.log2(expected.abs() + delta)) - 8)
    assert bool(((param.detach().to(F64) - expected).abs() <= half_ulp + delta).all())


def test_rank_above_min_dim_is_capped_and_gives_adam_in_a_rotated_full_basis() -> None:
    """rank 128 on a 4 x 9 matrix: r = 4 (the reference slices Vh[:rank] / U[:, :rank] the same way)."""
    w0 = known_matrix(4, 9, spread(4), seed=6)
    g = known_matrix(4, 9, spread(4), seed=7)
    param = nn.Parameter(w0.clone())
    opt = make([param], rank=128)
    set_grads([param], [g])
    opt.step()
    projection = opt.state[param]["projection"]
    assert projection.shape == (4, 4)
    # U from a float32 SVD of the 4 x 9 gradient: within c d u of orthonormal (d = 9), so U^T U - I <= 2 c d u +
    # (c d u)^2, and the step within `hand_adam_bound` (each of the 4 singular vectors turns by `basis_error`; Adam is
    # not invariant to rotations inside the subspace). A rank not capped to 4 fails the shape check.
    torch.testing.assert_close(projection.T @ projection, torch.eye(4), rtol=0, atol=2 * C * 9 * U + (C * 9 * U) ** 2)
    expected = hand_adam_steps(w0, [g], top_basis(g, 4, False), False, HP)
    bound = hand_adam_bound(w0, [g], top_basis(g, 4, False), False, HP, basis_error(g, 4))
    assert bool(((param.detach().to(F64) - expected).abs() <= bound).all())


# --- projection side, subspace and schedule -------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "proj_type", "right"),
    [((12, 6), "std", True), ((6, 12), "std", False), ((12, 6), "reverse_std", False), ((6, 12), "reverse_std", True)],
)
def test_projection_side_shapes_and_update_subspace(shape: tuple[int, int], proj_type: str, right: bool) -> None:
    rows, cols = shape
    param = nn.Parameter(torch.zeros(shape))
    opt = make([param], proj_type=proj_type, weight_decay=0.0)
    g = known_matrix(rows, cols, spread(min(shape)), seed=8)
    set_grads([param], [g])
    opt.step()
    state = opt.state[param]
    p = state["projection"]
    # P from a float32 SVD (d = 12): within c d u of orthonormal, P P^T - I <= 2 c d u + (c d u)^2 entrywise.
    # W = a N P (or a P N) from zero is in P's row (column) space up to the product's rounding D, |D| <= gamma_5
    # |a N| |P| (with the scaling and the add); so W - W P^T P = a N (I - P P^T) P + D (I - P^T P), with
    # |D (I - P^T P)| <= |D| (|I| + |P|^T |P|) and |P| |P|^T <= 1 entrywise (C-S), and the test's two float32
    # products add gamma_{cols+3} |W| |P|^T |P|; |a N| = |W| |P|^T to first order. An update outside the subspace (G
    # itself, or the other side's projection) leaves O(|W|).
    defect_bound = 2 * C * 12 * U + (C * 12 * U) ** 2
    w, p64 = param.detach().to(F64), p.to(F64)
    if right:
        assert p.shape == (3, cols) and state["exp_avg"].shape == (rows, 3)
        torch.testing.assert_close(p @ p.T, torch.eye(3), rtol=0, atol=defect_bound)
        residual = param.detach() - param.detach() @ p.T @ p
        defect = (p64 @ p64.T - torch.eye(3, dtype=F64)).abs()
        coefficients = w.abs() @ p64.abs().T
        carried = p64.abs() + torch.ones(3, 3, dtype=F64) @ p64.abs()
        bound = coefficients @ defect @ p64.abs() + coefficients @ (gamma(5) * carried + gamma(cols + 3) * p64.abs())
    else:
        assert p.shape == (rows, 3) and state["exp_avg"].shape == (3, cols)
        torch.testing.assert_close(p.T @ p, torch.eye(3), rtol=0, atol=defect_bound)
        residual = param.detach() - p @ p.T @ param.detach()
        defect = (p64.T @ p64 - torch.eye(3, dtype=F64)).abs()
        coefficients = p64.abs().T @ w.abs()
        carried = p64.abs() + p64.abs() @ torch.ones(3, 3, dtype=F64)
        bound = p64.abs() @ defect @ coefficients + (gamma(5) * carried + gamma(rows + 3) * p64.abs()) @ coefficients
    assert state["exp_avg_sq"].shape == state["exp_avg"].shape
    assert float(param.detach().abs().max()) > 1e-4
    assert bool((residual.to(F64).abs() <= bound).all())


class SvdSpy:
    """Wraps linalg.truncated_svd: records the batch shape of every call and may transform the output."""

    def __init__(self, transform: Callable[[Svd], Svd] | None = None) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.transform = transform

    def __call__(self, g: Tensor, rank: int, **kwargs: Any) -> Svd:
        self.calls.append(tuple(g.shape))
        out = TRUNCATED_SVD(g, rank, **kwargs)
        return self.transform(out) if self.transform else out


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [("paper", [1, 3, 6, 9]), ("reference", [1, 4, 7, 10])],
)
def test_refresh_happens_exactly_on_schedule(monkeypatch, schedule: str, expected: list[int]) -> None:
    """T = 3: Alg. 8 refreshes at t = 1 and multiples of T; the official code's 0-based counter at 1 + kT."""
    spy = SvdSpy()
    monkeypatch.setattr(linalg, "truncated_svd", spy)
    params = [nn.Parameter(torch.zeros(6, 4)) for _ in range(2)] + [nn.Parameter(torch.zeros(3, 7))]
    opt = make(params, update_proj_gap=3, refresh_schedule=schedule)
    gen = torch.Generator().manual_seed(9)
    refreshed = []
    for t in range(1, 11):
        before = [opt.state[p].get("projection") for p in params]
        spy.calls.clear()
        set_grads(params, [torch.randn(p.shape, generator=gen) for p in params])
        opt.step()
        changed = [
            b is None or not torch.equal(b, opt.state[p]["projection"]) for b, p in zip(before, params, strict=True)
        ]
        assert all(changed) or not any(changed)
        if any(changed):
            refreshed.append(t)
            assert sorted(spy.calls) == [(1, 3, 7), (2, 6, 4)]  # one batched SVD per shape; wide ones as they are
        else:
            assert spy.calls == []
    assert refreshed == expected


# --- moments at a subspace change -----------------------------------------------------------------------


def two_steps_with_refresh(g1: Tensor, g2: Tensor, reproject: bool) -> tuple[dict, dict, dict]:
    """States after step 1 and step 2 (T = 2, so step 2 refreshes) for one parameter."""
    param = nn.Parameter(torch.zeros(g1.shape))
    opt = make([param], update_proj_gap=2, reproject_moments=reproject)
    set_grads([param], [g1])
    opt.step()
    first = {k: v.clone() for k, v in opt.state[param].items() if isinstance(v, Tensor)}
    set_grads([param], [g2])
    opt.step()
    second = {k: v.clone() for k, v in opt.state[param].items() if isinstance(v, Tensor)}
    return first, second, opt.state[param]


@pytest.mark.parametrize("shape", [(6, 14), (14, 6)], ids=["wide-left", "tall-right"])
@pytest.mark.parametrize("reproject", [False, True])
def test_moments_at_refresh_follow_the_formula(shape: tuple[int, int], reproject: bool) -> None:
    """Off (reference): moments carried unchanged. On: m <- R m, v <- (R o R) v with R the basis overlap."""
    g1 = known_matrix(*shape, spread(6), seed=10)
    g2 = known_matrix(*shape, spread(6), seed=11)
    first, second, _ = two_steps_with_refresh(g1, g2, reproject)
    b1, b2 = HP["beta1"], HP["beta2"]
    right = shape[0] >= shape[1]
    p_old, p_new = first["projection"].to(F64), second["projection"].to(F64)
    m_old, v_old = first["exp_avg"].to(F64), first["exp_avg_sq"].to(F64)
    g = g2.to(F64)
    # From the stored float32 moments and projections (exact inputs), entrywise: sigma = G P^T (P G) off by
    # gamma_k |G| |P|; R = P_old P_new^T by gamma_k |P_old| |P_new|^T (k the long side); R m by |m| |dR| + gamma_3
    # |m| |R|, and (R o R) v by |v| (2 |R| |dR| + u R^2) + gamma_3 |v| R^2; the EMAs (a product and a scaled add with
    # rounded constants) add gamma_4 and gamma_5 of their terms. Carrying instead of reprojecting (or the reverse)
    # moves the moments by O(|m|).
    k = max(shape)
    if right:
        sigma, dsigma = g @ p_new.T, gamma(k) * g.abs() @ p_new.abs().T
        overlap, doverlap = p_old @ p_new.T, gamma(k) * p_old.abs() @ p_new.abs().T
    else:
        sigma, dsigma = p_new.T @ g, gamma(k) * p_new.abs().T @ g.abs()
        overlap, doverlap = p_new.T @ p_old, gamma(k) * p_new.abs().T @ p_old.abs()
    square_error = 2 * overlap.abs() * doverlap + U * overlap**2

    def carried(x: Tensor, through: Tensor) -> Tensor:
        return x @ through if right else through @ x

    if reproject:
        m_carried, v_carried = carried(m_old, overlap), carried(v_old, overlap**2)
        dm = carried(m_old.abs(), doverlap) + gamma(3) * carried(m_old.abs(), overlap.abs())
        dv = carried(v_old, square_error) + gamma(3) * carried(v_old, overlap**2)
    else:
        m_carried, v_carried, dm, dv = m_old, v_old, torch.zeros_like(m_old), torch.zeros_like(v_old)
    m_bound = b1 * dm + (1 - b1) * dsigma + gamma(4) * (b1 * m_carried.abs() + (1 - b1) * sigma.abs())
    v_terms = b2 * v_carried + (1 - b2) * sigma**2
    v_bound = b2 * dv + (1 - b2) * (2 * sigma.abs() * dsigma + dsigma**2) + gamma(5) * v_terms
    assert bool(((second["exp_avg"].to(F64) - (b1 * m_carried + (1 - b1) * sigma)).abs() <= m_bound).all())
    assert bool(((second["exp_avg_sq"].to(F64) - v_terms).abs() <= v_bound).all())


@pytest.mark.parametrize("shape", [(6, 14), (14, 6)], ids=["wide-left", "tall-right"])
def test_reprojection_is_exact_when_the_subspace_is_kept(shape: tuple[int, int]) -> None:
    """G2 = G1 with its singular values in reverse order: same top-3 subspace, basis permuted (and flipped).

    Then R is a signed permutation, the full-space first moment P m is preserved exactly and the second
    moment is permuted exactly.
    """
    rows, cols = shape
    gen = torch.Generator().manual_seed(12)
    u, _ = torch.linalg.qr(torch.randn(rows, 3, generator=gen, dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(cols, 3, generator=gen, dtype=F64))
    g1 = (u @ torch.diag(torch.tensor([8.0, 4.0, 2.0], dtype=F64)) @ v.T).float()
    g2 = (u @ torch.diag(torch.tensor([2.0, 4.0, 8.0], dtype=F64)) @ v.T).float()
    first, second, _ = two_steps_with_refresh(g1, g2, reproject=True)
    b1, b2 = HP["beta1"], HP["beta2"]
    right = rows >= cols
    p_old, p_new = first["projection"].to(F64), second["projection"].to(F64)
    overlap = p_old @ p_new.T if right else p_new.T @ p_old
    permutation = torch.zeros(3, 3, dtype=F64)
    permutation[[0, 1, 2], [2, 1, 0]] = 1.0
    # Each float32 basis vector is within s = (u ||G||_F + c d u ||G||_2) / 2 + c d u of an exact singular vector
    # (the cast to float32, the SVD's backward error over a gap >= 2 to 4 or to the null space, and the distance from
    # orthonormal), so R = P_old P_new^T is the signed permutation up to 2 s (+ gamma_d for the float32 R) per entry.
    d = k = max(shape)
    tilt = (U * 9.2 + C * d * U * 8.0) / 2 + C * d * U  # ||G||_F = sqrt(84) < 9.2, ||G||_2 = 8
    entry = 2 * tilt + gamma(k)
    torch.testing.assert_close(overlap.abs(), permutation, rtol=0, atol=entry)
    sigma = g2.to(F64) @ p_new.T if right else p_new.T @ g2.to(F64)
    m_carried = (second["exp_avg"].to(F64) - (1 - b1) * sigma) / b1
    v_carried = (second["exp_avg_sq"].to(F64) - (1 - b2) * sigma**2) / b2
    m_old, v_old = first["exp_avg"].to(F64), first["exp_avg_sq"].to(F64)
    # In the right-side orientation (transposed for the left side): the float32 R m, the EMA that stored it and the
    # float32 sigma (gamma_k |G| |P|) make the recovered m R off by dm = |m| (R's entry error) + gamma_3 |m| |R|
    # + (gamma_4 (b1 |m R| + (1 - b1) |sigma|) + (1 - b1) dsigma) / b1; m R P_new = m P_old P_new^T P_new leaves P_old's
    # rows' distance from span(P_new), <= 2 s + 2 c d u each. v: (R o R) is the permutation up to 2 e + e^2
    # (e = the entry error above) per entry, plus gamma_3 and the EMA's gamma_5 and (1 - b2) 2 |sigma| dsigma, / b2.
    # A moment that was not rotated (or rotated by R^T) is off by O(|m|).
    orient = (lambda x: x) if right else (lambda x: x.mT)
    m_old_r, m_r, v_old_r, v_r, sigma_r = map(orient, (m_old, m_carried, v_old, v_carried, sigma))
    p_old_r, p_new_r = (p_old, p_new) if right else (p_old.T, p_new.T)
    rotation = p_old_r @ p_new_r.T
    dsigma = gamma(k) * orient(g2.to(F64)).abs() @ p_new_r.abs().T
    stored = m_old_r @ rotation
    dm = m_old_r.abs() @ torch.full((3, 3), entry, dtype=F64) + gamma(3) * m_old_r.abs() @ rotation.abs()
    dm = dm + (gamma(4) * (b1 * stored.abs() + (1 - b1) * sigma_r.abs()) + (1 - b1) * dsigma) / b1
    away = m_old_r.abs().sum(-1, keepdim=True) * (2 * tilt + 2 * C * d * U)
    m_bound = away + dm @ p_new_r.abs()
    assert bool(((m_r @ p_new_r - m_old_r @ p_old_r).abs() <= m_bound).all())
    stored_v = v_old_r @ rotation**2
    squares = 2 * entry + entry**2
    dv = v_old_r @ torch.full((3, 3), squares, dtype=F64) + gamma(3) * stored_v
    dv = dv + (gamma(5) * (b2 * stored_v + (1 - b2) * sigma_r**2) + (1 - b2) * 2 * sigma_r.abs() * dsigma) / b2
    assert bool(((v_r - v_old_r[:, [2, 1, 0]]).abs() <= dv).all())


def flip_some_signs(out: Svd) -> Svd:
    """Another valid SVD: negate singular pairs 0 and 2 (u column and vh row together)."""
    u, s, vh = out
    signs = torch.ones(s.shape[-1], dtype=u.dtype)
    signs[0::2] = -1.0
    return u * signs, s, vh * signs[:, None]


@pytest.mark.parametrize(("reproject", "invariant"), [(True, True), (False, False)])
def test_sign_of_singular_vectors_matters_only_without_reprojection(monkeypatch, reproject: bool, invariant: bool):
    """SVD signs are arbitrary. With re-projection the trajectory cannot depend on them (R absorbs the
    flip); the reference's carried-over moments do depend on them after a second refresh."""
    gen = torch.Generator().manual_seed(13)
    grads = [torch.randn(6, 10, generator=gen) for _ in range(4)]
    finals = []
    for flip in (False, True):
        spy = SvdSpy()
        spy.transform = lambda out, spy=spy, flip=flip: flip_some_signs(out) if flip and len(spy.calls) == 2 else out
        monkeypatch.setattr(linalg, "truncated_svd", spy)
        param = nn.Parameter(torch.zeros(6, 10))
        opt = make([param], update_proj_gap=2, reproject_moments=reproject)
        for g in grads:
            set_grads([param], [g])
            opt.step()
        finals.append(param.detach().clone())
    if invariant:
        # (a) Exact: negating a column of U and the row of V^T is exact, and every later product, sum, square and
        # quotient of negated numbers is the negated (or, for squares and U N, the same) float32 result.
        assert torch.equal(finals[0], finals[1])
    else:
        # Carried unrotated moments change the steps themselves, not just their rounding: the weights differ by more
        # than 100x the 16 u max|W| that rounding four float32 steps could explain (the flips alone cause none).
        assert float((finals[0] - finals[1]).abs().max()) > 100 * 16 * U * float(finals[1].abs().max())


# --- parity with the oracle -----------------------------------------------------------------------------


def test_parity_with_pytorch_optimizer() -> None:
    """pytorch_optimizer 4.1.0 GaLore, projection_type 'std', over 8 steps with T = 3 (refreshes at 1, 3, 6).

    Switches used: refresh_schedule='paper' (the oracle refreshes when its step counter, 1-based, is 1 or a
    multiple of T), reproject_moments=False, svd_method='exact', proj_type='std'.
    Singular-vector signs: both take torch.linalg.svd of the gradient itself, wide ones included, so their
    signs agree (without re-projection the carried-over moments depend on them). Remaining differences, none
    exercised here: the oracle counts steps per group (ours per parameter, as the official code; equal when
    every parameter has a gradient at every step); it projects bfloat16 gradients in bfloat16 (ours float32, so
    the test is float32); it gives non-2-D parameters plain Adam (ours projects conv filters as matrices, so the
    test is 2-D); it keeps a Python projector object in the state (no state_dict round trip). Rounding differs in
    the last bits: the oracle updates m with lerp_ and decays with p *= 1 - lr*wd, ours with the reference's
    m*b1 + (1-b1)g and p += -lr*wd*p, and adds the projected-back update with one addmm. Gradients are fixed
    tensors (not recomputed from the parameters), so both see identical SVD inputs; the tolerance is a measured
    kernel spread (below)."""
    from pytorch_optimizer import GaLore as OracleGaLore

    # (c) Measured, not bounded (an Adam step divides rounding by sqrt(v) + eps entrywise): across AVX2, SSE4.2-only,
    # AVX-only and MKL-compatible kernels the weights differed by <= 7.1 u max|W| (u = 2^-24); allowed 10x. The start
    # weights are the helper's first draws from the seed. Another refresh schedule or eps placement: >= 1e-4.
    gen = torch.Generator().manual_seed(14)
    shapes = [(12, 6), (6, 12), (8, 8), (5, 20), (20, 5), (3, 9)]
    largest = max(float(torch.randn(s, generator=gen).abs().max()) for s in shapes)

    moved = steps_beside_oracle(
        lambda ours: GaLore(ours, lr=0.01, rank=4, update_proj_gap=3, scale=0.25, weight_decay=0.1, eps=1e-6),
        lambda theirs: OracleGaLore(
            [{"params": theirs, "rank": 4, "update_proj_gap": 3, "scale": 0.25, "projection_type": "std"}],
            lr=0.01,
            weight_decay=0.1,
            eps=1e-6,
        ),
        shapes=shapes,
        seed=14,
        atol=71 * U * 1.1 * largest,  # 1.1: |W| grows by < 10% in 8 steps of lr 0.01
    )
    assert moved > 1e-2


# --- robustness: failures, None grads, closure, resume ----------------------------------------------------


def test_failed_refresh_keeps_projection_counts_and_raises_on_the_third(monkeypatch) -> None:
    param = nn.Parameter(torch.zeros(6, 10))
    opt = make([param], update_proj_gap=2)
    gen = torch.Generator().manual_seed(15)
    set_grads([param], [torch.randn(6, 10, generator=gen)])
    opt.step()
    kept = opt.state[param]["projection"].clone()

    def failing(*args: Any, **kwargs: Any) -> None:
        raise SolverError("injected")

    monkeypatch.setattr(linalg, "truncated_svd", failing)
    for t in (2, 3):  # step 2 is scheduled; step 3 retries the overdue refresh
        before = param.detach().clone()
        set_grads([param], [torch.randn(6, 10, generator=gen)])
        opt.step()
        assert torch.equal(opt.state[param]["projection"], kept)
        assert opt.solver_failures == t - 1 and opt.state[param]["svd_failures"] == t - 1
        assert not torch.equal(param.detach(), before)  # the step still happens with the old projection
    set_grads([param], [torch.randn(6, 10, generator=gen)])
    with pytest.raises(SolverError, match="3 times in a row"):
        opt.step()


def test_failed_first_svd_skips_only_that_matrix_of_a_batch() -> None:
    """A NaN gradient makes the real SVD fail (linalg raises SolverError after its float64 retry)."""
    good, bad = nn.Parameter(torch.zeros(5, 7)), nn.Parameter(torch.zeros(5, 7))
    opt = make([good, bad])
    g_bad = torch.randn(5, 7)
    g_bad[0, 0] = float("nan")
    set_grads([good, bad], [torch.randn(5, 7), g_bad])
    opt.step()
    assert opt.solver_failures == 1
    assert "projection" in opt.state[good] and float(good.detach().abs().max()) > 0
    assert "projection" not in opt.state[bad] and torch.equal(bad.detach(), torch.zeros(5, 7))
    assert opt.state[bad]["svd_failures"] == 1
    set_grads([good, bad], [torch.randn(5, 7), torch.randn(5, 7)])
    opt.step()
    assert opt.state[bad]["svd_failures"] == 0 and opt.state[bad]["step"] == 1 and opt.state[good]["step"] == 2


def test_none_grad_closure_and_grad_not_mutated() -> None:
    a, b = nn.Parameter(torch.randn(6, 4)), nn.Parameter(torch.randn(4, 6))
    opt = make([a, b])
    b_before = b.detach().clone()
    g = torch.randn(6, 4)

    def closure() -> Tensor:
        a.grad = g.clone()
        return torch.tensor(3.0)

    assert float(opt.step(closure)) == 3.0
    assert torch.equal(a.grad, g)
    assert torch.equal(b.detach(), b_before) and len(opt.state[b]) == 0  # no state, no weight decay


def test_one_dimensional_parameter_is_rejected() -> None:
    with pytest.raises(ValueError, match="1-D parameter"):
        GaLore([nn.Parameter(torch.zeros(5))])
    with pytest.raises(ValueError, match="proj_type"):
        GaLore([nn.Parameter(torch.zeros(5, 5))], proj_type="full")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_resume_is_bit_identical_across_a_refresh(dtype: torch.dtype) -> None:
    assert_resume_is_bit_identical(
        lambda params: make(params, update_proj_gap=2, reproject_moments=True),
        shapes=[(6, 10), (6, 10), (10, 6), (3, 2, 2, 2)],
        dtype=dtype,
        seed=16,
        loaded_dtypes={"projection": torch.float32},
    )


def test_randomized_svd_is_deterministic_and_finds_an_exactly_low_rank_subspace() -> None:
    g = known_matrix(20, 30, [5.0, 3.0, 1.0], seed=17)
    projections = []
    for _ in range(2):
        param = nn.Parameter(torch.zeros(20, 30))
        opt = make([param], svd_method="randomized", svd_seed=3)
        set_grads([param], [g])
        opt.step()
        projections.append(opt.state[param]["projection"])
    assert torch.equal(projections[0], projections[1])
    exact = top_basis(g, 3, right=False)
    # The projection is the top-3 right singular vectors of B = Q^T G^T (Q: G^T's 30 x 8 sketch basis after two power
    # steps). For the rank-3 G they span range(G) whatever Q, while B keeps rank 3: sigma_3(B) >= sigma_3(G) / 2, as Q
    # nearly contains range(G^T). Float32 turns them by (the float32 matrix's tail u ||G||_F, B's product gamma_m
    # sqrt(r w) ||G||, the SVD's backward error c d u ||B||) / sigma_3(B) (Wedin), and P P^T is a projector to
    # 2 c d u: ~2e-4. A basis of the sketch's noise directions, or of the other side, is off by O(1).
    m, r, w, d, sigma_3 = 30, 3, 8, 30, 1.0
    tilt = (U * math.sqrt(35.0) + gamma(m) * math.sqrt(r * w) * 5.0 + C * d * U * 5.0) / (sigma_3 / 2)
    atol = tilt + 2 * C * d * U
    torch.testing.assert_close(projections[0].to(F64) @ projections[0].T.to(F64), exact @ exact.T, rtol=0, atol=atol)


# --- registry entry -------------------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.conv = nn.Conv2d(2, 4, 3)
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 5)

    def forward(self, tokens: Tensor, image: Tensor) -> Tensor:
        h = self.embed(tokens).mean(1) + self.conv(image).mean((1, 2, 3))[:, None]
        return self.head(torch.relu(self.body(h)))


def test_entry_routing_defaults_and_exact_state_bytes() -> None:
    entry = registry.get("galore")
    assert entry.lr_keys == ("lr", "adamw_lr")
    assert {k: entry.defaults[k] for k in ("lr", "rank", "update_proj_gap", "scale", "eps")} == {
        "lr": 0.02,
        "rank": 128,
        "update_proj_gap": 200,
        "scale": 0.3,
        "eps": 1e-6,
    }  # RACS/Alice paper Table 7 (60M row) and the reference code's eps
    torch.manual_seed(0)
    model = Net()
    opt, routing = registry.build_with_routing("galore", model, {"rank": 3, "update_proj_gap": 2})
    assert set(routing.structured) == {"conv.weight", "body.weight", "head.weight"}  # head: paper's 'Ppl.'
    assert set(routing.fallback) == {"embed.weight", "conv.bias", "body.bias", "head.bias"}
    for _ in range(3):
        opt.zero_grad()
        model(torch.randint(11, (4, 3)), torch.randn(4, 2, 5, 5)).square().mean().backward()
        opt.step()
    # conv (4, 18) wide -> left: U 4x3 + moments 2 x (3x18); body (16, 8) tall -> right: V 3x8 + 2 x (16x3);
    # head (5, 16) wide -> left: U 5x3 + 2 x (3x16); float32 = 4 bytes each.
    structured = 4 * ((12 + 108) + (24 + 96) + (15 + 96))
    # torch AdamW: exp_avg + exp_avg_sq float32 per element + a float32 step per tensor (11*8, 4, 16, 5).
    fallback = sum(8 * n + 4 for n in (88, 4, 16, 5))
    assert measure.state_bytes(opt) == structured + fallback
    shapes = dict((n, tuple(p.shape)) for n, p in model.named_parameters())
    hp = registry.resolve_hparams("galore", {"rank": 3})
    analytic = entry.state_bytes([shapes[n] for n in routing.structured], [shapes[n] for n in routing.fallback], hp)
    assert analytic == structured + fallback
    reverse, _ = registry.build_with_routing("galore", model, {"rank": 3, "proj_type": "reverse_std"})
    for _ in range(2):
        reverse.zero_grad()
        model(torch.randint(11, (4, 3)), torch.randn(4, 2, 5, 5)).square().mean().backward()
        reverse.step()
    # reverse_std: conv -> right: V^T 3x18 + 2 x (4x3); body -> left: U 16x3 + 2 x (3x8);
    # head -> right: V^T 3x16 + 2 x (5x3)
    reversed_structured = 4 * ((54 + 24) + (48 + 48) + (48 + 30))
    assert measure.state_bytes(reverse) == reversed_structured + fallback
    hp_reverse = registry.resolve_hparams("galore", {"rank": 3, "proj_type": "reverse_std"})
    structured_shapes = [shapes[n] for n in routing.structured]
    assert entry.state_bytes(structured_shapes, [], hp_reverse) == reversed_structured
    _, to_adam = registry.build_with_routing("galore", model, {"head_to_fallback": True})
    assert "head.weight" in to_adam.fallback
