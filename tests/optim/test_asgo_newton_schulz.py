"""ASGO's default root, "newton-schulz": (V + eps I)^{-1/2} (An et al., arXiv 2503.20762, Alg. 2 line 13) by a fixed
count of cold coupled Newton–Schulz updates (linalg.inverse_sqrt_cold_updates), its residual checked on the device and
read a step later, a failed root repaired by eigh and counted.

Facts checked: each root is as close to the float64 eigendecomposition root as its own float64 residual allows (an a
posteriori perturbation bound) on well- and ill-conditioned V (cond up to 5e5, and rank-deficient V with Table 4's
eps); the update count follows the scalar recurrence; a V beyond the count's reach fails its check, is repaired by the
eigh root of the next step's V and counted; a 20-step run stays within the sum of its roots' bounds of a float64
eigh run; the steady state reads nothing on the host and decomposes nothing."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from structbench.optim import linalg
from structbench.optim.asgo import ASGO, NEWTON_SCHULZ_UPDATES
from structbench.optim.cost_profile import count
from tests.support.newton_schulz import gamma

F64 = torch.float64
U32 = 2.0**-24
"""float32 unit roundoff."""


def _statistic(k: int, rank: int, top: float, cond: float, seed: int = 0) -> torch.Tensor:
    """A float32 PSD k x k V of rank `rank` whose nonzero eigenvalues are log-spaced from `top` down to top / cond."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(k, rank, generator=gen, dtype=F64))
    values = top * torch.logspace(0.0, -math.log10(cond), rank, dtype=F64)
    return ((basis * values) @ basis.T).float()


def _exact_root(a: torch.Tensor) -> torch.Tensor:
    """A^{-1/2} in float64 of the given (float32) SPD A."""
    values, vectors = torch.linalg.eigh(a.to(F64))
    return (vectors * values.rsqrt()) @ vectors.T


def _deviation_bound(z: torch.Tensor, a: torch.Tensor) -> float:
    """The Frobenius distance from Z to A^{-1/2} allowed by Z's own float64 residual M = Z A Z - I: with Z = R + D,
    M = R^{-1} D + D R^{-1} + D A D, so in R's eigenbasis |D_ij| <= |M_ij - (D A D)_ij| rho_i rho_j / (rho_i + rho_j)
    <= (..) rho_max / 2, i.e. ||D||_F <= ||M||_F rho_max / 2 to first order (linalg.inverse_sqrt_warm_updates' bound
    (r sqrt(d) / 2) ||A^{-1/2}||_2); the second order through a 1% margin. M's float64 rounding, 4 d u64 || |Z| |A| |Z|
    ||_F, is added."""
    z, a = z.to(F64), a.to(F64)
    d = a.size(-1)
    magnitude = float(torch.linalg.matrix_norm(z.abs() @ a.abs() @ z.abs()))
    residual = float(torch.linalg.matrix_norm(z @ a @ z - torch.eye(d, dtype=F64))) + 4 * d * 2.0**-53 * magnitude
    rho_max = float(torch.linalg.eigvalsh(_exact_root(a))[-1])
    return 1.01 * residual * rho_max / 2


def _fro(a: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(a.to(F64)))


def test_the_update_count_follows_the_scalar_recurrence() -> None:
    """x <- x (3 - x)^2 / 4 from x_0 = 1 / condition: at condition 1 nothing is needed; each update multiplies a small
    x by at most 9/4, so condition 1e6 needs at least log(1e6) / log(2.25) = 17.04 updates before x nears 1, and the
    quadratic phase adds a few: 21 to reach 1e-4 (ASGO's count)."""
    assert linalg.coupled_newton_schulz_updates(1.0, 1e-4) == 0
    needed = linalg.coupled_newton_schulz_updates(1e6, 1e-4)
    assert math.log(1e6) / math.log(2.25) < needed == NEWTON_SCHULZ_UPDATES == 21
    assert linalg.coupled_newton_schulz_updates(1e6, 1e-8) > needed


