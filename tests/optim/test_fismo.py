"""Tests for structbench.optim.fismo against independent facts.

- Hand-derived step: a diagonal gradient keeps every matrix diagonal, so one step of Algorithm 1 reduces to
  scalar arithmetic written out below with Python floats.
- A float64 transcription of Algorithm 1 with explicit inverses (torch.linalg.inv), eigh square roots and the
  SVD polar factor, run beside the optimizer over several steps (tall, wide, conv, batched same-shape
  matrices; every switch: order, damping, whiten_momentum).
- Invariants (derived from Algorithm 1): gamma = 1 with the exact polar factor and full-rank gradients gives an exactly
  orthogonal update (P = Q = I, so D = Polar(M): every singular value 1), not with Newton–Schulz or gamma < 1;
  a constant gradient G = U S V^T keeps P, Q diagonal in U, V and the update's singular values are 1/sqrt(p_i
  q_i) from a scalar recursion; Gauss–Seidel order (R_t from the new P_t) differs measurably from Jacobi;
  tr P = m and tr Q = n after every step; step 4 equals its rewrite P_t = (1 - a) P_{t-1} + a (m/tr L) L.
- Gradient-scale non-invariance, quantified: Muon's update is unchanged under G -> c G, FISMO's is not.
- State bytes counted by hand: P, Q, their inverse roots and M in float32 plus three int64 counters (the third,
  root_fallbacks, with the default Newton–Schulz roots) and two bools (roots_due, also theirs).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import structbench.optim.fismo as fismo_module
from structbench import measure
from structbench.errors import SolverError
from structbench.optim import linalg, registry
from structbench.optim.fismo import Fismo
from structbench.optim.muon import Muon
from tests.support.newton_schulz import gamma as rounding_gamma
from tests.support.newton_schulz import ns_bound
from tests.support.paths import ROOT

F64 = torch.float64
EXACT = {"root_method": "eigh"}
"""Roots by eigendecomposition: the tests of Algorithm 1 itself (tests/optim/test_matrix_roots.py bounds the default
Newton–Schulz roots' distance from these)."""


pytestmark = pytest.mark.usefixtures("one_thread")


def _sym(a: Tensor) -> Tensor:
    return (a + a.T) / 2


def _inv_sqrt(a: Tensor) -> Tensor:
    evals, evecs = torch.linalg.eigh(a)
    return evecs @ torch.diag(evals.rsqrt()) @ evecs.T


def _polar(a: Tensor) -> Tensor:
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    return u @ vh


def _reference(
    grads: list[Tensor],
    beta: float,
    gamma: float,
    mu: float,
    order: str = "gauss_seidel",
    damping: str = "algorithm",
    whiten_momentum: bool = True,
) -> tuple[list[Tensor], Tensor, Tensor]:
    """Algorithm 1 in float64, written from the paper's box: the update D_t of each step, the last P, Q, and each step's
    (cond P_t, cond Q_t, cond of the polar step's input) for `_trajectory_bound`."""
    m, n = grads[0].shape
    p, q, moment = torch.eye(m, dtype=F64), torch.eye(n, dtype=F64), torch.zeros(m, n, dtype=F64)
    updates, conds = [], []
    for g32 in grads:
        g = g32.to(F64)
        q_inv, p_inv_old = torch.linalg.inv(q), torch.linalg.inv(p)
        damp = mu * torch.trace(p) / m if damping == "algorithm" else mu * torch.trace(q_inv) / n
        stat = g @ q_inv @ g.T / n + damp * torch.eye(m, dtype=F64)
        blended = gamma * p + (1 - gamma) * stat
        p_new = _sym(m / torch.trace(blended) * blended)
        p_inv = torch.linalg.inv(p_new) if order == "gauss_seidel" else p_inv_old
        damp = mu * torch.trace(q) / n if damping == "algorithm" else mu * torch.trace(p_inv) / m
        stat = g.T @ p_inv @ g / m + damp * torch.eye(n, dtype=F64)
        blended = gamma * q + (1 - gamma) * stat
        p, q = p_new, _sym(n / torch.trace(blended) * blended)
        p_is, q_is = _inv_sqrt(p), _inv_sqrt(q)
        if whiten_momentum:
            moment = beta * moment + (1 - beta) * (p_is @ g @ q_is)
            polar_input = moment
        else:
            moment = beta * moment + (1 - beta) * g
            polar_input = p_is @ moment @ q_is
        updates.append(p_is @ _polar(polar_input) @ q_is)
        conds.append((_cond(p), _cond(q), _cond(polar_input)))
    return updates, p, q, conds


def _random_grads(shape: tuple[int, ...], steps: int, seed: int = 0, scale: float = 1.0) -> list[Tensor]:
    """Gradients with row scales from 1 to 10^0.5, so that P and Q become clearly (not wildly) anisotropic."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.logspace(0, 0.5, shape[0]).reshape(-1, *([1] * (len(shape) - 1)))
    return [scale * rows * torch.randn(*shape, generator=gen) for _ in range(steps)]


def _updates(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], grads: list[list[Tensor]]) -> list:
    """Each step's update D_t per parameter (lr = 1, W reset to 0 before the step, so W_t = -D_t exactly)."""
    out = []
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            with torch.no_grad():
                p.zero_()
            p.grad = g.clone().to(p.dtype)
        optimizer.step()
        out.append([-p.detach().to(F64).clone() for p in params])
    return out


def _cond(x: Tensor) -> float:
    s = torch.linalg.svdvals(x.to(F64))
    return float(s[0] / s[-1])


U = 2.0**-24
"""Unit roundoff of float32, FISMO's state and arithmetic dtype (the float64 references add ~2^-53, ignored)."""


def _trajectory_bound(steps: int, dim: int, conds: list[tuple[float, float, float]]) -> float:
    """Relative (2-norm) error of a float32 FISMO run with eigh roots and the SVD polar factor after `steps` steps,
    first order, from the conditions (cond P_t, cond Q_t, cond M_t) of each step (M_t: the polar step's input) and
    dim >= m, n. Per step, rounding is a relative perturbation of P, Q, M or D of at most eta: each root kappa dim u
    (float32 eigh's backward error dim u ||X||, X^{-1/2}'s relative condition kappa / 2, as much again forming it; the
    bound of test_trace_normalisation_symmetry_and_positive_definiteness), the polar factor 2 cond(M) dim u (Li:
    ||d polar|| <= 2 ||dM|| / sigma_min, for the SVD's backward error dim u ||M||), eight products and normalisations
    gamma_dim each. The exact recursion moves D_t by at most 8 t times a relative perturbation made at every step
    (float64 reference, P, Q and M perturbed by 1e-9 at each of t steps: at most 7.1 at t = 1, 19.8 at t = 4 in these
    tests): 8 t eta."""
    eta = max((cond_p + cond_q + 2 * cond_m) * dim * U for cond_p, cond_q, cond_m in conds) + 8 * rounding_gamma(dim)
    return 8 * steps * eta


def _momentum_gap(grads: list[Tensor], beta: float) -> float:
    """Frobenius bound on the difference of two float32 EMAs M_t = beta M_{t-1} + (1 - beta) G_t of the same gradients
    computed by different formulas (torch.lerp; or a product, a scaled add): each rounds at most 4 times per step, each
    rounding at most u (|M_{t-1}| + |G_t|) entrywise, an earlier error is carried scaled by beta, and both runs err."""
    bound, moment = 0.0, torch.zeros(grads[0].shape, dtype=F64)
    for g in grads:
        g = g.to(F64)
        bound = beta * bound + 4 * U * float(torch.linalg.matrix_norm(moment) + torch.linalg.matrix_norm(g))
        moment = beta * moment + (1 - beta) * g
    return 2 * bound


def _polar_bound(moment: Tensor, perturbation: float) -> float:
    """Frobenius bound on ||polar_svd(M^) - polar(M)|| for a float32 M^ within `perturbation` (Frobenius) of the
    full-rank M (float64; r = min(m, n), d = max(m, n)), first order:
    - ||polar(M + E) - polar(M)||_F <= 2 ||E||_F / sigma_min(M) (Li 1995; sqrt 2 / sigma_min for m != n);
    - float32 SVD is backward stable: U S V^T = M^ + E, U and V within d u of orthonormal U', V', and
      U' S V'^T = M^ + E' with ||E'||_2 <= 3 d u ||M||_2, so ||E'||_F <= 3 sqrt(r) d u ||M||_2;
    - the returned U V^T is U' V'^T within 2 sqrt(r) d u, plus the r-term product's rounding gamma_r |U| |V|^T, whose
      Frobenius norm is at most r gamma_r (rows of U, V have norm <= 1)."""
    s = torch.linalg.svdvals(moment.to(F64))
    r, d = min(moment.shape), max(moment.shape)
    backward = 3 * math.sqrt(r) * d * U * float(s[0])
    return 2 * (perturbation + backward) / float(s[-1]) + 2 * math.sqrt(r) * d * U + r * rounding_gamma(r)


def test_one_step_by_hand_for_a_diagonal_gradient() -> None:
    """G = diag(g1, g2): L = diag(g_i^2/2 + mu), P = 2 P~ / tr P~, R_i = g_i^2 / (2 p_i) + mu, and
    D = diag(1/sqrt(p_i q_i))."""
    g1, g2, beta, gamma, mu = 3.0, 0.5, 0.9, 0.8, 0.01
    pt = [gamma + (1 - gamma) * (g * g / 2 + mu) for g in (g1, g2)]
    p = [2 * x / sum(pt) for x in pt]
    qt = [gamma + (1 - gamma) * (g * g / (2 * pi) + mu) for g, pi in zip((g1, g2), p, strict=True)]
    q = [2 * x / sum(qt) for x in qt]
    expected_update = [1 / math.sqrt(pi * qi) for pi, qi in zip(p, q, strict=True)]
    expected_moment = [(1 - beta) * g / math.sqrt(pi * qi) for g, pi, qi in zip((g1, g2), p, q, strict=True)]

    param = nn.Parameter(torch.zeros(2, 2))
    optimizer = Fismo([param], lr=1.0, beta=beta, gamma=gamma, mu=mu, polar="svd", **EXACT)
    param.grad = torch.diag(torch.tensor([g1, g2]))
    optimizer.step()
    state = optimizer.state[param]
    # Every quantity is a chain of products, quotients, square roots and sums of positive numbers (relative condition
    # <= 1), so the relative errors of its float32 roundings add: at most 40 on the longest path, the update's (~10 for
    # P, ~27 for Q, halved by the roots, then the whitening, the momentum and two products), including the float32
    # rounding of the constants gamma, mu, beta. eigh and the SVD of these diagonal matrices are backward stable
    # (||E|| <= 2 u ||X||) and may turn their axes by 2 u ||X|| / gap <= 5 u each here (gap >= 0.43 ||X||): the update's
    # off-diagonal entries stay below 15 u max|D|, inside gamma_40 max|D|. A wrong gamma, mu or exponent moves >= 1e-2.
    tolerance = rounding_gamma(40)
    for got, want in (
        (state["P"], p),
        (state["Q"], q),
        (state["momentum"], expected_moment),
        (-param.detach(), expected_update),
    ):
        expected = torch.diag(torch.tensor(want, dtype=F64))
        torch.testing.assert_close(got.to(F64), expected, rtol=tolerance, atol=tolerance * max(map(abs, want)))


@pytest.mark.parametrize(
    "switches",
    [
        {},
        {"order": "jacobi"},
        {"damping": "theorem"},
        {"whiten_momentum": False},
    ],
    ids=["paper", "jacobi", "theorem-damping", "raw-momentum"],
)
def test_matches_a_float64_transcription_of_algorithm_1(switches: dict) -> None:
    shapes = [(5, 3), (3, 5), (3, 5), (2, 3, 2, 1)]  # tall, wide, a same-shape pair (batched), a conv filter
    steps = 4
    hp = {"beta": 0.8, "gamma": 0.8, "mu": 0.05}
    per_param = [_random_grads(s, steps, seed=i) for i, s in enumerate(shapes)]
    params = [nn.Parameter(torch.zeros(s)) for s in shapes]
    optimizer = Fismo(params, lr=1.0, polar="svd", **hp, **switches, **EXACT)
    got = _updates(optimizer, params, [list(step) for step in zip(*per_param, strict=True)])
    conditioning = []
    for i, (shape, grads) in enumerate(zip(shapes, per_param, strict=True)):
        expected, p, q, conds = _reference([g.reshape(shape[0], -1) for g in grads], **hp, **switches)
        # First-order float32 error after t steps, relative in the 2-norm (`_trajectory_bound`: roots, polar factor
        # and products per step, times the recursion's carry): <= 1e-3 for these conditions (up to 60). Every switch
        # moves D_4 by >= 7e-3 relative here (>= 12x the bound), and P by >= 2e-3 (4x) where it changes P at all.
        for t in range(steps):
            tolerance = _trajectory_bound(t + 1, max(shape[0], math.prod(shape[1:])), conds[: t + 1])
            error = torch.linalg.matrix_norm(got[t][i].reshape(shape[0], -1) - expected[t], ord=2)
            assert float(error / torch.linalg.matrix_norm(expected[t], ord=2)) <= tolerance, (i, t)
        state = optimizer.state[params[i]]
        for got_factor, want in ((state["P"], p), (state["Q"], q), (state["P_inv_root"], _inv_sqrt(p))):
            atol = tolerance * float(torch.linalg.matrix_norm(want, ord=2))
            torch.testing.assert_close(got_factor.to(F64), want, rtol=0, atol=atol)
        conditioning += [float(torch.linalg.cond(p)), float(torch.linalg.cond(q))]
    assert max(conditioning) > 10  # far from the identity, where every order and damping would agree


def test_gamma_one_with_exact_polar_gives_an_exactly_orthogonal_update() -> None:
    """gamma = 1: P~ = P_{t-1}, so P = Q = I forever and D_t = Polar(M_t), paper-form Muon.

    The update is orthogonal (all singular values 1) only with the exact polar factor and a full-rank momentum:
    Muon's quintic Newton–Schulz leaves singular values spread over about [0.7, 1.2], and gamma < 1 makes them
    1/sqrt(p_i q_i)."""
    shape, steps = (12, 8), 5
    grads = [[g] for g in _random_grads(shape, steps, scale=10.0)]
    param = nn.Parameter(torch.zeros(shape))
    optimizer = Fismo([param], lr=1.0, gamma=1.0, polar="svd", **EXACT)
    updates = _updates(optimizer, [param], grads)
    # P = Q = I exactly (asserted below), so D = I U V^T I is float32 polar_svd's U V^T itself: U and V orthonormal to
    # d u each (d = 12) and the r-term product (r = 8) off by <= r gamma_r in norm: |sigma_i - 1| <= 2 d u + r gamma_r
    # (5e-6). A lost orthogonality (Newton–Schulz, gamma < 1) spreads the singular values by > 0.1 (checked below).
    rows, cols = shape
    tolerance = 2 * rows * U + cols * rounding_gamma(cols)
    for (update,) in updates:
        singular = torch.linalg.svdvals(update)
        assert (singular - 1).abs().max() <= tolerance
    assert torch.equal(optimizer.state[param]["P"], torch.eye(12))
    assert torch.equal(optimizer.state[param]["Q"], torch.eye(8))

    muon_param = nn.Parameter(torch.zeros(shape))
    muon = Muon([muon_param], lr=1.0, momentum=0.95, nesterov=False, scale="none", polar="svd")
    moments = [g.to(F64) for (g,) in grads]
    for t, ((ours,), (theirs,)) in enumerate(zip(updates, _updates(muon, [muon_param], grads), strict=True)):
        # Both take polar_svd of the EMA of the same gradients (FISMO's whitening by I is exact), FISMO's from a product
        # and a scaled add, Muon's from lerp: apart by `_momentum_gap`, and each polar factor within `_polar_bound` of
        # the exact one (cond M < 8 here: <= 8e-4). From t = 2 on, another beta or Nesterov moves D by >= 3e-2.
        moment = sum((1 - 0.95) * 0.95 ** (t - s) * g for s, g in enumerate(moments[: t + 1]))
        atol = 2 * _polar_bound(moment, _momentum_gap([g for (g,) in grads[: t + 1]], 0.95) / 2)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=atol)

    spreads = {}
    for label, hp in {"ns": {"gamma": 1.0, "polar": "ns"}, "gamma<1": {"gamma": 0.9, "polar": "svd"}}.items():
        other = nn.Parameter(torch.zeros(shape))
        (last,) = _updates(Fismo([other], lr=1.0, **hp), [other], grads)[-1]
        singular = torch.linalg.svdvals(last)
        spreads[label] = float(singular.max() - singular.min())
    assert spreads["ns"] > 0.1 and spreads["gamma<1"] > 0.1, spreads


