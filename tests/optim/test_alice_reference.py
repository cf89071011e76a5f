"""Alice and Alice-0 over several subspace refreshes against a float64 reference written from the algorithm boxes of
Gong, Scetbon, Ma & Meeds (arXiv 2502.07752): Algorithm 4 (the optimizer), Algorithm 2 (switching), Algorithm 3
(compensation) and Algorithm 10 (one step of subspace iteration).

Per step t (W is m x n with m <= n; rank r, leading l, interval K):
- refresh when t == 1 or t mod K == 0 (Alg. 4 line 5): Q = beta3 U Q~ U^T + (1 - beta3) G G^T with the previous U
  (line 6; Alice-0: beta3 = 0); U' = one subspace-iteration step from the previous U followed by the Rayleigh-Ritz
  rotation (Alg. 10), or the top-r eigenvectors at t = 1 where there is no previous U; U = [top l of U', r - l
  columns sampled from the orthogonal complement of U'] (Alg. 2);
- sigma = U^T G; Q~ = beta3 Q~ + (1 - beta3) sigma sigma^T; m, v EMAs (beta1, beta2) of sigma, sigma^2; omega = m /
  sqrt(v) (lines 11-15, no epsilon, no bias correction);
- compensation (Alg. 3 with beta = beta1): p = beta1 p + (1 - beta1)(1^T G^2 - 1^T sigma^2);
  C = sqrt(m - r)(G - U U^T G) Diag(p)^-1/2; eta = gamma / max(||C|| / phi, gamma) if phi > 0 else 1; phi = ||eta C||;
- W <- W - lr alpha (U omega + alpha_c eta C) (line 17).

Choices the paper leaves open are taken as the optimizer documents them: eigenvector signs (each Ritz vector signed
to overlap non-negatively with the previous U's column; at t = 1 the largest-magnitude entry positive) and the
random sample of complement columns. The sample is read from the optimizer's basis after each refresh and checked
for what Algorithm 2 requires (orthonormal columns orthogonal to span(U')); everything else is recomputed here.

Tolerance: for float64 parameters the optimizer's eigendecompositions run in float64 and return float32
eigenvectors (linalg.eigh_with_retry), so its basis carries a u32 = 2^-24 rounding per eigenvector entry, which
omega = m / sqrt(v) and the compensation pass on. The bounds are first order (`first_order_bounds`): autograd
derivatives of the reference's outputs with respect to each modelled rounding, times its bound (~1e-6 of a step
here), while the refresh, tracking and compensation changes checked below move a step by more than 1e-2 (asserted on
the reference itself).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from structbench.optim.alice import Alice
from tests.support.measures import relative_gap

LR, ALPHA, ALPHA_C, BETA1, BETA2, GAMMA = 0.02, 0.3, 0.4, 0.9, 0.95, 1.01  # beta2 != beta1: Alg. 3 uses beta1
M, N, RANK, LEADING, INTERVAL, STEPS = 8, 12, 4, 2, 3, 8  # refreshes at t = 1, 3, 6
F64 = torch.float64


def gradients() -> list[torch.Tensor]:
    """Gradients whose dominant row space drifts, so each refresh changes the basis."""
    gen = torch.Generator().manual_seed(5)
    drift = torch.linalg.qr(torch.randn(M, M, generator=gen, dtype=F64))[0]
    out = []
    for t in range(STEPS):
        angle = 0.4 * t
        rotation = torch.eye(M, dtype=F64)
        rotation[:2, :2] = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        spread = torch.diag(torch.linspace(3.0, 0.3, M, dtype=F64))
        out.append(drift @ rotation @ spread @ torch.randn(M, N, generator=gen, dtype=F64))
    return out


U32, U64 = 2.0**-24, 2.0**-53
"""float32 and float64 unit roundoffs."""


def gamma(n: int, u: float = U64) -> float:
    return n * u / (1 - n * u)


def signed_to(vectors: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    if previous is None:
        peak = vectors.gather(0, vectors.abs().argmax(0, keepdim=True))
        return vectors * torch.where(peak < 0, -1.0, 1.0)
    return vectors * torch.where((vectors * previous).sum(0, keepdim=True) < 0, -1.0, 1.0)


def ritz_basis(q: torch.Tensor, previous: torch.Tensor | None, rounded=lambda x, bound: x) -> torch.Tensor:
    """U' of Alg. 2 line 2: Alg. 10 with one step (QR of Q U_prev, Rayleigh-Ritz), or EVD(Q, r) at t = 1."""
    if previous is None:
        _, vecs = torch.linalg.eigh(q)
        return signed_to(rounded(vecs.flip(-1)[:, :RANK], U32), None)
    u1, r = torch.linalg.qr(rounded(q @ previous, gamma(2 * M)))
    u1 = u1 * torch.sign(torch.diagonal(r))
    _, vecs = torch.linalg.eigh(u1.T @ q @ u1)
    return signed_to(u1 @ rounded(vecs.flip(-1), U32), previous)


