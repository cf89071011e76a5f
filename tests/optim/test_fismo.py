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
  root_fallbacks, with the default Newton–Schulz roots).
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
    """Algorithm 1 in float64, written from the paper's box: the update D_t of each step, and the last P, Q."""
    m, n = grads[0].shape
    p, q, moment = torch.eye(m, dtype=F64), torch.eye(n, dtype=F64), torch.zeros(m, n, dtype=F64)
    updates = []
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
            ortho = _polar(moment)
        else:
            moment = beta * moment + (1 - beta) * g
            ortho = _polar(p_is @ moment @ q_is)
        updates.append(p_is @ ortho @ q_is)
    return updates, p, q


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
    torch.testing.assert_close(state["P"].to(F64), torch.diag(torch.tensor(p, dtype=F64)), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state["Q"].to(F64), torch.diag(torch.tensor(q, dtype=F64)), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(
        state["momentum"].to(F64), torch.diag(torch.tensor(expected_moment, dtype=F64)), rtol=1e-6, atol=1e-7
    )
    torch.testing.assert_close(
        -param.detach().to(F64), torch.diag(torch.tensor(expected_update, dtype=F64)), rtol=1e-6, atol=1e-7
    )


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
        expected, p, q = _reference([g.reshape(shape[0], -1) for g in grads], **hp, **switches)
        for t in range(steps):
            error = torch.linalg.matrix_norm(got[t][i].reshape(shape[0], -1) - expected[t])
            assert float(error / torch.linalg.matrix_norm(expected[t])) < 2e-5, (i, t)
        state = optimizer.state[params[i]]
        torch.testing.assert_close(state["P"].to(F64), p, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state["Q"].to(F64), q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state["P_inv_root"].to(F64), _inv_sqrt(p), rtol=1e-5, atol=1e-6)
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
    for (update,) in updates:
        singular = torch.linalg.svdvals(update)
        assert (singular - 1).abs().max() < 1e-5
    assert torch.equal(optimizer.state[param]["P"], torch.eye(12))
    assert torch.equal(optimizer.state[param]["Q"], torch.eye(8))

    muon_param = nn.Parameter(torch.zeros(shape))
    muon = Muon([muon_param], lr=1.0, momentum=0.95, nesterov=False, scale="none", polar="svd")
    for (ours,), (theirs,) in zip(updates, _updates(muon, [muon_param], grads), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)

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
    for _ in range(steps):
        damp = mu * sum(p) / m
        pt = [gamma * p[i] + (1 - gamma) * ((s[i] ** 2 / (n * q[i]) if i < r else 0.0) + damp) for i in range(m)]
        p_next = [m * x / sum(pt) for x in pt]
        damp = mu * sum(q) / n
        qt = [gamma * q[j] + (1 - gamma) * ((s[j] ** 2 / (m * p_next[j]) if j < r else 0.0) + damp) for j in range(n)]
        p, q = p_next, [n * x / sum(qt) for x in qt]

    param = nn.Parameter(torch.zeros(shape))
    optimizer = Fismo([param], lr=1.0, beta=beta, gamma=gamma, mu=mu, polar="svd", **EXACT)
    (update,) = _updates(optimizer, [param], [[grad.float()]] * steps)[-1]
    state = optimizer.state[param]
    torch.testing.assert_close(u.T @ state["P"].to(F64) @ u, torch.diag(torch.tensor(p, dtype=F64)), atol=1e-5, rtol=0)
    torch.testing.assert_close(v.T @ state["Q"].to(F64) @ v, torch.diag(torch.tensor(q, dtype=F64)), atol=1e-5, rtol=0)
    predicted = [1 / math.sqrt(p[i] * q[i]) for i in range(r)]
    torch.testing.assert_close(
        update, (u[:, :r] * torch.tensor(predicted, dtype=F64)) @ v[:, :r].T, rtol=1e-4, atol=1e-5
    )
    singular = torch.linalg.svdvals(update)[:r]
    torch.testing.assert_close(singular, torch.tensor(sorted(predicted, reverse=True), dtype=F64), rtol=1e-4, atol=0)
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
    for order, expected in (("gauss_seidel", q_gauss_seidel), ("jacobi", q_jacobi)):
        param = nn.Parameter(torch.zeros(6, 4))
        optimizer = Fismo([param], gamma=gamma, mu=mu, order=order)
        param.grad = grad.clone()
        optimizer.step()
        state = optimizer.state[param]
        torch.testing.assert_close(state["P"].to(F64), p1, rtol=1e-6, atol=1e-6)
        error = float(torch.linalg.matrix_norm(state["Q"].to(F64) - expected))
        assert error < 1e-5 < gap / 1e4, (order, error, gap)


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
                assert float(torch.trace(factor.to(F64))) == pytest.approx(dim, rel=1e-5)
                assert torch.equal(factor, factor.T)
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
    param.grad = grads[steps]
    optimizer.step()
    torch.testing.assert_close(state["P"].to(F64), expected, rtol=1e-5, atol=1e-6)


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
    assert conds[0.01] < 1 + 1e-4 < conds[1.0] < 1.1 < 10 < conds[100.0], conds
    assert norms[100.0] > 1.5 * norms[1.0], norms
    assert float(torch.linalg.matrix_norm(results[100.0][0] - results[0.01][0])) > 1.0
    changes = {
        c: float(torch.linalg.matrix_norm(ours - results[1.0][0])) / norms[1.0] for c, (ours, _) in results.items()
    }
    assert changes[0.01] > 5e-4 and changes[100.0] > 0.5, changes
    for c, (_, theirs) in results.items():
        # Polar rounding is amplified along the noise-level singular directions: 1e-4 relative, not scale.
        change = float(torch.linalg.matrix_norm(theirs - results[1.0][1]) / torch.linalg.matrix_norm(theirs))
        assert change < 1e-4 and _cond(theirs) < 1 + 1e-4, (c, change)


def test_state_bytes_counted_by_hand() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.ReLU(), nn.Linear(4, 3))
    optimizer, routing = registry.build_with_routing("fismo", model, {})
    assert routing.structured == ("0.weight", "2.weight")
    for step in range(2):
        optimizer.zero_grad()
        model(torch.randn(5, 8, generator=torch.Generator().manual_seed(step))).sum().backward()
        optimizer.step()
    # 16 x 8: P 16^2, Q 8^2 and their roots, M 128 floats; 4 x 16: 2 (16 + 256) + 64; three int64 counters each
    # (step, solver_failures and the default Newton–Schulz roots' root_fallbacks).
    fismo_bytes = 4 * (2 * 256 + 2 * 64 + 128) + 24 + 4 * (2 * 16 + 2 * 256 + 64) + 24
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
    for (a,), (b,) in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


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
    for step, mask in enumerate(present):
        for i, has_grad in enumerate(mask):
            together[i].grad = grads[i][step].clone() if has_grad else None
            alone[i].grad = grads[i][step].clone() if has_grad else None
        joint.step()
        for optimizer in separate:
            optimizer.step()
        for a, b in zip(together, alone, strict=True):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-6, atol=1e-6)
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
    (plain,), _, _ = _reference([grad], beta=0.0, gamma=0.7, mu=0.01)  # (1 - b) G~ + b M_1 = (2 - b)(1 - b) G~
    expected = (1 - lr * wd) * initial.to(F64) - lr * plain
    torch.testing.assert_close(param.detach().to(F64), expected, rtol=1e-5, atol=1e-6)


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