@pytest.mark.parametrize("shape", [(6, 4), (4, 6)])
def test_aligned_factors_give_singular_values_one_over_sqrt_pq(shape: tuple[int, int]) -> None:
    """A constant G = U diag(s) V^T keeps P = U diag(p) U^T and Q = V diag(q) V^T; p, q follow scalar recursions
    and the update is U diag(1/sqrt(p_i q_i)) V^T on the r = min(m, n) singular directions."""
    m, n = shape
    r = min(m, n)
    beta, gamma, mu, steps = 0.9, 0.6, 1e-2, 6
    gen = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(m, m, generator=gen, dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))
    s = [4.0, 2.0, 1.0, 0.25][:r]
    grad = (u[:, :r] * torch.tensor(s, dtype=F64)) @ v[:, :r].T

    p, q = [1.0] * m, [1.0] * n
    moment, conds = [0.0] * r, []
    for _ in range(steps):
        damp = mu * sum(p) / m
        pt = [gamma * p[i] + (1 - gamma) * ((s[i] ** 2 / (n * q[i]) if i < r else 0.0) + damp) for i in range(m)]
        p_next = [m * x / sum(pt) for x in pt]
        damp = mu * sum(q) / n
        qt = [gamma * q[j] + (1 - gamma) * ((s[j] ** 2 / (m * p_next[j]) if j < r else 0.0) + damp) for j in range(n)]
        p, q = p_next, [n * x / sum(qt) for x in qt]
        moment = [beta * x + (1 - beta) * s[i] / math.sqrt(p[i] * q[i]) for i, x in enumerate(moment)]
        conds.append((max(p) / min(p), max(q) / min(q), max(moment) / min(moment)))

    param = nn.Parameter(torch.zeros(shape))
    optimizer = Fismo([param], lr=1.0, beta=beta, gamma=gamma, mu=mu, polar="svd", **EXACT)
    (update,) = _updates(optimizer, [param], [[grad.float()]] * steps)[-1]
    state = optimizer.state[param]
    predicted = [1 / math.sqrt(p[i] * q[i]) for i in range(r)]
    # Six float32 steps against the exact scalar recursion: relative 2-norm error <= `_trajectory_bound` (~1e-3 here;
    # G's float32 rounding is one more relative u). Off-diagonal entries of U^T P U, V^T Q V and the update's singular
    # values (Weyl: |d sigma| <= ||dD||_2) are within it too. A root exponent of -1/4 moves them by > 1e-1.
    tolerance = _trajectory_bound(steps, max(shape), conds)
    for basis, factor, values in ((u, state["P"], p), (v, state["Q"], q)):
        expected = torch.diag(torch.tensor(values, dtype=F64))
        torch.testing.assert_close(basis.T @ factor.to(F64) @ basis, expected, atol=tolerance * max(values), rtol=0)
    atol = tolerance * max(predicted)
    torch.testing.assert_close(update, (u[:, :r] * torch.tensor(predicted, dtype=F64)) @ v[:, :r].T, rtol=0, atol=atol)
    singular = torch.linalg.svdvals(update)[:r]
    torch.testing.assert_close(singular, torch.tensor(sorted(predicted, reverse=True), dtype=F64), rtol=0, atol=atol)
    assert max(predicted) / min(predicted) > 1.5  # the factors are far from isotropic: the test has teeth


