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


def _grads(shape: tuple[int, ...], count: int, seed: int = 0, dtype: torch.dtype = F64) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(count)]


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
    torch.testing.assert_close(w1, expected, rtol=1e-5, atol=1e-6)


def test_no_bias_correction_early_step_is_045_of_the_polar_factor():
    """No bias correction (Algorithm 2): beta1 0.9, beta2 0.95, eps 0 -> the first update is 0.1 / sqrt(0.05) U V^T."""
    g, u, v = _with_singular_values(4, 7, [2.0, 1.0, 0.5, 0.25])
    (w1,), _ = _run(ASGO, torch.zeros(4, 7, dtype=F64), [g], lr=1.0, beta1=0.9, beta2=0.95, eps=0.0)
    torch.testing.assert_close(-w1, 0.1 / math.sqrt(0.05) * u @ v.T, rtol=1e-5, atol=1e-6)


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
    torch.testing.assert_close(default, inside, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(switched, outside, rtol=1e-5, atol=1e-6)


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
    for got, want in zip(trajectory, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
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
        for g, got in zip(grads, trajectory, strict=True):
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * float(g @ g)
            x = x - lr * m / math.sqrt(v + eps)
            torch.testing.assert_close(got, x, rtol=1e-5, atol=1e-6)


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
    torch.testing.assert_close(
        roots[3].to(F64), _psd_power(v3 + eps * torch.eye(4, dtype=F64), -0.5), rtol=1e-4, atol=1e-5
    )
    expected = _algorithm2(w0, grads, lr, b1, b2, eps, tau=tau, left=True)
    torch.testing.assert_close(w.detach(), expected[-1], rtol=1e-5, atol=1e-6)
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
        torch.testing.assert_close(w - previous, -lr * u @ vh, rtol=1e-5, atol=1e-6)
        previous = w


def test_prop1_with_rank_deficient_gradient_uses_the_compact_svd():
    g, u, v = _with_singular_values(8, 12, [4.0, 1.0, 0.3])
    (w1,), _ = _run(ASGO, torch.zeros(8, 12), [g.float()], lr=1.0, **MUON_SETTINGS)
    torch.testing.assert_close(-w1.to(F64), u @ v.T, rtol=0, atol=1e-5)


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
    torch.testing.assert_close(asgo_w, muon_w, rtol=1e-4, atol=1e-5)


def test_eq4_momentum_preconditioner_with_beta2_zero_is_muon_with_momentum():
    """App. C.3: V from M_t with beta2 = 0 and eps = 0 gives polar(M_t), Muon's update with (EMA) momentum."""
    asgo_hp = {"beta1": 0.9, "beta2": 0.0, "eps": 0.0, "precondition_from": "momentum", "lr": 0.05}
    muon_hp = {"momentum": 0.9, "nesterov": False, "polar": "svd", "scale": "none", "lr": 0.05}
    asgo_w, muon_w = _registry_pair((6, 14), asgo_hp, muon_hp)
    torch.testing.assert_close(asgo_w, muon_w, rtol=1e-4, atol=1e-5)
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
    assert 0.5 * rhs < lhs <= rhs  # tight enough that a wrong preconditioner would show


def _psd(seed: int, size: int, rank: int) -> Tensor:
    a = torch.randn(size, rank, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return a @ a.T


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 6), rank=st.integers(1, 6))
def test_lemma3_and_lemma4(seed, size, rank):
    x, y = _psd(seed, size, rank), _psd(seed + 1, size, rank)
    tr_sqrt = lambda a: float(torch.trace(_psd_power(a, 0.5)))  # noqa: E731
    assert tr_sqrt(x + y) <= tr_sqrt(x) + tr_sqrt(y) + 1e-9  # Lemma 3
    assert tr_sqrt(x) <= float(torch.diagonal(x).sqrt().sum()) + 1e-9  # Lemma 4


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 5), cols=st.integers(1, 5), count=st.integers(1, 4))
def test_asgo_quantity_is_below_shampoos(seed, rows, cols, count):
    """Sec. 4: tr((sum G G^T)^{1/2}) <= tr((sum G G^T)^{1/4}) tr((sum G^T G)^{1/4})."""
    grads = _grads((rows, cols), count, seed=seed)
    left, right = sum(g @ g.T for g in grads), sum(g.T @ g for g in grads)
    tr_pow = lambda a, q: float(torch.trace(_psd_power(a, q)))  # noqa: E731
    assert tr_pow(left, 0.5) <= tr_pow(left, 0.25) * tr_pow(right, 0.25) * (1 + 1e-9) + 1e-12


# ---- switches, numerics, failures ----


def test_update_rms_and_weight_decay_switches():
    shape, lr, wd = (4, 9), 0.1, 0.5
    g = _grads(shape, 1)[0]
    w0 = torch.randn(*shape, dtype=F64)
    (plain,), _ = _run(ASGO, w0, [g], lr=lr)
    (rms,), _ = _run(ASGO, w0, [g], lr=lr, update_rms=0.2)
    step = (w0 - rms) / lr
    assert math.isclose(float(torch.linalg.matrix_norm(step)), 0.2 * math.sqrt(36), rel_tol=1e-5)
    torch.testing.assert_close(step / step.norm(), (w0 - plain) / (w0 - plain).norm())
    (decayed,), _ = _run(ASGO, w0, [g], lr=lr, weight_decay=wd)
    torch.testing.assert_close(decayed, plain - lr * wd * w0)


def test_newton_root_matches_eigh():
    grads = _grads((5, 12), 3, seed=2, dtype=torch.float32)
    w0 = torch.randn(5, 12)
    eigh, _ = _run(ASGO, w0, grads, eps=1e-2)
    newton, _ = _run(ASGO, w0, grads, eps=1e-2, root="newton")
    torch.testing.assert_close(newton[-1], eigh[-1], rtol=1e-3, atol=1e-4)
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
    optimizer = ASGO([w], eps=1e-3)
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
    for g, got in zip(grads, trajectory, strict=True):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * torch.tensor([float(g[:, j] @ g[:, j]) for j in range(shape[1])], dtype=F64)
        inside = torch.stack([m[:, j] / math.sqrt(v[j] + eps) for j in range(shape[1])], dim=1)
        outside = torch.stack([m[:, j] / (math.sqrt(v[j]) + eps) for j in range(shape[1])], dim=1)
        assert (inside - outside).abs().max() > 1e-2
        w = w - lr * inside
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)


def test_dasgo_left_side_scales_rows():
    g = _grads((3, 8), 1, seed=6)[0]
    (w1,), _ = _run(DASGO, torch.zeros(3, 8, dtype=F64), [g], lr=1.0, beta1=0.0, beta2=0.0, eps=0.0, side="left")
    torch.testing.assert_close(-w1, g / g.norm(dim=1, keepdim=True))


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
    """Sec. 7.2: for a 768 x 2304 weight ASGO keeps two 768 x 768 matrices plus the momentum."""
    shape = (2304, 768)
    asgo_bytes = asgo_module.asgo_state_bytes([shape], [], registry.get("asgo").defaults)
    assert asgo_bytes == 4 * (2304 * 768 + 2 * 768**2 + 1)
