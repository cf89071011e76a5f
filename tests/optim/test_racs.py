"""RACS (Gong et al., Sec. 4, Prop. 3 / Eq. 16, Alg. 1) against independent facts."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from structbench import measure
from structbench.optim import memory, racs
from structbench.optim.racs import RACS, fixed_point


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
        assert torch.allclose(q / q.norm(), left, atol=1e-10)
        assert torch.allclose(s / s.norm(), right, atol=1e-10)
        # the pair also satisfies Eq. 16 as written: s = Diag(E[G^T Q G]) / ||Q||_F^2, q = Diag(E[G S G^T]) / ||S||_F^2
        s_eq16 = torch.stack([torch.diagonal(g.T @ torch.diag(q) @ g) for g in samples]).mean(0) / q.square().sum()
        q_eq16 = torch.stack([torch.diagonal(g @ torch.diag(s) @ g.T) for g in samples]).mean(0) / s.square().sum()
        assert torch.allclose(s_eq16, s, rtol=1e-8)
        assert torch.allclose(q_eq16, q, rtol=1e-8)


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
        assert torch.linalg.matrix_norm(torch.kron(torch.diag(ds), torch.diag(dq)) - fisher) >= best - 1e-12


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
    assert torch.allclose(got, expected, rtol=1e-12, atol=0)


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
    assert torch.allclose(finals[0], finals[1], rtol=1e-10, atol=1e-14)


def test_tall_matrix_is_processed_as_its_transpose() -> None:
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    assert torch.allclose(_one_step(g), _one_step(g.T.contiguous()).T, rtol=1e-12)
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
        assert math.isclose(phi, torch.linalg.matrix_norm(first).item(), rel_tol=1e-12)
        # a larger gradient alone would not grow G~ (scale invariance); one dominant row makes P far from
        # rank 1, which raises ||G~|| (7.5 -> 19.3 here), so the limiter must engage
        g2 = g.clone()
        g2[0] *= 50.0
        weight.grad = g2
        opt.step()
        second = weight.detach() - first
        raw = racs.scaled_gradient(g2, *reversed(fixed_point(g2.square(), 5)))
        assert raw.norm() > 2 * phi
        if limiter:
            assert math.isclose(second.norm().item(), 1.01 * phi, rel_tol=1e-10)
            assert math.isclose(opt.state[weight]["phi"].item(), 1.01 * phi, rel_tol=1e-10)
        else:
            assert torch.allclose(-second, raw, rtol=1e-10)


def test_limiter_factor_formula() -> None:
    phi = torch.tensor([0.0, 2.0, 2.0], dtype=torch.float64)
    norm = torch.tensor([5.0, 1.0, 4.0], dtype=torch.float64)
    eta = racs.limiter_factor(norm, phi, 1.01)
    assert torch.allclose(eta, torch.tensor([1.0, 1.0, 1.01 / 2.0], dtype=torch.float64))


def test_ema_switch_off_uses_current_estimate() -> None:
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with_ema, without = _one_step(g), _one_step(g, ema=False)
    # zero-init EMA scales s and q by 0.1 each at t = 1, so the step is 1/sqrt(0.01) = 10x larger
    assert torch.allclose(with_ema, 10.0 * without, rtol=1e-12)


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
    another order than the lone matrix's matmul: a few float32 ulps per step, hence rtol 1e-5 over three steps.
    """
    gen = torch.Generator().manual_seed(6)
    shapes = [(4, 6), (4, 6), (4, 6), (7, 3), (5, 2, 3, 3)]
    grads = [[torch.randn(shape, generator=gen) for shape in shapes] for _ in range(3)]
    together = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    alone = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    opt = RACS(together, batch_matrices=batch_matrices)
    singles = [RACS([p], batch_matrices="off") for p in alone]
    for step_grads in grads:
        for p, q, g in zip(together, alone, step_grads, strict=True):
            p.grad, q.grad = g, g.clone()
        opt.step()
        for single in singles:
            single.step()
    for p, q in zip(together, alone, strict=True):
        if batch_matrices == "off":
            assert torch.equal(p.detach(), q.detach())
        else:
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-9)
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