def _first_step_factors(grad: Tensor, gamma: float, mu: float) -> tuple[Tensor, Tensor, Tensor]:
    """P_1, and Q_1 in both orders, from P_0 = I, Q_0 = I (float64)."""
    m, n = grad.shape
    g = grad.to(F64)
    blended = gamma * torch.eye(m, dtype=F64) + (1 - gamma) * (g @ g.T / n + mu * torch.eye(m, dtype=F64))
    p1 = m * blended / torch.trace(blended)

    def q_from(p_inv: Tensor) -> Tensor:
        mixed = gamma * torch.eye(n, dtype=F64) + (1 - gamma) * (g.T @ p_inv @ g / m + mu * torch.eye(n, dtype=F64))
        return n * mixed / torch.trace(mixed)

    return p1, q_from(torch.linalg.inv(p1)), q_from(torch.eye(m, dtype=F64))


def test_gauss_seidel_order_uses_the_new_left_factor() -> None:
    (grad,) = _random_grads((6, 4), 1, seed=5, scale=3.0)
    gamma, mu = 0.5, 1e-3
    p1, q_gauss_seidel, q_jacobi = _first_step_factors(grad, gamma, mu)
    gap = float(torch.linalg.matrix_norm(q_gauss_seidel - q_jacobi))
    assert gap > 0.1
    g, (m, n) = grad.to(F64), grad.shape
    eye_m, eye_n = torch.eye(m, dtype=F64), torch.eye(n, dtype=F64)
    # P_1 = (m / tr P~) sym(P~), P~ = gamma I + (1 - gamma)(G G^T / n + mu I) in float32 (Q_0^{-1/2} = I): entrywise
    # |dP~| <= gamma_{n+4} A with A the same sum over |G| (product, two scaled adds, rounded constants), and the trace,
    # scale and symmetrisation add gamma_{m+3} |P_1|.
    trace_p = float(torch.trace(gamma * eye_m + (1 - gamma) * (g @ g.T / n + mu * eye_m)))
    terms = gamma * eye_m + (1 - gamma) * (g.abs() @ g.abs().T / n + mu * eye_m)
    p_bound = m / trace_p * rounding_gamma(n + 4) * terms + rounding_gamma(m + 3) * p1.abs()
    p_drift = float(torch.linalg.matrix_norm(torch.linalg.inv(p1), ord=2) * torch.linalg.matrix_norm(p_bound))
    for order, expected in (("gauss_seidel", q_gauss_seidel), ("jacobi", q_jacobi)):
        param = nn.Parameter(torch.zeros(6, 4))
        optimizer = Fismo([param], gamma=gamma, mu=mu, order=order)
        param.grad = grad.clone()
        optimizer.step()
        state = optimizer.state[param]
        assert bool(((state["P"].to(F64) - p1).abs() <= p_bound).all()), order
        # Q_1 from the root R the step used: the state's Newton root of P^ in Gauss–Seidel order (I in Jacobi order,
        # exact). With F = R P^ R - I, R R = P^{-1/2} S S^T P^{-1/2}, ||S S^T - I|| = ||F|| (a posteriori: the root's
        # own residual), and G^T P^{-1} G <= (tr P~ / m)(n / (1 - gamma)) I, G^T R R G is off by at most that times
        # ||F|| + ||P^{-1} dP||, and by gamma_{2m+4} || |R| |G| ||_F^2 from forming it; it enters Q~ times (1 - gamma)/m
        # and Q = n Q~ / tr Q~ scales an error by (n / tr Q~)(1 + ||Q||), adding gamma_{n+3} ||Q||; F-norm <= sqrt(n) x.
        gauss_seidel = order == "gauss_seidel"
        root, factor = (state["P_inv_root"].to(F64), state["P"].to(F64)) if gauss_seidel else (eye_m, eye_m)
        residual = float(torch.linalg.matrix_norm(root @ factor @ root - eye_m, ord=2))
        stat = (trace_p / m) * (n / (1 - gamma)) * (residual + (p_drift if gauss_seidel else 0.0))
        stat += rounding_gamma(2 * m + 4) * float((root.abs() @ g.abs()).square().sum())
        inverse = torch.linalg.inv(p1) if gauss_seidel else eye_m
        trace_q = float(torch.trace(gamma * eye_n + (1 - gamma) * (g.T @ inverse @ g / m + mu * eye_n)))
        q_norm = float(torch.linalg.matrix_norm(expected, ord=2))
        statistic = n / trace_q * (1 + q_norm) * (1 - gamma) / m * stat
        tolerance = math.sqrt(n) * (statistic + rounding_gamma(n + 3) * q_norm)
        error = float(torch.linalg.matrix_norm(state["Q"].to(F64) - expected))
        assert error <= tolerance < gap / 100, (order, error, tolerance, gap)


