"""Tests for structbench.optim.asgo (ASGO, Algorithm 2; DASGO, Algorithm 3 of An et al. 2025).

What each test checks against:
- Closed forms derived by hand from the algorithm boxes, in float64: with G = U diag(s) V^T built from
  known factors, one ASGO step is -lr U diag((1 - b1) s / sqrt((1 - b2) s^2 + eps)) V^T (eps inside the
  root, no bias correction), and -lr U diag((1 - b1) s / (sqrt(1 - b2) s + eps)) V^T with eps outside;
  one DASGO step scales column j by (1 - b1) / sqrt((1 - b2) ||G_:j||^2 + eps); a vector steps by
  -lr m / sqrt(v + eps) with v the EMA of ||g||^2 (the AdaGrad-Norm form of App. B (i)).
- Multi-step runs against Algorithm 2 written out in the test with float64 eigh (side rule and switch,
  stale roots with tau > 1).
- Prop. 1 / App. G: ASGO(beta1 = beta2 = 0, eps = 0, tau = 1) equals Muon(mu = 0) -- against U V^T from
  torch.linalg.svd in the test, the compact-SVD factor for rank-deficient G, and the registry's `muon`
  (exact-SVD polar factor, no scale); App. C.3 Eq. 4 with beta2 = 0 equals Muon with momentum.
- The AdaGrad inequality of the Theorem 1 proof (Eq. 9 summed): for Algorithm 1 (accumulated V, eps
  outside), sum_t tr(G_t^T Lambda_t^{-1} G_t) <= 2 tr((sum_t G_t G_t^T)^{1/2}), with the left side read off
  the optimizer's own updates; Lemmas 3 and 4 and the Shampoo comparison (Sec. 4) as property tests.
- Measured state bytes against the registry formulas for the switches the conformance kit does not cover.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

import structbench.optim.asgo as asgo_module
from structbench import measure
from structbench.errors import SolverError
from structbench.optim import registry
from structbench.optim.asgo import ASGO, DASGO
from tests.support.newton_schulz import gamma

F64 = torch.float64


def _orthonormal(rows: int, cols: int, seed: int) -> Tensor:
    q, _ = torch.linalg.qr(torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=F64))
    return q


def _with_singular_values(rows: int, cols: int, s: list[float], seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(G, U, V) with G = U diag(s) V^T, U (rows x r) and V (cols x r) orthonormal, r = len(s)."""
    u, v = _orthonormal(rows, len(s), seed), _orthonormal(cols, len(s), seed + 1)
    return u @ torch.diag(torch.tensor(s, dtype=F64)) @ v.T, u, v


def _run(optimizer_cls: type, w0: Tensor, grads: list[Tensor], **kwargs: object) -> tuple[list[Tensor], dict]:
    """Parameters after each step of `optimizer_cls` fed `grads`, and the parameter's final optimizer state."""
    w = nn.Parameter(w0.clone())
    optimizer = optimizer_cls([w], **kwargs)
    trajectory = []
    for g in grads:
        w.grad = g.clone()
        optimizer.step()
        trajectory.append(w.detach().clone())
    return trajectory, optimizer.state[w]


def _psd_power(a: Tensor, power: float) -> Tensor:
    evals, evecs = torch.linalg.eigh(a.to(F64))
    return (evecs * evals.clamp_min(0).pow(power)) @ evecs.T


def _algorithm2(w0: Tensor, grads: list[Tensor], lr: float, b1: float, b2: float, eps: float, tau: int, left: bool):
    """Algorithm 2 written out in float64 (eigh for (V + eps I)^{-1/2})."""
    w, m = w0.to(F64).clone(), torch.zeros_like(w0, dtype=F64)
    k = w0.shape[0] if left else w0.shape[1]
    v, inv_root = torch.zeros(k, k, dtype=F64), None
    out = []
    for t, g in enumerate(grads):
        g = g.to(F64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * (g @ g.T if left else g.T @ g)
        if t % tau == 0:
            inv_root = _psd_power(v + eps * torch.eye(k, dtype=F64), -0.5)
        w = w - lr * (inv_root @ m if left else m @ inv_root)
        out.append(w.clone())
    return out


def _polar_bound(a: Tensor, perturbation: float) -> float:
    """Frobenius bound on ||polar_svd(A^) - polar(A)|| in float32 for A^ within `perturbation` of the full-rank A:
    2 (||dA||_F + the SVD's backward error 3 c d u sqrt(r) ||A||_2) / s_min (Li), plus U V^T's distance from U' V'^T
    (2 sqrt(r) c d u) and the r-term product's rounding r gamma_r (C-S)."""
    s = torch.linalg.svdvals(a.to(F64))
    r, d = min(a.shape), max(a.shape)
    backward = 3 * C * math.sqrt(r) * d * U32 * float(s[0])
    return 2 * (perturbation + backward) / float(s[-1]) + 2 * math.sqrt(r) * C * d * U32 + r * gamma(r)


def _grads(shape: tuple[int, ...], count: int, seed: int = 0, dtype: torch.dtype = F64) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(count)]