@pytest.mark.parametrize(
    ("rank", "top", "cond", "eps"),
    [(64, 1.0, 1e2, 0.0), (64, 1.0, 1e4, 0.0), (64, 0.5, 5e5, 0.0), (32, 0.1, 1e3, 1e-6), (8, 0.5, 1e2, 1e-6)],
)
def test_the_root_is_as_close_to_the_float64_root_as_its_residual_allows(
    rank: int, top: float, cond: float, eps: float
) -> None:
    """k = 64; full-rank V with cond 1e2, 1e4, 5e5 (||A||_F / lambda_min up to 8.4e5, inside the 1e6 the count
    covers), and rank-deficient V (rank 32 and 8) with Table 4's eps 1e-6 (cond of V + eps I 1e5 and 5e5). The root
    passes its own check (residual <= root_tol 3e-2), is symmetric, and lies within the a priori distance that
    residual allows, (tol sqrt(k) / 2) ||A^{-1/2}||_2 (first order, 1% for the second), tol widened by the float32
    residual's rounding gamma_2k || |Z| |A| |Z| ||_F / sqrt(k); and within the a posteriori bound of its float64
    residual. A root made with 5 updates (too few for cond >= 1e2) fails its check."""
    v = _statistic(64, rank, top, cond)
    a = v + eps * torch.eye(64)
    tol = 3e-2
    found = linalg.inverse_sqrt_cold_updates(a, updates=NEWTON_SCHULZ_UPDATES, tol=tol, symmetric=True)
    assert bool(found.converged) and float(found.residual) <= tol
    assert torch.equal(found.root, found.root.mT)
    exact = _exact_root(a)
    deviation = _fro(found.root.to(F64) - exact)
    assert deviation <= _deviation_bound(found.root, a)
    z = found.root.to(F64)
    rounding = gamma(2 * 64) * _fro(z.abs() @ a.abs().to(F64) @ z.abs()) / 8
    rho_max = float(torch.linalg.eigvalsh(exact)[-1])
    assert deviation <= 1.01 * (tol + rounding) * 8 / 2 * rho_max
    early = linalg.inverse_sqrt_cold_updates(a, updates=5, tol=tol, symmetric=True)
    assert not bool(early.converged)


def _stream(shape: tuple[int, int], steps: int, seed: int = 0, noise: float = 1e-4) -> list[torch.Tensor]:
    """Low-rank gradients (rank 4, scales 1 ... 1e-3) plus full-rank noise of entry size `noise` (1e-4: V's spectrum
    spans about 1e6 with eps 1e-6)."""
    gen = torch.Generator().manual_seed(seed)
    left = torch.linalg.qr(torch.randn(shape[0], 4, generator=gen, dtype=F64))[0]
    right = torch.linalg.qr(torch.randn(shape[1], 4, generator=gen, dtype=F64))[0]
    scales = torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=F64)
    return [
        ((left * scales * torch.randn(4, generator=gen, dtype=F64)) @ right.T
         + noise * torch.randn(*shape, generator=gen, dtype=F64)).float()
        for _ in range(steps)
    ]  # fmt: skip


def test_a_twenty_step_run_stays_within_its_roots_bounds_of_a_float64_eigh_run() -> None:
    """ASGO (defaults: beta2 0.95, eps 1e-6, tau 1) on a (48, 96) weight with a fixed gradient stream (the gradients
    do not depend on W, so no error is amplified; V + eps I has cond about 1e6). The reference applies the float64
    eigh root R_t of the optimizer's own float32 V_t to its float32 momentum M_t, in float64. Per step the difference
    grows by at most lr (||(Z_t - R_t) M_t||_F + gamma_k || |Z_t| |M_t| ||_F) (the root's deviation, each root
    within its residual's bound by the test above, and the float32 product) + u ||W_t||_F (rounding the float32
    add): the run must end within the sum, and the roots' deviations must move it by less than 5% of the distance
    travelled (the stated trajectory tolerance)."""
    lr, steps, shape = 0.1, 20, (48, 96)
    w = nn.Parameter(torch.zeros(shape))
    optimizer = ASGO([w], lr=lr)
    group = optimizer.param_groups[0]
    assert group["root"] == "newton-schulz" and group["eps"] == 1e-6
    reference, allowed = torch.zeros(shape, dtype=F64), 0.0
    for grad in _stream(shape, steps):
        w.grad = grad
        optimizer.step()
        state = optimizer.state[w]
        a = state["precond"] + group["eps"] * torch.eye(48)
        root, momentum = state["inv_root"], state["momentum"].to(F64)
        reference -= lr * _exact_root(a) @ momentum
        product_rounding = gamma(48) * _fro(root.abs().to(F64) @ momentum.abs())
        assert _fro(root.to(F64) - _exact_root(a)) <= _deviation_bound(root, a)
        deviation = _fro((root.to(F64) - _exact_root(a)) @ momentum)
        allowed += lr * (deviation + product_rounding) + U32 * _fro(w.detach())
    assert optimizer.root_fallbacks == 0
    assert _fro(w.detach().to(F64) - reference) <= allowed
    assert allowed <= 0.05 * _fro(reference), allowed / _fro(reference)