def test_trace_normalisation_symmetry_and_positive_definiteness() -> None:
    shapes, steps = [(16, 8), (8, 24)], 15
    params = [nn.Parameter(torch.randn(s)) for s in shapes]
    optimizer = Fismo(params, gamma=0.8, mu=1e-3, **EXACT)
    per_param = [_random_grads(s, steps, seed=i, scale=3.0) for i, s in enumerate(shapes)]
    for step_grads in zip(*per_param, strict=True):
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g
        optimizer.step()
        for p in params:
            state = optimizer.state[p]
            for key, root, dim in (("P", "P_inv_root", p.shape[0]), ("Q", "Q_inv_root", p.shape[1])):
                factor = state[key]
                # P = (dim / tr^ P~) (P~ + P~^T) / 2 with tr^ a float32 sum of dim positive terms (relative error
                # gamma_{dim-1}); the quotient and each entry's product add u each: |tr P - dim| <= gamma_{dim+1} dim.
                # A skipped or stale normalisation misses dim by the factor's drift, >= 1e-2 here.
                assert float(torch.trace(factor.to(F64))) == pytest.approx(dim, rel=rounding_gamma(dim + 1), abs=0)
                assert torch.equal(factor, factor.T)  # exact: fl(a + b) = fl(b + a), one scale for both entries
                assert float(torch.linalg.eigvalsh(factor.to(F64))[0]) > 0
                product = state[root].to(F64) @ factor.to(F64) @ state[root].to(F64)
                # R = Q diag(lambda^-1/2) Q^T from a float32 eigh (eigenvalues above the floor, no clamping):
                # - eigh is backward stable, Q L Q^T = P + E with ||E|| <= n u ||P|| (n = dim, u = 2^-24), and
                #   R P R - I = -R E R to first order: <= kappa n u (kappa = cond(P));
                # - Q^T Q = I + F with ||F|| <= n u: R P R = Q D Q^T Q L Q^T Q D Q^T picks up 2 ||F|| sqrt(kappa)
                #   (each F sits between a sqrt(L) and a D);
                # - forming R: each entry is an n-term sum of Q_ik d_k Q_jk, |dR_ij| <= gamma_n ||R|| (Cauchy-
                #   Schwarz on the rows of Q), so a row of dR has norm <= sqrt(n) gamma_n ||R||, and with
                #   ||R|| ||P R|| = sqrt(kappa) both roots add 2 sqrt(n) gamma_n sqrt(kappa) per entry.
                # The product itself is formed in float64. A wrong root (exponent, stale or unsymmetrised factor)
                # is off by the factor's change or kappa^(1/4) - 1, >= 1e-2 here.
                dim_u = dim * 2.0**-24
                kappa = float(torch.linalg.cond(factor.to(F64)))
                tolerance = kappa * dim_u + 2 * math.sqrt(kappa) * (dim_u + math.sqrt(dim) * dim_u / (1 - dim_u))
                torch.testing.assert_close(product, torch.eye(dim, dtype=F64), atol=tolerance, rtol=0)
    kappa = max(float(torch.linalg.cond(optimizer.state[p]["P"].to(F64))) for p in params)
    assert kappa > 10  # anisotropic factors: normalisation is tested away from the identity


