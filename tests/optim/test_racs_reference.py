"""RACS over several steps against a float64 reference written from Algorithm 1 of Gong, Scetbon, Ma & Meeds,
"Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation with a Low-Rank Extension"
(arXiv 2502.07752), with its EMA (lines 6-7) and norm-growth limiter (lines 9-10) both active.

Per step t: P = G_t^2; from q = 1, five times s = P^T q / ||q||^2, q = P s / ||s||^2 (Eq. 16, Sec. 4);
s_t = beta s_{t-1} + (1 - beta) s, q_t likewise from s_0 = q_0 = 0; G~ = Diag(q_t)^-1/2 G Diag(s_t)^-1/2;
eta = gamma / max(||G~|| / phi_{t-1}, gamma) for t > 1 (1 at t = 1); phi_t = eta ||G~||; W <- W - lr eta alpha G~.
The norm is Frobenius (the paper names none; Fira's limiter, which Alg. 1 takes, uses it).

Tolerance: the optimizer computes in float64 for float64 parameters and follows the same operations, so the
trajectories agree to rounding. The bound is first order: the reference's derivatives (autograd) with respect to
the relative rounding of every quantity it computes, times that rounding's bound (`rounding_bounds`), for both
computations; any change to the EMA, the limiter or the scalings moves a step by at least 1e-3 (asserted below on
the reference itself).
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


U64 = 2.0**-53
"""float64 unit roundoff."""


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u), float64."""
    return n * U64 / (1 - n * U64)


def reference(
    grads: list[torch.Tensor], ema: bool = True, limiter: bool = True, probes: list | None = None
) -> tuple[list[torch.Tensor], list[float]]:
    """The per-step updates W_{t+1} - W_t of Algorithm 1 and the limiter factors eta_t.

    With `probes`, every rounded quantity x is computed as x (1 + theta), theta a zero tensor that requires grad,
    and (theta, bound on |theta|) is appended: the first-order rounding model fl(x) = x (1 + theta). Every sum here
    has positive terms (P = G^2 >= 0, q, s > 0, squares), so an n-term sum or dot product in any order is its exact
    value times (1 + theta), |theta| <= gamma_n."""

    def rounded(x: torch.Tensor, bound: float) -> torch.Tensor:
        if probes is None:
            return x
        theta = torch.zeros_like(x, requires_grad=True)
        probes.append((theta, bound))
        return x * (1 + theta)

    beta = BETA if ema else 0.0
    s_avg, q_avg, phi = torch.zeros(N, dtype=torch.float64), torch.zeros(M, dtype=torch.float64), 0.0
    updates, etas = [], []
    for t, g in enumerate(grads, start=1):
        p = rounded(g * g, U64)
        q = torch.ones(M, dtype=torch.float64)
        for _ in range(ITERATIONS):
            s = rounded(rounded(p.T @ q, gamma(M)) / rounded(q @ q, gamma(M)), U64)
            q = rounded(rounded(p @ s, gamma(N)) / rounded(s @ s, gamma(N)), U64)
        s_avg = rounded(beta * s_avg + (1 - beta) * s, gamma(3))  # two products, the sum, and 1 - beta
        q_avg = rounded(beta * q_avg + (1 - beta) * q, gamma(3))
        # q^(-1/2), s^(-1/2) (a sqrt and a division, or rsqrt as 1 / sqrt) and the two products
        row, col = rounded(torch.sqrt(q_avg), gamma(2)), rounded(torch.sqrt(s_avg), gamma(2))
        scaled = rounded(g / row[:, None] / col[None, :], gamma(2))
        norm = rounded(torch.linalg.matrix_norm(scaled), gamma(M * N + 1))
        eta = rounded(GAMMA / torch.clamp(norm / phi, min=GAMMA), gamma(2)) if t > 1 and limiter else 1.0
        phi = rounded(eta * norm, U64)
        updates.append(rounded(-LR * eta * ALPHA * scaled, gamma(3)))
        etas.append(float(eta.detach()) if isinstance(eta, torch.Tensor) else eta)
    return updates, etas


def rounding_bounds(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per step, entrywise: |our update - the reference's| <= 2 sum over roundings |d update / d theta| |theta|_max
    (first order; both computations round each quantity once, in their own order, within the same bounds). Any
    change to the EMA, the limiter or the scalings moves a step by >= 1e-3 relative; these bounds are ~1e-14."""
    probes: list = []
    updates, _ = reference(grads, probes=probes)
    thetas = [theta for theta, _ in probes]
    out = []
    for update in updates:
        basis = torch.eye(update.numel(), dtype=torch.float64).view(-1, *update.shape)
        slopes = torch.autograd.grad(update, thetas, basis, retain_graph=True, allow_unused=True, is_grads_batched=True)
        terms = [
            s.abs().reshape(len(s), -1).sum(1) * limit
            for s, (_, limit) in zip(slopes, probes, strict=True)
            if s is not None
        ]
        out.append(2 * sum(terms).view(update.shape))
    return out


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
    bounds = rounding_bounds(grads)
    for t, (g, step, bound) in enumerate(zip(grads, expected, bounds, strict=True), start=1):
        before = w.detach().clone()
        w.grad = g.clone()
        opt.step()
        # + W's own rounding when the step is added (u |W_t|) and that of the difference taken here (u |step|)
        moved = w.detach() - before
        allowed = bound + U64 * (w.detach().abs() + moved.abs())
        assert bool(((moved - step).abs() <= allowed).all()), (
            f"step {t}: {float(((moved - step).abs() / allowed).max())}"
        )


def test_a_tall_matrix_follows_algorithm_1_on_its_transpose():
    """The paper assumes m <= n; a tall matrix is processed as its transpose (same trajectory, transposed)."""
    grads = gradients()
    expected, _ = reference(grads)
    w = nn.Parameter(torch.zeros(N, M, dtype=torch.float64))
    opt = RACS([w], lr=LR, beta=BETA, alpha=ALPHA, gamma=GAMMA, iterations=ITERATIONS)
    for g, step, bound in zip(grads, expected, rounding_bounds(grads), strict=True):
        before = w.detach().clone()
        w.grad = g.T.clone()
        opt.step()
        moved = w.detach() - before  # the bounds of the wide run, transposed, as in the test above
        assert bool(((moved - step.T).abs() <= bound.T + U64 * (w.detach().abs() + moved.abs())).all())