# Rounding-error bounds behind the tolerances (Higham, "Accuracy and Stability of Numerical Algorithms"). ASGO keeps V
# and its root in float32 whatever the parameter dtype (u = 2^-24; the momentum and W in the parameter's dtype): a
# product with inner size k errs by <= gamma_k |A| |B| entrywise, gamma_k = k u / (1 - k u); float32 eigh of a k x k
# matrix is exact for V + E, ||E||_2 <= c k u ||V||_2, its eigenvectors within c k u of orthonormal, c = C = 4
# (LAPACK's "modestly growing" p(k), taken as 4 k); a function f of the eigenvalues then moves by <= max |f'| ||E||
# (the largest divided difference, Daleckii–Krein) over the perturbed spectrum.
U32, U64 = 2.0**-24, 2.0**-53
C = 4


def _root_slope(lam: Tensor, error: float, eps: float, placement: str) -> tuple[float, float]:
    """(max divided difference, max f) of the root f over the spectrum of V widened by `error` (the nonzero part when
    eps = 0): (x + eps)^{-1/2} inside, (sqrt(x) + eps)^{-1} outside, x^{-1/2} for eps = 0, whose jump to the
    pseudo-inverse's 0 at a null eigenvalue has divided difference low^{-3/2}."""
    low = float(lam.min() if eps > 0 else lam[lam > lam.max() * 1e-9].min()) - error
    assert low > 0 or (eps > 0 and placement == "inside"), "the spectrum is not resolved: no bound"
    low = max(low, 0.0)
    if eps == 0:
        return low**-1.5, low**-0.5
    if placement == "inside":
        return 0.5 * (low + eps) ** -1.5, (low + eps) ** -0.5
    return 1 / (2 * math.sqrt(low) * (math.sqrt(low) + eps) ** 2), 1 / (math.sqrt(low) + eps)


def _asgo_bounds(
    w0: Tensor,
    grads: list[Tensor],
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    tau: int = 1,
    left: bool = True,
    accumulation: str = "ema",
    placement: str = "inside",
    source: str = "grad",
    newton: bool = False,
) -> tuple[list[float], list[float]]:
    """Frobenius bounds on ||W_t - W_t^exact|| after each ASGO step (first order, eigh roots unless `newton`):
    - V (float32): the cast and the product x x^T (inner size n) gamma_{n+2} ||x||_F^2 times its weight, the EMA's
      scaling and sum gamma_3 ||V||, an earlier error carried by b2 (1 for "sum");
    - the root at a refresh: f(V + E) with E that plus eigh's c k u ||V||, so ||dR|| <= max|f'| ||E|| + (3 u + 2 c k u +
      k gamma_{k+1}) max f (rsqrt, V's distance from orthonormal, the rebuild); kept between refreshes; Newton's
      coupled iteration is as accurate (Guo & Higham 2006: stable) plus its stop at max|M - I| <= 1e-6, k 1e-6 / 2
      relative;
    - the update R m: ||dR|| ||m||_F + max f (||dm||_F + gamma_k sqrt(k) ||m||_F), dm the momentum's lerp (4 u_p
      (|m| + |g|)) and its float32 cast (u ||m||);
    - W adds one rounding of the parameter dtype per step.
    Returns the W bounds and the roots' ||dR||_2 bounds, per step."""
    u_param = U32 if w0.dtype == torch.float32 else U64

    def matrix(t: Tensor) -> Tensor:  # ASGO's view: a vector as a 1 x d row
        return t.reshape(1, -1) if t.ndim < 2 else t.reshape(t.shape[0], -1)

    first = matrix(grads[0])
    k = first.shape[0] if left else first.shape[1]
    v = torch.zeros(k, k, dtype=F64)
    m = torch.zeros_like(first, dtype=F64)
    w_norm = float(torch.linalg.vector_norm(w0.to(F64)))
    ev = dr = r_max = 0.0
    bound, out, roots = 0.0, [], []
    for t, g in enumerate(grads):
        g = matrix(g.to(F64))
        dm = 4 * u_param * float(torch.linalg.matrix_norm(m) + torch.linalg.matrix_norm(g))
        m = b1 * m + (1 - b1) * g
        x = g if source == "grad" else m
        x = x if left else x.T
        weight = (1 - b2) if accumulation == "ema" else 1.0
        carry = b2 if accumulation == "ema" else 1.0
        v = carry * v + weight * x @ x.T
        v_norm = float(torch.linalg.matrix_norm(v, ord=2))
        ev = carry * ev + weight * gamma(x.shape[1] + 2) * float(torch.linalg.matrix_norm(x)) ** 2 + gamma(3) * v_norm
        if t % tau == 0:
            error = ev + (C * k * U32 * v_norm if k > 1 else 0.0)
            slope, r_max = _root_slope(torch.linalg.eigvalsh(v), error, eps, placement)
            forming = 3 * U32 + (2 * C * k * U32 + k * gamma(k + 1) if k > 1 else U32)
            dr = slope * error + forming * r_max + (k * 1e-6 / 2 * r_max if newton else 0.0)
        m_norm = float(torch.linalg.matrix_norm(m))
        update = dr * m_norm + r_max * (dm + U32 * m_norm + gamma(k) * math.sqrt(k) * m_norm)
        w_norm += lr * r_max * m_norm * math.sqrt(k)
        bound += lr * update + u_param * w_norm
        out.append(bound)
        roots.append(dr)
    return out, roots


