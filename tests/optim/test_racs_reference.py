"""RACS over several steps against a float64 reference written from Algorithm 1 of Gong, Scetbon, Ma & Meeds,
"Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation with a Low-Rank Extension"
(arXiv 2502.07752), with its EMA (lines 6-7) and norm-growth limiter (lines 9-10) both active.

Per step t: P = G_t^2; from q = 1, five times s = P^T q / ||q||^2, q = P s / ||s||^2 (Eq. 16, Sec. 4);
s_t = beta s_{t-1} + (1 - beta) s, q_t likewise from s_0 = q_0 = 0; G~ = Diag(q_t)^-1/2 G Diag(s_t)^-1/2;
eta = gamma / max(||G~|| / phi_{t-1}, gamma) for t > 1 (1 at t = 1); phi_t = eta ||G~||; W <- W - lr eta alpha G~.
The norm is Frobenius (the paper names none; Fira's limiter, which Alg. 1 takes, uses it).

Tolerance: the optimizer computes in float64 for float64 parameters and follows the same operations, so the
trajectories agree to rounding; 1e-12 relative per step leaves room for summation order, while any change to the
EMA, the limiter or the scalings moves a step by at least 1e-3 (asserted below on the reference itself).
"""

from __future__ import annotations

import torch
from torch import nn

from structbench.optim.racs import RACS

LR, BETA, ALPHA, GAMMA, ITERATIONS = 0.02, 0.9, 0.05, 1.01, 5
M, N, STEPS = 5, 8, 8


def gradients() -> list[torch.Tensor]:
    """Gradients growing 3x per step with row and column scales that change: the EMA lags behind the new scalings, so
    ||G~|| grows past gamma phi on several steps and the limiter binds."""
    gen = torch.Generator().manual_seed(11)
    out = []
    for t in range(STEPS):
        rows = torch.linspace(0.5, 2.0, M, dtype=torch.float64) ** (t % 3)
        cols = torch.rand(N, generator=gen, dtype=torch.float64) + 0.2
        out.append(rows[:, None] * torch.randn(M, N, generator=gen, dtype=torch.float64) * cols[None, :] * 3.0**t)
    return out


def reference(
    grads: list[torch.Tensor], ema: bool = True, limiter: bool = True
) -> tuple[list[torch.Tensor], list[float]]:
    """The per-step updates W_{t+1} - W_t of Algorithm 1 and the limiter factors eta_t."""
    beta = BETA if ema else 0.0
    s_avg, q_avg, phi = torch.zeros(N, dtype=torch.float64), torch.zeros(M, dtype=torch.float64), 0.0
    updates, etas = [], []
    for t, g in enumerate(grads, start=1):
        p = g * g
        q = torch.ones(M, dtype=torch.float64)
        for _ in range(ITERATIONS):
            s = p.T @ q / (q @ q)
            q = p @ s / (s @ s)
        s_avg = beta * s_avg + (1 - beta) * s
        q_avg = beta * q_avg + (1 - beta) * q
        scaled = g / torch.sqrt(q_avg)[:, None] / torch.sqrt(s_avg)[None, :]
        norm = float(torch.linalg.matrix_norm(scaled))
        eta = GAMMA / max(norm / phi, GAMMA) if t > 1 and limiter else 1.0
        phi = eta * norm
        updates.append(-LR * eta * ALPHA * scaled)
        etas.append(eta)
    return updates, etas


def test_a_multi_step_trajectory_with_ema_and_limiter_follows_algorithm_1():
    grads = gradients()
    expected, etas = reference(grads)
    assert sum(eta < 1 for eta in etas) >= 3  # the limiter binds on several steps
    for other in (reference(grads, ema=False)[0], reference(grads, limiter=False)[0]):
        gap = max(
            float(torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b))
            for a, b in zip(other, expected, strict=True)
        )
        assert gap > 1e-3
    w = nn.Parameter(torch.zeros(M, N, dtype=torch.float64))
    opt = RACS([w], lr=LR, beta=BETA, alpha=ALPHA, gamma=GAMMA, iterations=ITERATIONS)
    for t, (g, step) in enumerate(zip(grads, expected, strict=True), start=1):
        before = w.detach().clone()
        w.grad = g.clone()
        opt.step()
        torch.testing.assert_close(w.detach() - before, step, rtol=1e-12, atol=0, msg=f"step {t}")


def test_a_tall_matrix_follows_algorithm_1_on_its_transpose():
    """The paper assumes m <= n; a tall matrix is processed as its transpose (same trajectory, transposed)."""
    grads = gradients()
    expected, _ = reference(grads)
    w = nn.Parameter(torch.zeros(N, M, dtype=torch.float64))
    opt = RACS([w], lr=LR, beta=BETA, alpha=ALPHA, gamma=GAMMA, iterations=ITERATIONS)
    for g, step in zip(grads, expected, strict=True):
        before = w.detach().clone()
        w.grad = g.T.clone()
        opt.step()
        torch.testing.assert_close(w.detach() - before, step.T, rtol=1e-12, atol=0)