def reference(grads, beta3, sampled_columns, tracking=True, compensation=True, probes=None):
    """Per-step updates of Algorithm 4 and the Ritz bases U'; `sampled_columns(t)` gives the r - l sampled columns.

    With `probes`, the optimizer's roundings are modelled as x (1 + theta), theta a zero tensor requiring grad, and
    (theta, bound on |theta|) appended: its eigenvectors are float64 ones rounded to float32 (u32 per entry), every
    other quantity a float64 computation (gamma_n for an n-term sum or product chain, entrywise relative, a valid
    model for the products and the EMAs; the sums that cancel, Q U, U^T G, p and G - U U^T G, get an absolute
    model below). The QR and eigh backward errors (m u64 ||Q||) enter through Q U's bound, 2M u64."""

    def rounded(x: torch.Tensor, bound: float) -> torch.Tensor:
        if probes is None:
            return x
        theta = torch.zeros_like(x, requires_grad=True)
        probes.append((theta, bound))
        return x * (1 + theta)

    def summed(exact: torch.Tensor, magnitude: torch.Tensor, n: int) -> torch.Tensor:
        """An n-term float64 sum: exact + theta * magnitude, |theta| <= gamma_n (magnitude = its sum of |terms|)."""
        if probes is None:
            return exact
        theta = torch.zeros_like(exact, requires_grad=True)
        probes.append((theta, gamma(n)))
        return exact + theta * magnitude.detach()

    u = None
    tracked = torch.zeros(RANK, RANK, dtype=F64)
    m = torch.zeros(RANK, N, dtype=F64)
    v = torch.zeros(RANK, N, dtype=F64)
    p = torch.zeros(N, dtype=F64)
    phi = torch.zeros((), dtype=F64)
    updates, ritz = [], {}
    for t, g in enumerate(grads, start=1):
        if t == 1 or t % INTERVAL == 0:
            q = rounded((1 - beta3) * g @ g.T, gamma(N + 2))
            if u is not None and tracking:
                q = rounded(q + beta3 * u @ tracked @ u.T, gamma(2 * RANK + 2))
            ritz[t] = ritz_basis(q, u, rounded)
            u = torch.cat((ritz[t][:, :LEADING], sampled_columns(t)), dim=1)
        sigma = summed(u.T @ g, u.abs().T @ g.abs(), M)
        tracked = rounded(beta3 * tracked + (1 - beta3) * sigma @ sigma.T, gamma(N + 3))
        m = rounded(BETA1 * m + (1 - BETA1) * sigma, gamma(3))
        v = rounded(BETA2 * v + (1 - BETA2) * sigma**2, gamma(4))
        omega = rounded(m / torch.sqrt(v), gamma(2))
        outside = summed((g**2).sum(0) - (sigma**2).sum(0), (g**2).sum(0) + (sigma**2).sum(0), M + RANK + 2)
        p = rounded(BETA1 * p + (1 - BETA1) * outside, gamma(3))
        residual = summed(g - u @ sigma, g.abs() + u.abs() @ sigma.abs(), RANK + 1)
        c = rounded(math.sqrt(M - RANK) * residual / torch.sqrt(p), gamma(4))
        norm = rounded(torch.linalg.matrix_norm(c), gamma(M * N + 1))
        eta = rounded(GAMMA / torch.clamp(norm / phi, min=GAMMA), gamma(2)) if phi > 0 else 1.0
        phi = eta * norm
        step = u @ omega + (ALPHA_C * eta * c if compensation else 0.0)
        updates.append(rounded(-LR * ALPHA * step, gamma(RANK + 4)))
    return updates, ritz