def test_step_four_is_an_ema_with_the_rewritten_rate() -> None:
    """Algorithm 1 line 4 rewritten: with tr P_{t-1} = m, P_t = (1 - a) P_{t-1} + a (m / tr L_t) L_t, where
    a = (1 - gamma) tr L_t / (gamma m + (1 - gamma) tr L_t)."""
    gamma, mu, steps = 0.9, 1e-3, 3
    grads = _random_grads((6, 5), steps + 1, seed=7, scale=2.0)
    param = nn.Parameter(torch.zeros(6, 5))
    optimizer = Fismo([param], gamma=gamma, mu=mu, **EXACT)
    for g in grads[:steps]:
        param.grad = g
        optimizer.step()
    state = optimizer.state[param]
    p_old, q_old = state["P"].to(F64), state["Q"].to(F64)
    g = grads[steps].to(F64)
    stat = g @ torch.linalg.inv(q_old) @ g.T / 5 + mu * torch.eye(6, dtype=F64)
    trace_l = torch.trace(stat)
    rate = (1 - gamma) * trace_l / (gamma * 6 + (1 - gamma) * trace_l)
    expected = (1 - rate) * p_old + rate * (6 / trace_l) * stat
    root = state["Q_inv_root"].to(F64)
    param.grad = grads[steps]
    optimizer.step()
    # One float32 step from the stored P, Q and Q's float32 eigh root R (d = 5): ||R Q R - I|| <= tau (the bound of
    # test_trace_normalisation_symmetry_and_positive_definiteness), so G R R G^T is off by <= ||G Q^{-1} G^T|| tau, and
    # by gamma_{2n+4} || |G| |R| ||_F^2 from its two products; (1 - gamma) / n of that enters P~ with the EMA's gamma_4
    # rounding, and P = m P~ / tr P~ scales an error by (m / tr P~)(1 + ||P||), adding gamma_{m+3} ||P||. gamma 0.91
    # instead of 0.9 moves P by 2e-2, Q^{-1} replaced by I by 0.28.
    kappa = float(torch.linalg.cond(q_old))
    tau = kappa * 5 * U + 2 * math.sqrt(kappa) * (5 * U + math.sqrt(5) * rounding_gamma(5))
    blended = gamma * p_old + (1 - gamma) * stat
    error_blended = (1 - gamma) / 5 * float(torch.linalg.matrix_norm(g @ torch.linalg.inv(q_old) @ g.T, ord=2)) * tau
    error_blended += (1 - gamma) / 5 * rounding_gamma(14) * float((g.abs() @ root.abs()).square().sum())
    error_blended += rounding_gamma(4) * float(torch.linalg.matrix_norm(blended.abs()))
    p_norm = float(torch.linalg.matrix_norm(expected, ord=2))
    atol = 6 / float(torch.trace(blended)) * (1 + p_norm) * error_blended + rounding_gamma(9) * p_norm
    torch.testing.assert_close(state["P"].to(F64), expected, rtol=0, atol=atol)