# ---- ASGO: single step, eps placement, side, tau ----


@pytest.mark.parametrize("shape", [(5, 9), (9, 5)])
def test_asgo_first_step_is_the_hand_derived_closed_form(shape):
    s = [3.0, 1.0, 0.2, 0.05]
    g, u, v = _with_singular_values(*shape, s)
    lr, b1, b2, eps = 0.3, 0.9, 0.95, 1e-3
    w0 = torch.randn(*shape, dtype=F64)
    (w1,), _ = _run(ASGO, w0, [g], lr=lr, beta1=b1, beta2=b2, eps=eps)
    s_t = torch.tensor(s, dtype=F64)
    expected = w0 - lr * u @ torch.diag((1 - b1) * s_t / torch.sqrt((1 - b2) * s_t**2 + eps)) @ v.T
    # One float32 step (`_asgo_bounds`: V's products, eigh's backward error through (x + eps)^{-1/2}'s slope at the
    # smallest eigenvalue, the rebuild, R m): ~1e-5 here; eps outside the root or a bias correction: >= 1e-2.
    (bound,), _ = _asgo_bounds(w0, [g], lr, b1, b2, eps, left=shape[0] < shape[1])
    torch.testing.assert_close(w1, expected, rtol=0, atol=bound)


def test_no_bias_correction_early_step_is_045_of_the_polar_factor():
    """No bias correction (Algorithm 2): beta1 0.9, beta2 0.95, eps 0 -> the first update is 0.1 / sqrt(0.05) U V^T."""
    g, u, v = _with_singular_values(4, 7, [2.0, 1.0, 0.5, 0.25])
    (w1,), _ = _run(ASGO, torch.zeros(4, 7, dtype=F64), [g], lr=1.0, beta1=0.9, beta2=0.95, eps=0.0)
    # `_asgo_bounds` with eps = 0 (the slope of x^{-1/2} at 0.05 x 0.25^2); a bias-corrected step is 0.1 / 0.05 off.
    (bound,), _ = _asgo_bounds(torch.zeros(4, 7, dtype=F64), [g], 1.0, 0.9, 0.95, 0.0)
    torch.testing.assert_close(-w1, 0.1 / math.sqrt(0.05) * u @ v.T, rtol=0, atol=bound)


def test_eps_is_inside_the_root_by_default_and_outside_with_the_switch():
    s = [2.0, 0.5, 0.1]
    g, u, v = _with_singular_values(3, 6, s)
    lr, b2, eps = 1.0, 0.5, 0.25
    s_t = torch.tensor(s, dtype=F64)
    inside = -lr * u @ torch.diag(s_t / torch.sqrt((1 - b2) * s_t**2 + eps)) @ v.T
    outside = -lr * u @ torch.diag(s_t / (math.sqrt(1 - b2) * s_t + eps)) @ v.T
    assert (inside - outside).abs().max() > 0.05  # the two placements are far apart at this eps
    w0 = torch.zeros(3, 6, dtype=F64)
    (default,), _ = _run(ASGO, w0, [g], lr=lr, beta1=0.0, beta2=b2, eps=eps)
    (switched,), _ = _run(ASGO, w0, [g], lr=lr, beta1=0.0, beta2=b2, eps=eps, eps_placement="outside")
    # `_asgo_bounds` for each placement (~1e-5), far below their 0.05 difference.
    for got, want, placement in ((default, inside, "inside"), (switched, outside, "outside")):
        (bound,), _ = _asgo_bounds(w0, [g], lr, 0.0, b2, eps, placement=placement)
        torch.testing.assert_close(got, want, rtol=0, atol=bound)


@pytest.mark.parametrize(
    ("shape", "side", "left"),
    [
        ((4, 10), "smaller", True),
        ((10, 4), "smaller", False),
        ((6, 6), "smaller", False),
        ((10, 4), "left", True),
        ((4, 10), "right", False),
    ],
)
def test_side_rule_and_switch(shape, side, left):
    """Alg. 2 (i): m < n -> G G^T on the left, otherwise (square included) G^T G on the right."""
    grads = _grads(shape, 3)
    w0 = torch.randn(*shape, dtype=F64)
    lr, b1, b2, eps = 0.1, 0.8, 0.6, 1e-2
    trajectory, state = _run(ASGO, w0, grads, lr=lr, beta1=b1, beta2=b2, eps=eps, side=side)
    k = shape[0] if left else shape[1]
    assert state["precond"].shape == (k, k)
    expected = _algorithm2(w0, grads, lr, b1, b2, eps, tau=1, left=left)
    # Three float32 steps (`_asgo_bounds`, per step); the other side differs by > 1e-3 (checked below).
    bounds, _ = _asgo_bounds(w0, grads, lr, b1, b2, eps, left=left)
    for got, want, bound in zip(trajectory, expected, bounds, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=bound)
    other = _algorithm2(w0, grads, lr, b1, b2, eps, tau=1, left=not left)
    assert (trajectory[-1] - other[-1]).abs().max() > 1e-3  # after two steps the sides differ