def first_order_bounds(grads, beta3, sampled_columns) -> dict[str, torch.Tensor]:
    """Entrywise first-order bounds on |optimizer - reference| for each step's update and each refresh's U':
    sum over the modelled roundings of |d output / d theta| times theta's bound (autograd through the float64
    reference, eigh and QR included). The float32 eigenvector roundings are the optimizer's alone (u32 + the
    reference's u64); every float64 rounding happens in both computations (twice its bound). Then W's own rounding,
    u64 |W|, when the update is added and read back. The refresh, tracking and compensation changes checked below
    move a step by > 1e-2 relative; these bounds are ~1e-6 of it."""
    probes: list = []
    updates, ritz = reference(grads, beta3, sampled_columns, probes=probes)
    thetas = [theta for theta, _ in probes]
    weights = [bound + U64 if bound == U32 else 2 * bound for _, bound in probes]
    outputs = {f"update {t}": x for t, x in enumerate(updates, start=1)} | {f"ritz {t}": x for t, x in ritz.items()}
    weight_sum = torch.cumsum(torch.stack([x.abs() for x in updates]), 0)
    out = {}
    for key, x in outputs.items():
        basis = torch.eye(x.numel(), dtype=F64).view(-1, *x.shape)
        slopes = torch.autograd.grad(x, thetas, basis, retain_graph=True, allow_unused=True, is_grads_batched=True)
        terms = [d.abs().reshape(len(d), -1).sum(1) * w for d, w in zip(slopes, weights, strict=True) if d is not None]
        bound = sum(terms).view(x.shape)
        if key.startswith("update"):
            bound = bound + 2 * U64 * weight_sum[int(key.split()[1]) - 1]
        out[key] = bound.detach()
    return out


def run_optimizer(grads, beta3):
    """The optimizer's per-step updates and its basis after each step."""
    w = nn.Parameter(torch.zeros(M, N, dtype=F64))
    opt = Alice(
        [w], lr=LR, alpha=ALPHA, alpha_c=ALPHA_C, beta1=BETA1, beta2=BETA2, beta3=beta3, gamma=GAMMA,
        rank=RANK, leading=LEADING, update_interval=INTERVAL,
    )  # fmt: skip
    updates, bases = [], {}
    for t, g in enumerate(grads, start=1):
        before = w.detach().clone()
        w.grad = g.clone()
        opt.step()
        updates.append(w.detach() - before)
        bases[t] = opt.state[w]["basis"].clone()
    return updates, bases


@pytest.mark.parametrize(("name", "beta3"), [("alice", 0.999), ("alice-0", 0.0)])
def test_trajectory_through_three_refreshes_follows_algorithm_4(name, beta3):
    grads = gradients()
    actual, bases = run_optimizer(grads, beta3)
    expected, ritz = reference(grads, beta3, lambda t: bases[t][:, LEADING:])
    assert sorted(ritz) == [1, 3, 6]
    bounds = first_order_bounds(grads, beta3, lambda t: bases[t][:, LEADING:])
    for t, u_prime in ritz.items():
        u = bases[t]
        # float32-rounded eigenvectors (2 u32, Cauchy-Schwarz) times a float64 QR factor, float64 complement (M u64)
        torch.testing.assert_close(u.T @ u, torch.eye(RANK, dtype=F64), rtol=0, atol=2 * U32 + 2 * M * U64)
        assert bool(((u[:, :LEADING] - u_prime[:, :LEADING]).abs() <= bounds[f"ritz {t}"][:, :LEADING]).all())
        # sampled from the complement of U': orthogonal to our U' (M u64), which is within the bound of the hand U'
        overlap = (u_prime.T @ u[:, LEADING:]).abs()
        assert bool((overlap <= bounds[f"ritz {t}"].T @ u[:, LEADING:].abs() + 2 * M * U64).all())
    for t, (a, b) in enumerate(zip(actual, expected, strict=True), start=1):
        assert bool(((a - b).abs() <= bounds[f"update {t}"]).all()), (
            name,
            t,
            float(((a - b).abs() / bounds[f"update {t}"]).max()),
        )
    # What the comparison must be able to see: without compensation, or (Alice) without tracking at the refresh.
    variants = [reference(grads, beta3, lambda t: bases[t][:, LEADING:], compensation=False)[0]]
    if beta3 > 0:
        variants.append(reference(grads, beta3, lambda t: bases[t][:, LEADING:], tracking=False)[0])
    for variant in variants:
        assert max(relative_gap(a, b) for a, b in zip(variant, expected, strict=True)) > 1e-2
