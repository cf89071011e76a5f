"""Test helpers shared by the GaLore, Fira and APOLLO tests: matrices with known singular values, float64 bases,
the projected Adam recomputed by hand, the step-by-step comparison with a pytorch_optimizer oracle, and the
state_dict resume check."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from torch import Tensor, nn

F64 = torch.float64
U32 = 2.0**-24
"""float32 unit roundoff."""
Svd = tuple[Tensor, Tensor, Tensor]


def known_matrix(m: int, n: int, singular: list[float], seed: int) -> Tensor:
    """U diag(s) V^T (float32) with U, V orthonormal from the QR of a float64 Gaussian; rank = len(singular)."""
    gen = torch.Generator().manual_seed(seed)
    k = len(singular)
    u, _ = torch.linalg.qr(torch.randn(m, k, generator=gen, dtype=F64))
    v, _ = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=F64))
    return (u @ torch.diag(torch.tensor(singular, dtype=F64)) @ v.T).float()


def spread(k: int) -> list[float]:
    """k well-separated singular values, 8, 5.6, 3.92, ..."""
    return [8.0 * 0.7**i for i in range(k)]


def top_basis(g: Tensor, r: int, right: bool) -> Tensor:
    """float64 top-r right singular vectors (n x r) or left singular vectors (m x r) of g."""
    u, _, vh = torch.linalg.svd(g.to(F64), full_matrices=False)
    return vh[:r].T if right else u[:, :r]


def assert_svd_basis(basis: Tensor, g: Tensor, right: bool) -> None:
    """The optimizer's float32 top-r singular subspace against float64's (the hand steps then use the optimizer's
    basis, exactly, so that their bound covers the step arithmetic only): float32 SVD is backward stable, error
    <= k u ||G|| (k = max(m, n)), so the subspace is within sin(theta) <= k u ||G|| / (s_r - s_(r+1)) (Wedin) and
    its projector within 2 sin(theta) plus the basis' non-orthonormality (k u). The bottom directions, or a
    subspace of G^T where G was meant, are off by O(1)."""
    r = basis.shape[1]
    s = torch.linalg.svdvals(g.to(F64))
    k = max(g.shape)
    sine = k * U32 * float(s[0] / (s[r - 1] - s[r]))
    top = top_basis(g, r, right)
    torch.testing.assert_close(basis @ basis.T, top @ top.T, rtol=0, atol=2 * sine + k * U32)


def growth_outside_the_subspace(seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(w0, g1, g2, basis), 6 x 10, from seeds seed, seed + 1, seed + 2: g2 is g1 plus a large component outside
    g1's top-3 left singular subspace (`basis`, float64), so a full-rank term grows far past a limiter's 1.01x."""
    w0 = known_matrix(6, 10, spread(6), seed=seed)
    g1 = 1e-2 * known_matrix(6, 10, spread(6), seed=seed + 1)
    basis = top_basis(g1, 3, right=False)
    z = torch.randn(6, 10, generator=torch.Generator().manual_seed(seed + 2), dtype=F64)
    g2 = (g1.to(F64) + 0.2 * (z - basis @ basis.T @ z)).float()
    return w0, g1, g2, basis


class Rounding:
    """A first-order model of how a float32 computation rounds, run through a float64 hand computation.

    Each modelled quantity x is computed as x (1 + theta) (`rounded`: an n-step chain of products, quotients and
    sums of like-signed terms, |theta| <= gamma_n) or x + theta |x|_abs (`summed`: an n-term sum whose terms may
    cancel, |x|_abs the sum of their magnitudes, |theta| <= gamma_n), theta a zero tensor that requires grad. To first
    order the float32 result then differs from the exact one by at most sum |d out / d theta| max|theta| (`bound`,
    entrywise, by autograd). `EXACT` leaves the computation unchanged."""

    def __init__(self, u: float = U32, probing: bool = True) -> None:
        self.u, self.probing = u, probing
        self.probes: list[tuple[Tensor, float]] = []

    def gamma(self, n: int) -> float:
        return n * self.u / (1 - n * self.u)

    def rounded(self, x: Tensor, n: int = 1) -> Tensor:
        if not self.probing:
            return x
        theta = torch.zeros_like(x, requires_grad=True)
        self.probes.append((theta, self.gamma(n)))
        return x * (1 + theta)

    def summed(self, exact: Tensor, magnitude: Tensor, n: int) -> Tensor:
        if not self.probing:
            return exact
        theta = torch.zeros_like(exact, requires_grad=True)
        self.probes.append((theta, self.gamma(n)))
        return exact + theta * magnitude.detach()

    def bound(self, out: Tensor) -> Tensor:
        """Entrywise sum over the probes of |d out / d theta| times theta's bound."""
        thetas = [theta for theta, _ in self.probes]
        basis = torch.eye(out.numel(), dtype=out.dtype).view(-1, *out.shape)
        slopes = torch.autograd.grad(out, thetas, basis, retain_graph=True, allow_unused=True, is_grads_batched=True)
        terms = [
            d.abs().reshape(len(d), -1).sum(1) * limit
            for d, (_, limit) in zip(slopes, self.probes, strict=True)
            if d is not None
        ]
        return sum(terms).view(out.shape).detach()