def test_vectors_get_the_scalar_adagrad_norm_preconditioner_whatever_the_side():
    """App. B (i): a vector's statistic is the EMA of ||g||^2 and it steps by -lr m / sqrt(v + eps)."""
    grads = _grads((7,), 3, seed=3)
    lr, b1, b2, eps = 0.2, 0.9, 0.95, 1e-4
    w0 = torch.randn(7, dtype=F64)
    for side in ("smaller", "right"):
        trajectory, state = _run(ASGO, w0, grads, lr=lr, beta1=b1, beta2=b2, eps=eps, side=side)
        assert state["precond"].shape == (1, 1)
        x, m, v = w0.clone(), torch.zeros(7, dtype=F64), 0.0
        # `_asgo_bounds` for the 1 x 7 row (k = 1: no eigh, the root is (v + eps)^{-1/2}): ~1e-6. A root of v alone
        # (eps outside) or of ||g|| instead of ||g||^2 is off by >= 1e-2.
        bounds, _ = _asgo_bounds(w0, grads, lr, b1, b2, eps)
        for g, got, bound in zip(grads, trajectory, bounds, strict=True):
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * float(g @ g)
            x = x - lr * m / math.sqrt(v + eps)
            torch.testing.assert_close(got, x, rtol=0, atol=bound)


def test_tau_refreshes_the_root_at_multiples_of_tau_and_updates_v_every_step():
    shape, tau, steps = (4, 9), 3, 7
    grads = _grads(shape, steps, seed=5)
    lr, b1, b2, eps = 0.05, 0.9, 0.7, 1e-2
    w = nn.Parameter(torch.randn(*shape, dtype=F64))
    w0 = w.detach().clone()
    optimizer = ASGO([w], lr=lr, beta1=b1, beta2=b2, eps=eps, tau=tau)
    roots, stats = [], []
    for g in grads:
        w.grad = g.clone()
        optimizer.step()
        roots.append(optimizer.state[w]["inv_root"].clone())
        stats.append(optimizer.state[w]["precond"].clone())
    for t in range(1, steps):
        assert not torch.equal(stats[t], stats[t - 1])  # V moves every step
        refreshed = t - t % tau
        assert torch.equal(roots[t], roots[refreshed])  # the root of the last multiple of tau
        if t % tau == 0:
            assert not torch.equal(roots[t], roots[t - 1])
    v3 = sum(b2 ** (3 - i) * (1 - b2) * grads[i] @ grads[i].T for i in range(4))
    # The root refreshed at t = 3 from V accumulated over four float32 steps, within `_asgo_bounds`' root bound
    # (max|f'| ||E|| + the rebuild's rounding); W after 7 steps within its W bound. A root from V_2 or V_4 (stale by
    # one step) is off by >= 1e-2.
    bounds, root_bounds = _asgo_bounds(w0, grads, lr, b1, b2, eps, tau=tau)
    torch.testing.assert_close(
        roots[3].to(F64), _psd_power(v3 + eps * torch.eye(4, dtype=F64), -0.5), rtol=0, atol=root_bounds[3]
    )
    expected = _algorithm2(w0, grads, lr, b1, b2, eps, tau=tau, left=True)
    torch.testing.assert_close(w.detach(), expected[-1], rtol=0, atol=bounds[-1])
    every_step = _algorithm2(w0, grads, lr, b1, b2, eps, tau=1, left=True)
    assert (expected[-1] - every_step[-1]).abs().max() > 1e-4  # the stale root is really used


# ---- ASGO reduces to Muon (Prop. 1, App. G; Eq. 4) ----

MUON_SETTINGS = {"beta1": 0.0, "beta2": 0.0, "eps": 0.0, "tau": 1}


@pytest.mark.parametrize("shape", [(6, 11), (11, 6), (7, 7)])
def test_prop1_asgo_without_momentum_and_eps_is_muon(shape):
    """Each step of ASGO(0, 0, eps=0, tau=1) is -lr U V^T of that step's gradient (U V^T from the test's SVD)."""
    rows, cols = shape
    r = min(shape)
    grads = [_with_singular_values(rows, cols, [1.0 + 0.3 * i for i in range(r)], seed=10 * k)[0] for k in range(3)]
    lr = 0.07
    trajectory, _ = _run(ASGO, torch.zeros(shape, dtype=F64), grads, lr=lr, **MUON_SETTINGS)
    previous = torch.zeros(shape, dtype=F64)
    for g, w in zip(grads, trajectory, strict=True):
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        # One step of `_asgo_bounds` with V = G G^T (cond(V) = cond(G)^2 <= 7.8) and the pseudo-inverse root, plus
        # W's two float64 roundings (and the difference's): ~1e-6. A V from G^T G on the wrong side is off by O(1).
        (bound,), _ = _asgo_bounds(torch.zeros(shape, dtype=F64), [g], lr, 0.0, 0.0, 0.0, left=rows < cols)
        atol = bound + 3 * U64 * float(w.abs().max() + previous.abs().max())
        torch.testing.assert_close(w - previous, -lr * u @ vh, rtol=0, atol=atol)
        previous = w