def test_fismo_is_not_invariant_to_gradient_scale_while_muon_is() -> None:
    """G_t = c (U diag(1 ... 1e-4) V^T + noise), 64 x 32, 20 steps, default gamma and mu, exact polar.

    Measured: cond(D) = 1.0000035 / 1.0047 / 15.9, ||D||_F = 5.657 / 5.656 / 10.45 and ||D_c - D_1||_F / ||D_1||_F
    = 9.5e-4 / 0 / 1.03 for c = 0.01 / 1 / 100; Muon: cond 1.000002, ||D||_F = sqrt(32) and a relative change of
    1.7e-5 (rounding) at every c. Small gradients leave P, Q ~ I (FISMO ~
    Muon); large ones make them anisotropic (a numpy check outside structbench: 1.0 -> 2.9 -> 140 -> 7.9e3 at
    gamma 0.95)."""
    m, n, steps = 64, 32, 20
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(m, n, generator=gen, dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))
    base = (u * torch.logspace(0, -4, n, dtype=F64)) @ v.T
    noise = [1e-3 * torch.randn(m, n, generator=gen, dtype=F64) for _ in range(steps)]
    results = {}
    for c in (0.01, 1.0, 100.0):
        grads = [[(c * (base + e)).float()] for e in noise]
        param, muon_param = nn.Parameter(torch.zeros(m, n)), nn.Parameter(torch.zeros(m, n))
        (ours,) = _updates(Fismo([param], lr=1.0, polar="svd"), [param], grads)[-1]
        muon = Muon([muon_param], lr=1.0, nesterov=False, scale="none", polar="svd")
        (theirs,) = _updates(muon, [muon_param], grads)[-1]
        results[c] = (ours, theirs)
    conds = {c: _cond(ours) for c, (ours, _) in results.items()}
    norms = {c: float(torch.linalg.matrix_norm(ours)) for c, (ours, _) in results.items()}
    # A float32 polar_svd factor has singular values within eps = 2 d u + r gamma_r of 1 (U, V orthonormal to d u each,
    # the r-term product; d = 64, r = 32), so its condition number is <= (1 + eps) / (1 - eps), ~1 + 1.4e-4. FISMO at
    # c = 0.01 adds its near-identity factors' 4e-6 (measured; far below the 1e-4 allowed), and at c = 1 their 4.7e-3.
    eps = 2 * m * U + n * rounding_gamma(n)
    orthogonal = (1 + eps) / (1 - eps)
    assert conds[0.01] < orthogonal + 1e-4 < conds[1.0] < 1.1 < 10 < conds[100.0], conds
    assert norms[100.0] > 1.5 * norms[1.0], norms
    assert float(torch.linalg.matrix_norm(results[100.0][0] - results[0.01][0])) > 1.0
    changes = {
        c: float(torch.linalg.matrix_norm(ours - results[1.0][0])) / norms[1.0] for c, (ours, _) in results.items()
    }
    assert changes[0.01] > 5e-4 and changes[100.0] > 0.5, changes
    # Muon's U V^T is polar(M) whatever c; each run's float32 M (EMA by lerp of the float32 gradients) is within
    # `_momentum_gap` of c M (input rounding included) and its polar factor within `_polar_bound` of the exact one. The
    # bound divides by sigma_min(M) ~ 4.5e-4 (the noise-level directions), so it is ~8% of ||D|| (measured: 1.7e-5): it
    # still separates Muon from FISMO's change of > 0.5 at c = 100, which is the point.
    grads_one = [(base + e).float() for e in noise]
    moment = sum(0.05 * 0.95 ** (steps - 1 - t) * g.to(F64) for t, g in enumerate(grads_one))
    invariance = 2 * _polar_bound(moment, _momentum_gap(grads_one, 0.95)) / math.sqrt(n)
    for c, (_, theirs) in results.items():
        change = float(torch.linalg.matrix_norm(theirs - results[1.0][1]) / torch.linalg.matrix_norm(theirs))
        assert change <= invariance < changes[100.0] and _cond(theirs) <= orthogonal, (c, change)