EXACT = Rounding(probing=False)


class HandAdamStep(NamedTuple):
    """One step of GaLore's projected HF-style Adam, recomputed by hand in float64."""

    step_size: float
    """lr sqrt(1 - b2^t) / (1 - b1^t): the bias corrections folded into the step size."""
    grad: Tensor
    """G as an (m x n) matrix (conv filters as (out, in*kh*kw))."""
    projected: Tensor
    """sigma = G V (m x r) on the right side, U^T G (r x n) on the left."""
    normalized: Tensor
    """N = m_t / (sqrt(v_t) + eps), the shape of sigma."""


def hand_projected_adam(
    grads: list[Tensor],
    basis: Tensor,
    right: bool,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    rounding: Rounding = EXACT,
) -> Iterator[HandAdamStep]:
    """GaLore's low-rank Adam with a fixed basis (n x r right, m x r left), one step per gradient, in float64.

    `rounding` models the optimizer's float32 operations: sigma a k-term projection (k the projected dimension),
    each moment update b x + (1 - b) y (3 roundings, 4 with the square), sqrt(v) + eps (2) and the quotient."""
    b1, b2 = betas
    m = v = None
    for t, g in enumerate(grads, start=1):
        g = g.to(F64).reshape(g.shape[0], -1)
        if right:
            sigma = rounding.summed(g @ basis, g.abs() @ basis.abs(), basis.shape[0])
        else:
            sigma = rounding.summed(basis.T @ g, basis.abs().T @ g.abs(), basis.shape[0])
        m = (1 - b1) * sigma if m is None else b1 * m + (1 - b1) * sigma
        v = (1 - b2) * sigma**2 if v is None else b2 * v + (1 - b2) * sigma**2
        m, v = rounding.rounded(m, 3), rounding.rounded(v, 4)
        normalized = rounding.rounded(m / rounding.rounded(v.sqrt() + eps, 2))
        yield HandAdamStep(lr * math.sqrt(1 - b2**t) / (1 - b1**t), g, sigma, normalized)


def hand_channel_ratio(normalized: Tensor, projected: Tensor, right: bool, rounding: Rounding = EXACT) -> Tensor:
    """||N_c|| / (||sigma_c|| + 1e-8) channel by channel: per row of G (norms over the r columns of sigma) on the
    right side, (m, 1); per column of G (norms over the r rows) on the left, (1, n). With `rounding`: each norm an
    r-term sum of squares and a sqrt (r + 1), the guard and the quotient (2 more)."""
    r = projected.shape[1] if right else projected.shape[0]
    if right:
        rows = range(projected.shape[0])
        ratios = [
            rounding.rounded(normalized[i].norm(), r + 1) / rounding.rounded(projected[i].norm() + 1e-8, r + 2)
            for i in rows
        ]
        return rounding.rounded(torch.stack(ratios)[:, None])
    cols = range(projected.shape[1])
    ratios = [
        rounding.rounded(normalized[:, j].norm(), r + 1) / rounding.rounded(projected[:, j].norm() + 1e-8, r + 2)
        for j in cols
    ]
    return rounding.rounded(torch.stack(ratios)[None])