def test_prop1_with_rank_deficient_gradient_uses_the_compact_svd():
    g, u, v = _with_singular_values(8, 12, [4.0, 1.0, 0.3])
    (w1,), _ = _run(ASGO, torch.zeros(8, 12), [g.float()], lr=1.0, **MUON_SETTINGS)
    # float32 parameters: `_asgo_bounds` on the rank-3 part (V's null eigenvalues must come out below the resolution
    # k eps_32 lambda_max = 2 k u ||V||, eigh's backward error for c = 2, else the update moves along arbitrary null
    # directions, O(1)), plus G's float32 cast (u ||G||_F through the same slope).
    (bound,), _ = _asgo_bounds(torch.zeros(8, 12), [g.float()], 1.0, 0.0, 0.0, 0.0)
    torch.testing.assert_close(-w1.to(F64), u @ v.T, rtol=0, atol=bound)


def _pair_bound(shape: tuple[int, int], asgo_hp: dict, steps: int = 4) -> float:
    """|W_asgo - W_muon| (entrywise, both float32 from 0) after the registry pair's steps: ASGO within `_asgo_bounds` of
    W = -lr sum polar(X_t) (X the gradient, or the momentum for "momentum"), Muon's polar_svd within `_polar_bound`
    of the same (its momentum is ASGO's, the same lerp; its error counted in ASGO's dm), plus W's float32 rounding."""
    grads = _grads(shape, steps, seed=21, dtype=torch.float32)
    b1, lr = asgo_hp.get("beta1", 0.9), asgo_hp["lr"]
    source = asgo_hp.get("precondition_from", "grad")
    left = shape[0] < shape[1]
    bounds, _ = _asgo_bounds(torch.zeros(shape), grads, lr, b1, 0.0, 0.0, left=left, source=source)
    muon, m, w = 0.0, torch.zeros(shape, dtype=F64), 0.0
    for g in grads:
        m = b1 * m + (1 - b1) * g.to(F64)
        muon += lr * _polar_bound(m if source == "momentum" else g.to(F64), 0.0) + U32 * (w + lr * min(shape))
        w += lr * min(shape)
    return bounds[-1] + muon


def _registry_pair(shape: tuple[int, int], asgo_hp: dict, muon_hp: dict, steps: int = 4) -> tuple[Tensor, Tensor]:
    results = []
    for name, hp in (("asgo", asgo_hp), ("muon", muon_hp)):
        w = nn.Parameter(torch.zeros(shape))
        optimizer = registry.make_optimizer(name, [("w", w)], **hp)
        for g in _grads(shape, steps, seed=21, dtype=torch.float32):
            w.grad = g
            optimizer.step()
        results.append(w.detach().clone())
    return results[0], results[1]


@pytest.mark.parametrize("shape", [(6, 14), (14, 6)])
def test_prop1_against_the_registry_muon(shape):
    exact_muon = {"polar": "svd", "scale": "none", "nesterov": False, "lr": 0.05}
    asgo_w, muon_w = _registry_pair(shape, {**MUON_SETTINGS, "lr": 0.05}, {**exact_muon, "momentum": 0.0})
    # `_pair_bound` (~1e-4 here: V = G G^T squares cond(G)); a Muon with momentum, or ASGO with eps, moves W by >= 1e-3.
    torch.testing.assert_close(asgo_w, muon_w, rtol=0, atol=_pair_bound(shape, {**MUON_SETTINGS, "lr": 0.05}))


def test_eq4_momentum_preconditioner_with_beta2_zero_is_muon_with_momentum():
    """App. C.3: V from M_t with beta2 = 0 and eps = 0 gives polar(M_t), Muon's update with (EMA) momentum."""
    asgo_hp = {"beta1": 0.9, "beta2": 0.0, "eps": 0.0, "precondition_from": "momentum", "lr": 0.05}
    muon_hp = {"momentum": 0.9, "nesterov": False, "polar": "svd", "scale": "none", "lr": 0.05}
    asgo_w, muon_w = _registry_pair((6, 14), asgo_hp, muon_hp)
    torch.testing.assert_close(asgo_w, muon_w, rtol=0, atol=_pair_bound((6, 14), asgo_hp))  # as above
    default_w, _ = _registry_pair((6, 14), {**asgo_hp, "precondition_from": "grad"}, muon_hp)
    assert (default_w - muon_w).abs().max() > 1e-3  # Alg. 2's V from G_t is a different algorithm


# ---- theory: the inequalities behind Theorem 1 ----