def test_state_bytes_counted_by_hand() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 3))
    optimizer, routing = registry.build_with_routing("fismo", model, {})
    assert routing.structured == ("0.weight", "2.weight")
    for step in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 8, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
    # 16 x 8: P 16^2, Q 8^2 and their roots, M 128 floats; 4 x 16: 2 (16 + 256) + 64; three int64 counters each
    # (step, solver_failures and the default Newton–Schulz roots' root_fallbacks) and two bools (roots_due).
    fismo_bytes = 4 * (2 * 256 + 2 * 64 + 128) + 24 + 2 + 4 * (2 * 16 + 2 * 256 + 64) + 24 + 2
    adamw_bytes = 2 * 4 * (16 + 4 + 3 * 4 + 3) + 4 * 4  # exp_avg + exp_avg_sq, one float32 step per tensor
    assert measure.state_bytes(optimizer) == fismo_bytes + adamw_bytes
    entry = registry.get("fismo")
    shapes = [tuple(p.shape) for p in model.parameters()]
    hp = registry.resolve_hparams("fismo", {})
    assert entry.state_bytes(shapes[0:1] + shapes[2:3], shapes[1:2] + shapes[3:], hp) == fismo_bytes + adamw_bytes


@pytest.mark.parametrize("oversize", ["muon", "adamw"])
def test_max_factor_dim_routes_oversize_matrices(oversize: str) -> None:
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, 6), nn.Linear(6, 2))
    hp = {"max_factor_dim": 16, "oversize": oversize}
    optimizer, routing = registry.build_with_routing("fismo", model, hp)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    analytic = registry.get("fismo").state_bytes(
        [shapes[n] for n in routing.structured],
        [shapes[n] for n in routing.fallback],
        registry.resolve_hparams("fismo", hp),
    )
    assert measure.state_bytes(optimizer) == analytic
    if oversize == "adamw":
        assert routing.structured == ("4.weight",)
        return
    assert routing.structured == ("0.weight", "2.weight", "4.weight")
    fismo = optimizer.parts["structured"]
    big = model[0].weight
    assert set(fismo.state[big]) == {"momentum", "step", "solver_failures"}
    assert "P" in fismo.state[model[4].weight]


def test_oversize_muon_is_paper_form_muon() -> None:
    grads = [[g] for g in _random_grads((20, 12), 4, seed=2)]
    param, reference = nn.Parameter(torch.zeros(20, 12)), nn.Parameter(torch.zeros(20, 12))
    ours = _updates(Fismo([param], lr=1.0, max_factor_dim=16, beta=0.9), [param], grads)
    theirs = _updates(Muon([reference], lr=1.0, momentum=0.9, nesterov=False, scale="none"), [reference], grads)
    for t, ((a,), (b,)) in enumerate(zip(ours, theirs, strict=True)):
        # Both are NS5 of the EMA of the same gradients, FISMO's from a product and a scaled add (batched matmuls),
        # Muon's from lerp (2-D matmuls): the momenta differ by `_momentum_gap`; X0 = M / ||M||_F turns that into
        # 2 gap / ||M||_F plus each run's float32 norm and division, gamma_{mn} / 2 + 2 u; `ns_bound` carries it
        # through the five steps with both runs' rounding (~3e-3 here, measured 1e-6). From t = 2 on, beta 0.95 instead
        # of 0.9 moves entries by >= 3e-2, Nesterov by >= 0.25.
        moment = sum(0.1 * 0.9 ** (t - s) * g.to(F64) for s, (g,) in enumerate(grads[: t + 1]))
        norm = float(torch.linalg.matrix_norm(moment))
        gap = _momentum_gap([g for (g,) in grads[: t + 1]], 0.9)
        singular = [float(x) for x in torch.linalg.svdvals(moment / norm)]
        rounding = ns_bound(singular, 20, 12, linalg.NS_QUINTIC, 5, 0.0)
        input_error = 2 * gap / norm + 2 * (rounding_gamma(240) / 2 + 2 * U)
        atol = ns_bound(singular, 20, 12, linalg.NS_QUINTIC, 5, input_error) + rounding
        torch.testing.assert_close(a, b, rtol=0, atol=atol)


def test_precond_every_refreshes_factors_on_schedule() -> None:
    grads = _random_grads((6, 4), 4, seed=1, scale=3.0)
    param = nn.Parameter(torch.zeros(6, 4))
    optimizer = Fismo([param], precond_every=2, gamma=0.5)
    seen = []
    for g in grads:
        param.grad = g
        optimizer.step()
        seen.append(optimizer.state[param]["P"].clone())
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[2], seen[3])
    assert not torch.equal(seen[1], seen[2])


def test_batched_same_shape_matrices_step_like_separate_optimizers() -> None:
    """Two 6 x 4 matrices share one batched step; a missing gradient desynchronises their refresh schedules."""
    grads = [_random_grads((6, 4), 4, seed=s, scale=2.0) for s in (10, 11)]
    present = [[True, True], [True, False], [True, True], [True, True]]
    hp = {"lr": 1.0, "gamma": 0.6, "precond_every": 2, "polar": "svd"}
    together = [nn.Parameter(torch.zeros(6, 4)) for _ in range(2)]
    joint = Fismo(together, **hp)
    alone = [nn.Parameter(torch.zeros(6, 4)) for _ in range(2)]
    separate = [Fismo([p], **hp) for p in alone]
    # Not bit-identical by construction: a stack of two runs batched matmuls, and the Newton–Schulz roots (the default)
    # iterate a stack until every matrix in it passes. Both runs' updates are within 3 root_tol (relative, Frobenius) of
    # the float64-eigh form (FISMO's root contract, test_matrix_roots.py; float32 rounding is far below root_tol), so
    # their weights (W = -sum of updates, lr = 1) differ by <= 6 root_tol sum_t ||D_t||_F. A matrix stepped with the
    # other's factors or on the wrong refresh schedule is off by >= 0.1 relative.
    root_tol = registry.resolve_hparams("fismo", {})["root_tol"]
    moved = [0.0, 0.0]
    for step, mask in enumerate(present):
        for i, has_grad in enumerate(mask):
            together[i].grad = grads[i][step].clone() if has_grad else None
            alone[i].grad = grads[i][step].clone() if has_grad else None
        before = [p.detach().clone() for p in alone]
        joint.step()
        for optimizer in separate:
            optimizer.step()
        for i, (a, b) in enumerate(zip(together, alone, strict=True)):
            moved[i] += float(torch.linalg.matrix_norm(b.detach() - before[i]))
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=6 * root_tol * moved[i])
    assert [int(joint.state[p]["step"]) for p in together] == [4, 3]


