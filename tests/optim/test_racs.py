"""RACS (Gong et al., Sec. 4, Prop. 3 / Eq. 16, Alg. 1) against independent facts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from structbench import measure
from structbench.optim import memory, racs
from structbench.optim.racs import RACS, fixed_point
from tests.support.newton_schulz import gamma

# Rounding-error bounds behind the tolerances (Higham, "Accuracy and Stability of Numerical Algorithms"): unit roundoff
# u = 2^-53 (float64), 2^-24 (float32); a sum of k nonnegative terms errs by <= gamma_k = k u / (1 - k u) relative; an
# SVD of a d x d' matrix is exact for P + E, ||E||_2 <= c d u ||P||_2 (d the larger side, c = C = 4: LAPACK's
# "modestly growing" p(d) taken as 4 d), its top singular vectors turning by <= ||E|| / (s_1 - s_2) (Wedin). RACS's
# arithmetic is on nonnegative numbers (P = G^2, s, q): a half-step s = P^T q / ||q||^2 rounds each entry by
# <= gamma_{k+2} relative (k = len(q)), and an entrywise relative error e of q moves s by <= 3 e relative (the sum by
# e, the squared norm by 2 e).
U64, U32 = 2.0**-53, 2.0**-24
C = 4


def _relative_bound(m: int, n: int, iterations: int, u: float = U64) -> float:
    """Entrywise relative error of fixed_point's s and q after `iterations` from q = 1 (exact): each half-step adds
    gamma_{max(m,n)+2} and carries the previous error with gain <= 3, so e_{h+1} <= 3 e_h + gamma."""
    error, fresh = 0.0, gamma(max(m, n) + 2, u)
    for _ in range(2 * iterations):
        error = 3 * error + fresh
    return error


def _principal_singular_vectors(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    u, _, vh = torch.linalg.svd(p)
    left, right = u[:, 0], vh[0]
    return left * left.sum().sign(), right * right.sum().sign()


def test_fixed_point_is_principal_singular_pair_of_expected_squared_gradient() -> None:
    # Prop. 3 / spec 6.3: s, q -> right/left principal singular vectors of E[G^2] (up to scale).
    gen = torch.Generator().manual_seed(0)
    for m, n in [(4, 6), (5, 5), (3, 9)]:
        mean = torch.randn(m, n, generator=gen, dtype=torch.float64)
        samples = mean + 0.5 * torch.randn(200, m, n, generator=gen, dtype=torch.float64)
        expected_sq = samples.square().mean(0)
        s, q = fixed_point(expected_sq, iterations=200)
        left, right = _principal_singular_vectors(expected_sq)
        # A power iteration on P P^T: the direction's tangent contracts by rho = (s_2 / s_1)^2 per iteration and each
        # half-step adds a relative rounding of delta = gamma_{d+2} (nonnegative P and q: |P|^T |q| = P^T q), so after
        # 200 steps tan <= rho^200 tan_0 + 2 delta / (1 - rho), doubled for the second-order terms; the float64 SVD's
        # vectors are within c d u s_1 / (s_1 - s_2). A wrong order (q before s) or an unnormalised step: O(1).
        sv = torch.linalg.svdvals(expected_sq)
        rho, d = float(sv[1] / sv[0]) ** 2, max(m, n)
        delta = gamma(d + 2, U64)
        u_all = torch.linalg.svd(expected_sq)[0]
        start = torch.ones(m, dtype=torch.float64)
        tangent = float(torch.linalg.vector_norm(u_all[:, 1:].T @ start) / (u_all[:, 0] @ start).abs())
        direction = rho**200 * tangent + 4 * delta / (1 - rho)
        atol = direction + C * d * U64 * float(sv[0] / (sv[0] - sv[1]))
        assert torch.allclose(q / q.norm(), left, atol=atol, rtol=0)
        assert torch.allclose(s / s.norm(), right, atol=atol, rtol=0)
        # the pair also satisfies Eq. 16 as written: s = Diag(E[G^T Q G]) / ||Q||_F^2, q = Diag(E[G S G^T]) / ||S||_F^2
        # s came from the previous q, which differs from the final one by the last step's direction change (<= 2
        # `direction` of ||q||, i.e. that / min q_i entrywise) and one step's rounding (2 gamma_{d+2}): 3 times that
        # in s (the positive sum and the squared norm); the sample means round by gamma_{200+d} (positive terms).
        drift = max(2 * direction * float(v.norm() / v.min()) + 2 * gamma(d + 2, U64) for v in (q, s))
        rtol = 3 * drift + 2 * gamma(200 + d, U64)
        s_eq16 = torch.stack([torch.diagonal(g.T @ torch.diag(q) @ g) for g in samples]).mean(0) / q.square().sum()
        q_eq16 = torch.stack([torch.diagonal(g @ torch.diag(s) @ g.T) for g in samples]).mean(0) / s.square().sum()
        assert torch.allclose(s_eq16, s, rtol=rtol, atol=0)
        assert torch.allclose(q_eq16, q, rtol=rtol, atol=0)


def test_fixed_point_minimises_frobenius_distance_over_s_kron_q() -> None:
    # Eq. 2 with structure S (x) Q: the diagonal of F is Vec(E[G^2]); s q^T is its best rank-1 fit.
    gen = torch.Generator().manual_seed(1)
    samples = torch.randn(50, 3, 4, generator=gen, dtype=torch.float64)
    fisher = torch.stack([g.T.reshape(-1).outer(g.T.reshape(-1)) for g in samples]).mean(0)  # column stacking
    s, q = fixed_point(samples.square().mean(0), iterations=300)
    best = torch.linalg.matrix_norm(torch.kron(torch.diag(s), torch.diag(q)) - fisher)
    for _ in range(20):
        ds = s * (1 + 0.05 * torch.randn(4, generator=gen, dtype=torch.float64))
        dq = q * (1 + 0.05 * torch.randn(3, generator=gen, dtype=torch.float64))
        other = torch.linalg.matrix_norm(torch.kron(torch.diag(ds), torch.diag(dq)) - fisher)
        # Each float64 Frobenius norm of 144 differences errs by <= (gamma_144 + 3 u) of itself (the differences, the
        # sum of squares, the root); the fixed point is converged (rho^300). A 5% move costs O(0.05^2) of ||F||.
        assert other >= best - (gamma(144, U64) + 3 * U64) * (best + other)


def _one_step(grad: torch.Tensor, **kwargs: object) -> torch.Tensor:
    weight = nn.Parameter(torch.zeros_like(grad))
    opt = RACS([weight], **kwargs)
    weight.grad = grad.clone()
    opt.step()
    return weight.detach().clone()


def test_hand_derived_first_step_float64() -> None:
    g = torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, -1.0]], dtype=torch.float64)
    p = g.square()
    q = torch.ones(2, dtype=torch.float64)
    for _ in range(5):
        s = torch.tensor([sum(p[i, j] * q[i] for i in range(2)) for j in range(3)]) / sum(x * x for x in q)
        q = torch.tensor([sum(p[i, j] * s[j] for j in range(3)) for i in range(2)]) / sum(x * x for x in s)
    s_ema, q_ema = 0.1 * s, 0.1 * q  # zero init, beta 0.9
    expected_tilde = torch.tensor(
        [[g[i, j].item() / math.sqrt(q_ema[i].item() * s_ema[j].item()) for j in range(3)] for i in range(2)],
        dtype=torch.float64,
    )
    expected = -0.02 * 1.0 * 0.05 * expected_tilde  # eta = 1 at t = 1
    got = _one_step(g, lr=0.02, beta=0.9, alpha=0.05)
    # Both are float64 runs of the same nonnegative iteration: s and q within `_relative_bound` (5 iterations,
    # gain 3 per half-step: ~3e-11), the EMA, rsqrt, products and the step add ~10 u, each side; the update's entry
    # moves by half of s's and q's relative errors. Another iteration count or a missing EMA factor: O(1).
    rtol = 2 * (_relative_bound(2, 3, 5) + 10 * U64)
    assert torch.allclose(got, expected, rtol=rtol, atol=0)


def test_update_invariant_to_gradient_scale() -> None:
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(5, 7, generator=gen, dtype=torch.float64) for _ in range(4)]
    finals = []
    for scale in (1.0, 1e3):
        weight = nn.Parameter(torch.zeros(5, 7, dtype=torch.float64))
        opt = RACS([weight])
        for g in grads:
            weight.grad = scale * g
            opt.step()
        finals.append(weight.detach().clone())
    # Exact in exact arithmetic (s -> c^2 s, q unchanged); in float64 each run's update is within
    # `_relative_bound` + 10 u of its exact value (entrywise, relative; the EMA and the limiter's ratio add a few u),
    # the weight adds one rounding per step: |dW| <= 4 (2 e |update| + u |W|) over the 4 steps. An eps or a
    # non-homogeneous ridge breaks the invariance by O(1) at 1e3.
    relative = 2 * (_relative_bound(5, 7, 5) + 10 * U64) + U64
    assert torch.allclose(finals[0], finals[1], rtol=4 * relative, atol=0)


def test_tall_matrix_is_processed_as_its_transpose() -> None:
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    # The tall matrix runs on a transposed view, the wide one on a contiguous copy: the same float64 arithmetic,
    # possibly summed in another order, each within `_relative_bound` + 10 u of the exact step (entrywise).
    rtol = 2 * (_relative_bound(4, 7, 5) + 10 * U64)
    assert torch.allclose(_one_step(g), _one_step(g.T.contiguous()).T, rtol=rtol, atol=0)
    weight = nn.Parameter(torch.zeros(7, 4, dtype=torch.float64))
    opt = RACS([weight])
    weight.grad = g
    opt.step()
    assert opt.state[weight]["row_scale"].shape == (4,) and opt.state[weight]["col_scale"].shape == (7,)


def test_limiter_caps_norm_growth_at_gamma() -> None:
    g = torch.randn(4, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for limiter in (True, False):
        weight = nn.Parameter(torch.zeros(4, 6, dtype=torch.float64))
        opt = RACS([weight], lr=1.0, alpha=1.0, ema=False, limiter=limiter)
        weight.grad = g
        opt.step()
        first = weight.detach().clone()
        phi = opt.state[weight]["phi"].item()
        # W = 0 - lr G~ (lr = alpha = 1): exact; phi = eta ||G~|| and the test's ||W|| are two float64 Frobenius norms
        # of the same 24 numbers, each within gamma_24 / 2 + u of the exact one (eta = 1 exactly at t = 1).
        assert math.isclose(phi, torch.linalg.matrix_norm(first).item(), rel_tol=gamma(24, U64) + 2 * U64)
        # a larger gradient alone would not grow G~ (scale invariance); one dominant row makes P far from
        # rank 1, which raises ||G~|| (7.5 -> 19.3 here), so the limiter must engage
        g2 = g.clone()
        g2[0] *= 50.0
        weight.grad = g2
        opt.step()
        second = weight.detach() - first
        raw = racs.scaled_gradient(g2, *reversed(fixed_point(g2.square(), 5)))
        assert raw.norm() > 2 * phi
        # ema=False: the step's G~ is `raw`'s float64 computation on a (1, 4, 6) stack, within `_relative_bound` +
        # 10 u of the exact one as `raw` is (entrywise), scaled by eta = gamma phi / ||G~|| (3 roundings); W_2 - W_1
        # recovers it up to the rounding of W_2 and of the difference, 2 u (|W_1| + |W_2|) entrywise, so norms agree to
        # (3 + gamma_24 + 2) u plus that over ||W_2 - W_1||. A limiter that skips eta (or caps at gamma ||G~_prev||)
        # is off by >= 1%.
        reread = 2 * U64 * float((first.abs() + weight.detach().abs()).max())
        if limiter:
            rel = 5 * U64 + gamma(24, U64) + reread * math.sqrt(24) / second.norm().item()
            assert math.isclose(second.norm().item(), 1.01 * phi, rel_tol=rel)
            assert math.isclose(opt.state[weight]["phi"].item(), 1.01 * phi, rel_tol=5 * U64 + gamma(24, U64))
        else:
            rtol = 2 * (_relative_bound(4, 6, 5) + 10 * U64)
            assert torch.allclose(-second, raw, rtol=rtol, atol=reread)


def test_limiter_factor_formula() -> None:
    phi = torch.tensor([0.0, 2.0, 2.0], dtype=torch.float64)
    norm = torch.tensor([5.0, 1.0, 4.0], dtype=torch.float64)
    eta = racs.limiter_factor(norm, phi, 1.01)
    # (a) Exact: 4 / 2 = 2 and 1.01 / 2 divide by powers of two; no other branch rounds.
    assert torch.equal(eta, torch.tensor([1.0, 1.0, 1.01 / 2.0], dtype=torch.float64))


def test_ema_switch_off_uses_current_estimate() -> None:
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with_ema, without = _one_step(g), _one_step(g, ema=False)
    # zero-init EMA scales s and q by 0.1 each at t = 1, so the step is 1/sqrt(0.01) = 10x larger; both runs share
    # s and q from the same fixed point (the same ops), then round: the EMA's (1 - 0.9) q and s (1 - 0.9 is 0.1 to
    # 2 u; a product each, halved by the roots: 2 u), the rsqrts (2 u each, both runs: 8 u), G q^-1/2 s^-1/2 and the
    # step's scaling (4 u per run: 8 u) and 10 x (u): <= 20 u relative. An EMA factor missing or applied twice is
    # off by 10x or 3.2x.
    assert torch.allclose(with_ema, 10.0 * without, rtol=20 * U64, atol=0)


def test_zero_rows_give_zero_update_not_nan() -> None:
    g = torch.zeros(3, 4)
    g[0] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = _one_step(g)
    assert torch.isfinite(out).all() and (out[1:] == 0).all() and (out[0] != 0).all()
    assert torch.isfinite(_one_step(torch.zeros(3, 4))).all()


def test_state_bytes_is_sgd_plus_m_plus_n_plus_one() -> None:
    params = [nn.Parameter(torch.randn(6, 9)), nn.Parameter(torch.randn(10, 4)), nn.Parameter(torch.randn(4, 2, 3, 3))]
    opt = RACS(params)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    measured = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values())
    assert measured == 4 * ((6 + 9 + 1) + (4 + 10 + 1) + (4 + 18 + 1))
    assert racs.racs_state_bytes([(6, 9), (10, 4), (4, 2, 3, 3)], [], racs.RACS_ENTRY.defaults) == measured
    assert memory.matrix_state_elements("racs", (512, 1376)) == 512 + 1376 + 1


@pytest.mark.parametrize("batch_matrices", ["on", "off"])
def test_bucketed_step_equals_single_matrix_steps(batch_matrices: str) -> None:
    """Three same-shape matrices, a tall one and a conv filter stepped in one group equal each stepped alone.

    Exact under "off" (the same ops on each matrix). Under "on" the products run batched, which may accumulate in
    another order than the lone matrix's matmul: each run's update is within `_relative_bound` (float32, 5 iterations,
    ~1e-2 worst case) plus the EMA, rsqrt, norm and limiter's 20 u of the exact one, entrywise relative, and W adds
    one rounding per step: |dW| <= 2 e sum_t max|update_t| + 3 x 2 u max|W|. A matrix stepped with another's state
    is off by O(lr alpha).
    """
    gen = torch.Generator().manual_seed(6)
    shapes = [(4, 6), (4, 6), (4, 6), (7, 3), (5, 2, 3, 3)]
    grads = [[torch.randn(shape, generator=gen) for shape in shapes] for _ in range(3)]
    together = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    alone = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    opt = RACS(together, batch_matrices=batch_matrices)
    singles = [RACS([p], batch_matrices="off") for p in alone]
    moved = [0.0] * len(shapes)
    for step_grads in grads:
        for p, q, g in zip(together, alone, step_grads, strict=True):
            p.grad, q.grad = g, g.clone()
        before = [q.detach().clone() for q in alone]
        opt.step()
        for single in singles:
            single.step()
        moved = [total + float((q.detach() - b).abs().max()) for total, q, b in zip(moved, alone, before, strict=True)]
    for p, q, total in zip(together, alone, moved, strict=True):
        if batch_matrices == "off":
            assert torch.equal(p.detach(), q.detach())
        else:
            rows, cols = sorted(p.reshape(p.shape[0], -1).shape)
            relative = _relative_bound(rows, cols, 5, U32) + 20 * U32
            atol = 2 * relative * total + 3 * 2 * U32 * float(q.detach().abs().max())
            torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=atol)
    assert measure.state_bytes(opt) == sum(measure.state_bytes(single) for single in singles)
    assert measure.state_bytes(opt) == racs.racs_state_bytes(
        shapes, [], {**racs.RACS_ENTRY.defaults, "batch_matrices": batch_matrices}
    )


def test_batch_matrices_must_be_a_known_mode() -> None:
    with pytest.raises(ValueError, match="batch_matrices"):
        RACS([nn.Parameter(torch.zeros(4, 6))], batch_matrices="yes")
    assert racs.RACS_ENTRY.defaults["batch_matrices"] == "auto"


def test_routing_records_head_choice() -> None:
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    named = list(model.named_parameters())
    hp = racs.RACS_ENTRY.defaults
    routing = racs.RACS_ENTRY.route(model, named, hp)
    assert routing.structured == ("1.weight",)
    assert "3.weight" in routing.fallback and "0.weight" in routing.fallback
    routing = racs.RACS_ENTRY.route(model, named, {**hp, "head_to_fallback": False})
    assert routing.structured == ("1.weight", "3.weight")