def test_algorithm1_trajectory_satisfies_the_adagrad_inequality_of_theorem_1():
    """Eq. (9) summed: sum_t tr(G_t^T Lambda_t^{-1} G_t) <= 2 tr((sum_t G_t G_t^T)^{1/2}) for Algorithm 1."""
    shape, steps, lr = (5, 8), 12, 0.1
    grads = _grads(shape, steps, seed=7)
    algorithm1 = {"beta1": 0.0, "accumulation": "sum", "eps_placement": "outside", "eps": 1e-3, "side": "left"}
    trajectory, _ = _run(ASGO, torch.zeros(shape, dtype=F64), grads, lr=lr, **algorithm1)
    previous, lhs = torch.zeros(shape, dtype=F64), 0.0
    for g, w in zip(grads, trajectory, strict=True):
        preconditioned = (previous - w) / lr  # Lambda_t^{-1} G_t, from the optimizer's own step
        lhs += float((g * preconditioned).sum())
        previous = w
    rhs = 2 * float(torch.trace(_psd_power(sum(g @ g.T for g in grads), 0.5)))
    # The theorem holds for the exact steps; lhs reads float32 ones, within `_asgo_bounds`' increments per step
    # (plus W's float64 rounding, twice, over lr), seen through <G_t, .>; rhs within `_trace_power_error`.
    bounds, _ = _asgo_bounds(
        torch.zeros(shape, dtype=F64), grads, lr, 0.0, 0.0, 1e-3, accumulation="sum", placement="outside"
    )
    previous_bound, slack = 0.0, 0.0
    for g, w, bound in zip(grads, trajectory, bounds, strict=True):
        step_error = (bound - previous_bound + 2 * U64 * float(torch.linalg.matrix_norm(w))) / lr
        slack += float(torch.linalg.matrix_norm(g)) * step_error
        previous_bound = bound
    slack += 2 * _trace_power_error(sum(g @ g.T for g in grads), 0.5, 5 * gamma(8 + 12, U64))
    assert 0.5 * rhs < lhs <= rhs + slack  # tight enough that a wrong preconditioner would show


def _trace_power_error(a: Tensor, power: float, relative_input: float = 0.0) -> float:
    """Bound on |tr(_psd_power(A^, q)) - tr(A^q)| for symmetric PSD A (float64, A^ within `relative_input` ||A||_2 of
    A): float64 eigh is exact for A^ + E, ||E||_2 <= c n u ||A||, so each eigenvalue is within delta = (that +
    relative_input ||A||) of the exact one (Weyl) and x -> max(x, 0)^q (increasing) moves by at most
    f(l + delta) - f(l - delta) around the computed l (sqrt-like near 0, where the spectrum has zeros); the rebuild
    V f V^T (V within c n u of orthonormal) and the trace add (2 c n u + gamma_{n+2}) tr f."""
    n = a.size(-1)
    values = torch.linalg.eigvalsh(a)
    delta = (C * n * U64 + relative_input) * float(values.abs().max())
    upper = (values + delta).clamp_min(0.0).pow(power)
    lower = (values - delta).clamp_min(0.0).pow(power)
    return float((upper - lower).sum()) + (2 * C * n * U64 + gamma(n + 2, U64)) * float(upper.sum())


def _psd(seed: int, size: int, rank: int) -> Tensor:
    a = torch.randn(size, rank, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return a @ a.T


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 6), rank=st.integers(1, 6))
def test_lemma3_and_lemma4(seed, size, rank):
    x, y = _psd(seed, size, rank), _psd(seed + 1, size, rank)
    tr_sqrt = lambda a: float(torch.trace(_psd_power(a, 0.5)))  # noqa: E731
    # Each computed trace is within `_trace_power_error` of the exact one (x + y adds u ||x + y||); the diagonal's
    # roots and their sum round by (1 + gamma_size) relative. A lemma stated the other way round fails by O(1).
    errors = sum(_trace_power_error(a, 0.5) for a in (x, y)) + _trace_power_error(x + y, 0.5, U64)
    assert tr_sqrt(x + y) <= tr_sqrt(x) + tr_sqrt(y) + errors  # Lemma 3
    diagonal = float(torch.diagonal(x).sqrt().sum())
    assert tr_sqrt(x) <= diagonal * (1 + U64 + gamma(size, U64)) + _trace_power_error(x, 0.5)  # Lemma 4


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 5), cols=st.integers(1, 5), count=st.integers(1, 4))
def test_asgo_quantity_is_below_shampoos(seed, rows, cols, count):
    """Sec. 4: tr((sum G G^T)^{1/2}) <= tr((sum G G^T)^{1/4}) tr((sum G^T G)^{1/4})."""
    grads = _grads((rows, cols), count, seed=seed)
    left, right = sum(g @ g.T for g in grads), sum(g.T @ g for g in grads)
    tr_pow = lambda a, q: float(torch.trace(_psd_power(a, q)))  # noqa: E731
    # Each trace within `_trace_power_error` (the sums of products round by gamma_{rows+cols+count} relative), the
    # product of two by u: computed lhs - its error <= (computed factors + their errors) products.
    sums = gamma(rows + cols + count, U64)
    factors = (tr_pow(left, 0.25) + _trace_power_error(left, 0.25, sums)) * (
        tr_pow(right, 0.25) + _trace_power_error(right, 0.25, sums)
    )
    assert tr_pow(left, 0.5) <= factors * (1 + U64) + _trace_power_error(left, 0.5, sums)