def test_nesterov_and_weight_decay() -> None:
    (grad,) = _random_grads((5, 3), 1, seed=4)
    beta, lr, wd = 0.9, 0.1, 0.5
    initial = torch.randn(5, 3, generator=torch.Generator().manual_seed(9))
    param = nn.Parameter(initial.clone())
    optimizer = Fismo(
        [param], lr=lr, beta=beta, nesterov=True, weight_decay=wd, polar="svd", gamma=0.7, mu=0.01, **EXACT
    )
    param.grad = grad
    optimizer.step()
    (plain,), _, _, conds = _reference([grad], beta=0.0, gamma=0.7, mu=0.01)  # (1 - b) G~ + b M_1 = (2 - b)(1 - b) G~
    expected = (1 - lr * wd) * initial.to(F64) - lr * plain
    # D within `_trajectory_bound` of one step (2-norm, relative; Nesterov's lerp is one more product); the decay and
    # the add round the constant, the product and the sum: <= 5 u (|W_0| + lr |D|) entrywise. Skipping the decay or
    # Nesterov's extra (1 + b) moves W by >= 1e-2.
    atol = 5 * U * float((initial.abs() + lr * plain.abs()).max())
    atol += lr * _trajectory_bound(1, 5, conds) * float(torch.linalg.matrix_norm(plain, ord=2))
    torch.testing.assert_close(param.detach().to(F64), expected, rtol=0, atol=atol)


def test_bfloat16_parameters_keep_float32_state_and_grads_are_not_mutated() -> None:
    param = nn.Parameter(torch.randn(8, 6).to(torch.bfloat16))
    optimizer = Fismo([param], lr=0.05)
    before = param.detach().clone()
    grad = torch.randn(8, 6).to(torch.bfloat16)
    param.grad = grad.clone()
    optimizer.step()
    assert torch.equal(param.grad, grad)
    assert param.dtype == torch.bfloat16 and not torch.equal(param.detach(), before)
    state = optimizer.state[param]
    assert all(state[k].dtype == torch.float32 for k in ("P", "Q", "P_inv_root", "Q_inv_root", "momentum"))


def test_parameters_without_gradients_are_skipped_and_vectors_rejected() -> None:
    a, b = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(4, 3))
    optimizer = Fismo([a, b], weight_decay=0.1)
    before = b.detach().clone()
    a.grad = torch.randn(4, 3)
    optimizer.step()
    assert torch.equal(b.detach(), before) and not optimizer.state[b]
    with pytest.raises(ValueError, match="1-D"):
        Fismo([nn.Parameter(torch.randn(4))])
    with pytest.raises(ValueError, match="gamma"):
        Fismo([a], gamma=1.5)


def test_closure_loss_is_returned() -> None:
    param = nn.Parameter(torch.randn(4, 3))
    optimizer = Fismo([param])

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = param.square().sum()
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss is not None and float(loss.detach()) > 0


def test_failed_eigendecompositions_keep_the_factors_and_raise_on_the_third(monkeypatch: pytest.MonkeyPatch) -> None:
    grads = _random_grads((6, 4), 5, seed=8, scale=3.0)
    param = nn.Parameter(torch.zeros(6, 4))
    optimizer = Fismo([param], gamma=0.5, **EXACT)
    param.grad = grads[0]
    optimizer.step()
    kept = {k: optimizer.state[param][k].clone() for k in ("P", "Q", "P_inv_root", "Q_inv_root")}

    def broken(a: Tensor) -> tuple[Tensor, Tensor]:
        raise SolverError("eigh failed in float32 and float64")

    monkeypatch.setattr(linalg, "eigh_with_retry", broken)
    for step in (1, 2):
        before = param.detach().clone()
        param.grad = grads[step]
        optimizer.step()
        assert not torch.equal(param.detach(), before)  # the step still runs, with the previous factors
        assert all(torch.equal(optimizer.state[param][k], v) for k, v in kept.items())
    assert optimizer.solver_failures == 4  # P and Q, two steps
    param.grad = grads[3]
    with pytest.raises(SolverError, match="3 steps in a row"):
        optimizer.step()
    monkeypatch.undo()
    healthy = Fismo([nn.Parameter(torch.zeros(6, 4))])
    assert healthy.solver_failures == 0


def test_failed_svd_polar_falls_back_to_newton_schulz(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(g: Tensor) -> Tensor:
        raise SolverError("SVD failed")

    monkeypatch.setattr(linalg, "polar_svd", broken)
    param = nn.Parameter(torch.zeros(6, 4))
    optimizer = Fismo([param], polar="svd")
    param.grad = _random_grads((6, 4), 1)[0]
    optimizer.step()
    assert optimizer.solver_failures == 1 and bool(param.detach().abs().sum() > 0)
    assert int(optimizer.state[param]["solver_failures"]) == 1


def test_registry_entry() -> None:
    entry = registry.get("fismo")
    assert entry.lr_keys == ("lr", "adamw_lr")
    assert set(fismo_module.Fismo.hparams.names()) < set(entry.defaults)
    assert {"adamw_lr", "adamw_beta1", "adamw_beta2", "adamw_eps", "adamw_weight_decay"} < set(entry.defaults)
    assert "sweep" in entry.notes and "docs/optimizers.md, FISMO's defaults" in entry.notes


def test_the_sweep_behind_the_defaults_is_reported_in_the_docs() -> None:
    docs = (ROOT / "docs" / "optimizers.md").read_text()
    section = docs[docs.index("## FISMO's defaults") :].split("\n## ", 1)[0]
    defaults = registry.get("fismo").defaults
    assert (defaults["lr"], defaults["beta"], defaults["gamma"], defaults["mu"]) == (0.002, 0.95, 0.99, 1e-3)
    assert "lr 0.002, beta 0.95, gamma 0.99 and mu 1e-3" in " ".join(section.split())
    for part in ("Tasks:", "Grid:", "Criterion:", "Results:"):
        assert part in section