def test_a_root_that_fails_its_check_is_repaired_by_eigh_at_the_next_step_and_counted() -> None:
    """eps 1e-12 on a rank-4 V: ||V + eps I||_F / lambda_min is about 1e12, far beyond the 1e6 that 21 updates cover,
    so every Newton–Schulz root fails its check (the unconverged null-space eigenvalues leave residual near 1). The
    failed root is used for its own step; at the next step the matrix gets the eigh root of its current V (exactly
    root="eigh"'s), one fallback is counted, and that step makes no Newton–Schulz root for it; the step after tries
    Newton–Schulz again. Taking the check is a deferred read, not a host read."""
    shape = (32, 64)
    grads = _stream(shape, 4, noise=0.0)
    w, twin = nn.Parameter(torch.zeros(shape)), nn.Parameter(torch.zeros(shape))
    optimizer = ASGO([w], eps=1e-12, beta2=0.0)
    exact = ASGO([twin], eps=1e-12, beta2=0.0, root="eigh")
    costs = []
    for step, grad in enumerate(grads):
        w.grad, twin.grad = grad, grad.clone()
        costs.append(count(optimizer.step, optimizer))
        exact.step()
        repaired = step % 2 == 1
        assert optimizer.root_fallbacks == (step + 1) // 2
        assert torch.equal(optimizer.state[w]["inv_root"], exact.state[twin]["inv_root"]) == repaired
    newton, repair = costs[2], costs[3]
    assert newton.reads == 0 and not newton.decompositions and newton.deferred_reads == 0  # the repair posted none
    assert repair.deferred_reads == 1 and sum(repair.decompositions.values()) >= 1


def test_without_failures_the_steady_step_reads_nothing_and_decomposes_nothing() -> None:
    """Three same-size statistics (one batch): after the first step, each step takes the previous check (one deferred
    read), makes the roots by products alone and counts no fallback."""
    params = [nn.Parameter(torch.zeros(32, 64)) for _ in range(3)]
    optimizer = ASGO(params)
    streams = [_stream((32, 64), 3, seed=i) for i in range(3)]
    for step in range(3):
        for p, stream in zip(params, streams, strict=True):
            p.grad = stream[step]
        cost = count(optimizer.step, optimizer)
    assert cost.reads == 0 and not cost.decompositions and cost.deferred_reads == 1
    assert optimizer.root_fallbacks == 0


def test_eps_zero_and_the_resolution_floor_take_eigh_roots() -> None:
    """eps = 0 (the pseudo-inverse) and eigenvalue_floor="resolution" need V's eigenvalues: "newton-schulz" computes
    those roots by eigh, exactly as root="eigh", and counts no fallback."""
    for switches in ({"eps": 0.0}, {"eigenvalue_floor": "resolution"}):
        w, twin = nn.Parameter(torch.zeros(8, 16)), nn.Parameter(torch.zeros(8, 16))
        optimizer, exact = ASGO([w], **switches), ASGO([twin], root="eigh", **switches)
        for grad in _stream((8, 16), 2):
            w.grad, twin.grad = grad, grad.clone()
            optimizer.step()
            exact.step()
        assert torch.equal(w.detach(), twin.detach()) and optimizer.root_fallbacks == 0


def test_a_checkpoint_with_a_failed_root_pending_resumes_bit_identically() -> None:
    """The failing setup above: after step 1 a failed root's check is pending. A state_dict taken then, loaded into a
    new optimizer, continues exactly as the original: the repair at step 2, its fallback count and the parameters,
    bit for bit, through step 4."""
    shape = (32, 64)
    grads = _stream(shape, 4, noise=0.0)
    w = nn.Parameter(torch.zeros(shape))
    optimizer = ASGO([w], eps=1e-12, beta2=0.0)
    w.grad = grads[0]
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    resumed_w = nn.Parameter(w.detach().clone())
    resumed = ASGO([resumed_w], eps=1e-12, beta2=0.0)
    resumed.load_state_dict(saved)
    for grad in grads[1:]:
        w.grad, resumed_w.grad = grad, grad.clone()
        optimizer.step()
        resumed.step()
        assert torch.equal(w, resumed_w)
        assert optimizer.root_fallbacks == resumed.root_fallbacks
    assert optimizer.root_fallbacks == 2  # repaired at steps 2 and 4