def steps_beside_oracle(
    make_ours: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    make_oracle: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    shapes: list[tuple[int, int]],
    seed: int,
    atol: float,
) -> float:
    """Eight steps of ours and of the oracle from the same weights on the same gradients (drawn from `seed`), the
    weights equal to `atol` after every step. Returns how far ours moved (max abs), to show the steps are not tiny."""
    gen = torch.Generator().manual_seed(seed)
    start = [torch.randn(s, generator=gen) for s in shapes]
    ours = [nn.Parameter(w.clone()) for w in start]
    theirs = [nn.Parameter(w.clone()) for w in start]
    opt = make_ours(ours)
    oracle = make_oracle(theirs)
    for _ in range(8):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for a, b, g in zip(ours, theirs, grads, strict=True):
            a.grad, b.grad = g.clone(), g.clone()
        opt.step()
        oracle.step()
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=atol)
    return max(float((a.detach() - w).abs().max()) for a, w in zip(ours, start, strict=True))


def assert_resume_is_bit_identical(
    make: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    shapes: list[tuple[int, ...]],
    dtype: torch.dtype,
    seed: int,
    loaded_dtypes: dict[str, torch.dtype],
) -> None:
    """Three steps, a state_dict round trip into a fresh optimizer on cloned weights, three more steps of both on the
    same gradients (drawn from `seed`): the weights stay bit-identical. `loaded_dtypes` are the dtypes expected of
    the reloaded state of the first parameter."""
    gen = torch.Generator().manual_seed(seed)
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in shapes] for _ in range(6)]
    params = [nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in shapes]
    opt = make(params)
    for g in grads[:3]:
        for p, gi in zip(params, g, strict=True):
            p.grad = gi.clone()
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    resumed = make(clones)
    resumed.load_state_dict(saved)
    assert {key: resumed.state[clones[0]][key].dtype for key in loaded_dtypes} == loaded_dtypes
    for g in grads[3:]:
        for p, q, gi in zip(params, clones, g, strict=True):
            p.grad, q.grad = gi.clone(), gi.clone()
        opt.step()
        resumed.step()
    assert all(torch.equal(p, q) for p, q in zip(params, clones, strict=True))


class BucketCase(NamedTuple):
    """Matrices that one optimizer steps together (`step_together`): four of one (6 x 10) matrix shape, one of them
    a (6, 2, 5, 1) filter, and two of (10 x 6). `grads[j]` are matrix j's gradients, `rights[j]` its side."""

    starts: list[Tensor]
    grads: list[list[Tensor]]
    rights: list[bool]


def bucket_case(seed: int) -> BucketCase:
    """Each gradient sequence has a first gradient with well-separated singular values (a well-determined subspace)
    and later ones near it; matrix 0's second gradient grows far outside its first's top-3 subspace
    (`growth_outside_the_subspace`: a limiter engages for it alone), matrix 2 (the filter) starts a step late (one
    Adam step fewer than its bucket's others, so a different step size)."""
    gen = torch.Generator().manual_seed(seed)
    w0, g1, g2, _ = growth_outside_the_subspace(seed)
    starts, grads = [w0], [[g1, g2, g2.clone()]]
    for j, shape in enumerate([(6, 10), (6, 10), (6, 10), (10, 6), (10, 6)], start=1):
        starts.append(known_matrix(*shape, spread(6), seed=seed + 10 * j))
        first = 1e-2 * known_matrix(*shape, spread(6), seed=seed + 10 * j + 1)
        grads.append([first] + [first + 3e-3 * torch.randn(shape, generator=gen) for _ in range(2)])
    starts[2], grads[2] = starts[2].reshape(6, 2, 5, 1), [g.reshape(6, 2, 5, 1) for g in grads[2][1:]]
    return BucketCase(starts, grads, [False] * 4 + [True] * 2)


def step_together(
    make: Callable[[list[nn.Parameter]], torch.optim.Optimizer], case: BucketCase
) -> tuple[list[nn.Parameter], torch.optim.Optimizer]:
    """One optimizer over all of `case`'s matrices (same-shape ones share a bucket), stepped as many times as the
    longest gradient sequence; a matrix with fewer gradients has none (None) until its last len(grads) steps."""
    params = [nn.Parameter(w.clone()) for w in case.starts]
    opt = make(params)
    steps = max(len(g) for g in case.grads)
    for t in range(steps):
        for param, grads in zip(params, case.grads, strict=True):
            late = steps - len(grads)
            param.grad = grads[t - late].clone() if t >= late else None
        opt.step()
    return params, opt