# ---- switches, numerics, failures ----


def test_update_rms_and_weight_decay_switches():
    shape, lr, wd = (4, 9), 0.1, 0.5
    g = _grads(shape, 1)[0]
    w0 = torch.randn(*shape, dtype=F64)
    (plain,), _ = _run(ASGO, w0, [g], lr=lr)
    (rms,), _ = _run(ASGO, w0, [g], lr=lr, update_rms=0.2)
    step = (w0 - rms) / lr
    # The float32 update U is rescaled to norm 0.2 sqrt(36) by its float32 norm (gamma_36 / 2 + u relative) and a
    # product with a rounded constant (2 u); W = w0 - lr U and reading U back round by u_64 (|w0| + |W|) / lr per
    # entry. Both runs share U bit for bit (the same statistics), so the directions differ by that rescale's 3 u
    # and the read-back. A norm without sqrt(mn) (RMS 0.2 / 6) misses by 6x.
    read_back = U64 * float((w0.abs() + rms.abs() + plain.abs()).max()) / lr
    scaling = gamma(36) / 2 + 3 * U32
    norm = float(torch.linalg.matrix_norm(step))
    assert math.isclose(norm, 0.2 * math.sqrt(36), rel_tol=scaling + 6 * read_back / norm)
    plain_step = (w0 - plain) / lr
    atol = 2 * scaling + 12 * read_back / min(norm, float(plain_step.norm()))
    torch.testing.assert_close(step / step.norm(), plain_step / plain_step.norm(), rtol=0, atol=atol)
    (decayed,), _ = _run(ASGO, w0, [g], lr=lr, weight_decay=wd)
    # The same float32 update; the decay's product and constant, the step's add, and the test's own expression round
    # in float64: <= 4 u_64 (|w0| + |w0 - plain|). Decaying after the step (W_1 (1 - lr wd)) is off by lr^2 wd |U|.
    atol = 4 * U64 * float((w0.abs() + (w0 - plain).abs()).max())
    torch.testing.assert_close(decayed, plain - lr * wd * w0, rtol=0, atol=atol)


def test_newton_root_matches_eigh():
    grads = _grads((5, 12), 3, seed=2, dtype=torch.float32)
    w0 = torch.randn(5, 12)
    eigh, _ = _run(ASGO, w0, grads, eps=1e-2)
    newton, _ = _run(ASGO, w0, grads, eps=1e-2, root="newton")
    # Both within `_asgo_bounds` of the exact run (defaults lr 0.1, betas 0.9 / 0.95; Newton adds its stop at
    # max|M - I| <= 1e-6): ~1e-4. Newton's root of V without eps, or of V^2, is off by >= 1e-2.
    atol = sum(_asgo_bounds(w0, grads, 0.1, 0.9, 0.95, 1e-2, newton=newton)[0][-1] for newton in (False, True))
    torch.testing.assert_close(newton[-1], eigh[-1], rtol=0, atol=atol)
    with pytest.raises(ValueError, match="newton"):
        ASGO([nn.Parameter(torch.zeros(3, 4))], eps=0.0, root="newton")


def test_bfloat16_parameters_keep_float32_statistics():
    w = nn.Parameter(torch.randn(6, 10, dtype=torch.bfloat16))
    optimizer = ASGO([w])
    for g in _grads((6, 10), 2, dtype=torch.bfloat16):
        w.grad = g
        optimizer.step()
    state = optimizer.state[w]
    assert state["precond"].dtype == state["inv_root"].dtype == torch.float32
    assert state["momentum"].dtype == w.dtype == torch.bfloat16 and torch.isfinite(w.float()).all()


def test_grad_is_not_modified_and_none_grads_are_skipped():
    a, b = nn.Parameter(torch.randn(4, 6)), nn.Parameter(torch.randn(3, 3))
    optimizer = ASGO([a, b])
    g = torch.randn(4, 6)
    a.grad = g.clone()
    before_b = b.detach().clone()
    optimizer.step()
    assert torch.equal(a.grad, g) and torch.equal(b.detach(), before_b) and b not in optimizer.state


def test_solver_failure_keeps_the_previous_root_and_raises_on_the_third_in_a_row(monkeypatch):
    w = nn.Parameter(torch.randn(4, 7))
    optimizer = ASGO([w], eps=1e-3, root="eigh")
    grads = _grads((4, 7), 5, dtype=torch.float32)
    w.grad = grads[0]
    optimizer.step()
    root = optimizer.state[w]["inv_root"].clone()

    def failing(a):
        raise SolverError("injected")

    monkeypatch.setattr(asgo_module, "eigh_with_retry", failing)
    for count, g in enumerate(grads[1:3], start=1):
        w.grad = g
        optimizer.step()
        assert torch.equal(optimizer.state[w]["inv_root"], root) and optimizer.solver_failures == count
    w.grad = grads[3]
    with pytest.raises(SolverError, match="3 steps in a row"):
        optimizer.step()


def test_pseudo_inverse_root_with_zero_gradient_leaves_the_weight():
    (w1,), _ = _run(ASGO, torch.ones(3, 5), [torch.zeros(3, 5)], eps=0.0)
    assert torch.equal(w1, torch.ones(3, 5))


# ---- DASGO ----


def test_dasgo_step_is_the_hand_derived_column_scaling():
    shape, lr, b1, b2, eps = (5, 4), 0.3, 0.9, 0.99, 0.5
    grads = _grads(shape, 2, seed=4)
    w0 = torch.randn(*shape, dtype=F64)
    trajectory, _ = _run(DASGO, w0, grads, lr=lr, beta1=b1, beta2=b2, eps=eps)
    w, m, v = w0.clone(), torch.zeros(shape, dtype=F64), torch.zeros(shape[1], dtype=F64)
    dv, dw = torch.zeros_like(v), torch.zeros_like(w)
    for g, got in zip(grads, trajectory, strict=True):
        m = b1 * m + (1 - b1) * g
        # float32 column norms: the cast and the 5-term sum of squares (gamma_7 relative, nonnegative), the EMA
        # (gamma_3, earlier error carried by b2); + eps (u), rsqrt (2 u) halve it: the scale errs by dv / (2 (v +
        # eps)) + 3 u relative, the float32 momentum and the product add 2 u; W (float64) adds lr |update| times that.
        squares = torch.tensor([float(g[:, j] @ g[:, j]) for j in range(shape[1])], dtype=F64)
        dv = b2 * dv + (1 - b2) * gamma(7) * squares + gamma(3) * (b2 * v + (1 - b2) * squares)
        v = b2 * v + (1 - b2) * squares
        inside = torch.stack([m[:, j] / math.sqrt(v[j] + eps) for j in range(shape[1])], dim=1)
        outside = torch.stack([m[:, j] / (math.sqrt(v[j]) + eps) for j in range(shape[1])], dim=1)
        assert (inside - outside).abs().max() > 1e-2
        dw = dw + lr * inside.abs() * (dv / (2 * (v + eps)) + 5 * U32) + U64 * w.abs()
        w = w - lr * inside
        assert bool(((got - w).abs() <= dw).all())


def test_dasgo_left_side_scales_rows():
    g = _grads((3, 8), 1, seed=6)[0]
    (w1,), _ = _run(DASGO, torch.zeros(3, 8, dtype=F64), [g], lr=1.0, beta1=0.0, beta2=0.0, eps=0.0, side="left")
    # float32: the cast (u), the 8-term sum of squares (gamma_9, halved by the rsqrt, which adds 2 u), the product (u)
    # and the momentum's cast (u); lerp with weight 1 and W = 0 - U are exact. Column norms instead of rows: O(1).
    torch.testing.assert_close(-w1, g / g.norm(dim=1, keepdim=True), rtol=gamma(9) / 2 + 5 * U32, atol=0)


def test_dasgo_rejects_vectors():
    with pytest.raises(ValueError, match="matrices only"):
        DASGO([nn.Parameter(torch.zeros(5))])


# ---- routing and state bytes ----


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.hidden = nn.Linear(6, 9)
        self.head = nn.Linear(9, 4)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(torch.relu(self.hidden(self.embed(tokens))))


@pytest.mark.parametrize(
    ("name", "hp", "fallback"),
    [
        ("asgo", {}, set()),
        ("asgo", {"one_d": "adamw"}, {"hidden.bias", "head.bias"}),
        ("asgo", {"one_d": "adamw", "embeddings": "adamw"}, {"hidden.bias", "head.bias", "embed.weight"}),
        ("asgo", {"side": "right", "tau": 2}, set()),
        ("dasgo", {}, {"hidden.bias", "head.bias", "embed.weight"}),
        ("dasgo", {"embeddings": "dasgo", "side": "left"}, {"hidden.bias", "head.bias"}),
    ],
)
def test_routing_and_state_bytes_match_the_formula(name, hp, fallback):
    torch.manual_seed(0)
    model = _Net()
    optimizer, routing = registry.build_with_routing(name, model, hp)
    assert set(routing.fallback) == fallback and "head.weight" in routing.structured
    tokens = torch.randint(11, (16,))
    for _ in range(3):
        optimizer.zero_grad()
        model(tokens).square().mean().backward()
        optimizer.step()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    entry = registry.get(name)
    analytic = entry.state_bytes(
        [shapes[n] for n in routing.structured],
        [shapes[n] for n in routing.fallback],
        registry.resolve_hparams(name, hp),
    )
    assert measure.state_bytes(optimizer) == analytic


def test_asgo_state_bytes_for_gpt2_c_attn_are_the_papers_two_768_squared_matrices():
    """Sec. 7.2: for a 768 x 2304 weight ASGO keeps two 768 x 768 matrices plus the momentum (and structbench's
    float32 step and, for the default Newton–Schulz root, its int64 fallback counter)."""
    shape = (2304, 768)
    asgo_bytes = asgo_module.asgo_state_bytes([shape], [], registry.get("asgo").defaults)
    assert asgo_bytes == 4 * (2304 * 768 + 2 * 768**2 + 1) + 8
