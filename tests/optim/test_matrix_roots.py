"""Newton–Schulz inverse square roots (linalg.inverse_sqrt_newton_schulz) and FISMO's root_method="newton".

Facts checked: agreement with float64 eigendecomposition roots on ill-conditioned matrices (stated condition
numbers and tolerances), fewer updates from a warm start, a warm start that cannot converge reported as such,
FISMO's eigendecomposition fallback taken and counted when the residual check fails, and FISMO's Newton–Schulz
updates within a stated bound of the float64 eigendecomposition form over several steps."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from torch import nn

import structbench.optim.fismo as fismo_module
from structbench import measure
from structbench.optim import linalg, registry
from structbench.optim.cost_profile import count
from structbench.optim.deferred import DeferredCheck
from structbench.optim.fismo import Fismo
from tests.support.newton_schulz import worst_fismo_root_residual
from tests.support.store import read_runs

F64 = torch.float64


def _spd(d: int, cond: float, seed: int = 0) -> torch.Tensor:
    """Float64 SPD matrix with eigenvalues log-spaced from 1 down to 1 / cond and a random eigenbasis."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=F64))
    values = torch.logspace(0.0, -float(torch.log10(torch.tensor(cond))), d, dtype=F64)
    return (basis * values) @ basis.T


def _moved(a: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """One FISMO-like step of a factor: 0.99 A + 0.01 (a rank-d/4 statistic of A's mean eigenvalue)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(a.size(0), a.size(0) // 4, generator=gen, dtype=F64) / a.size(0) ** 0.5
    return 0.99 * a + 0.01 * float(a.diagonal().mean()) * (u @ u.T)


def _exact(a: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(a.to(F64))
    return (vectors * values.rsqrt()) @ vectors.T


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(a.to(F64) - b.to(F64)) / torch.linalg.matrix_norm(b.to(F64)))


U32 = 2.0**-24
"""float32 unit roundoff."""


def _assert_root_within_its_residual(z: torch.Tensor, a: torch.Tensor, tol: float) -> None:
    """Z against R = A^-1/2 (float64 eigh), through Z's own residual, a posteriori.

    Z = R + D gives M = Z A Z - I = R^-1 D + D R^-1 + D A D; in R's eigenbasis D_ij = (M - D A D)_ij rho_i rho_j /
    (rho_i + rho_j), and rho_i rho_j / (rho_i + rho_j) <= rho_max / 2, so ||D||_F <= (||M||_F + ||A|| ||D||_F^2)
    rho_max / 2: to first order ||Z - R||_F / ||R||_F <= ||M||_F rho_max / (2 ||R||_F) (M in float64: its rounding,
    4 d u64 || |Z| |A| |Z| ||_F, is added; the second-order term through a 1 % margin). The solver reported
    ||M||_F / sqrt(d) <= tol from its float32 M, which is off by at most gamma_2d || |Z| |A| |Z| ||_F / sqrt(d): the
    float64 residual must be within that too. A wrong root (A^-1/4, or stale) has a residual of O(1)."""
    z, a = z.to(F64), a.to(F64)
    d = a.shape[-1]
    exact = _exact(a)
    magnitude = float(torch.linalg.matrix_norm(z.abs() @ a.abs() @ z.abs()))
    residual = float(torch.linalg.matrix_norm(z @ a @ z - torch.eye(d, dtype=F64))) + 4 * d * 2.0**-53 * magnitude
    float32_residual_error = 2 * d * U32 / (1 - 2 * d * U32) * magnitude / d**0.5
    assert residual / d**0.5 <= tol + float32_residual_error
    rho_max = float(torch.linalg.eigvalsh(exact)[-1])
    bound = 1.01 * residual * rho_max / (2 * float(torch.linalg.matrix_norm(exact)))
    assert _relative(z, exact) <= bound, (_relative(z, exact), bound)


@pytest.mark.parametrize(("cond", "bound"), [(1e2, 1e-4), (1e4, 1e-3), (1e5, 5e-3)])
def test_cold_root_matches_float64_eigh_on_ill_conditioned_matrices(cond: float, bound: float) -> None:
    """d = 64 in float32 at tol 1e-4 (cond 1e2), 1e-3 (1e4), 5e-3 (1e5): residual below tol, and the root as close to
    the float64 eigh root as its residual allows (`_assert_root_within_its_residual`; observed ~1e-5 to 2e-3)."""
    a = _spd(64, cond)
    found = linalg.inverse_sqrt_newton_schulz(a.float(), tol=bound)
    assert bool(found.converged) and float(found.residual) <= bound
    _assert_root_within_its_residual(found.root, a.float(), bound)
    assert torch.equal(found.root, found.root.mT)


def test_warm_start_from_the_previous_root_takes_fewer_updates() -> None:
    """cond 10, d = 64, a one-step move of the matrix: from the previous root the residual 1e-5 takes at most half
    the cold start's updates (measured: 4 against 8), and both land within 1e-4 of the float64 root."""
    previous = _spd(64, 10.0)
    a = _moved(previous)
    cold = linalg.inverse_sqrt_newton_schulz(a.float(), tol=1e-5)
    warm = linalg.inverse_sqrt_newton_schulz(a.float(), init=_exact(previous).float(), tol=1e-5)
    assert bool(cold.converged) and bool(warm.converged)
    assert 0 < 2 * warm.iterations <= cold.iterations, (warm.iterations, cold.iterations)
    for found in (cold, warm):
        _assert_root_within_its_residual(found.root, a.float(), 1e-5)


def test_a_warm_start_that_cannot_converge_is_reported_not_converged() -> None:
    """cond 1e4: the warm iteration amplifies the error components between distant eigenvalues (factor
    |1/2 - (r + 1/r)/4| > 1 for cond > 34), so its residual stops falling above tol and it says so."""
    previous = _spd(64, 1e4)
    a = _moved(previous)
    warm = linalg.inverse_sqrt_newton_schulz(a.float(), init=_exact(previous).float(), tol=1e-4, max_iters=6)
    assert not bool(warm.converged) and float(warm.residual) > 1e-4


def test_probe_check_keeps_a_root_that_still_fits_and_iterates_one_that_does_not() -> None:
    a = torch.stack([_spd(48, 10.0, seed=2), _moved(_spd(48, 10.0, seed=2))]).float()
    roots = torch.stack([_exact(a[0]), _exact(_spd(48, 10.0, seed=2))]).float()
    found = linalg.inverse_sqrt_newton_schulz(a, init=roots, tol=1e-4, probes=64)
    assert torch.equal(found.root[0], linalg.symmetrize(roots[0]))  # kept without a d x d product
    assert found.iterations > 0 and bool(found.converged.all())
    _assert_root_within_its_residual(found.root[1], a[1], 1e-4)


def _fismo_run(steps: int, scale: float, shapes: list[tuple[int, int]], **hparams: object) -> tuple[list, Fismo]:
    """`_fismo_run_with_residuals` without the residuals."""
    updates, _, optimizer = _fismo_run_with_residuals(steps, scale, shapes, **hparams)
    return updates, optimizer


def test_fismo_falls_back_to_eigh_and_counts_it_when_the_residual_check_fails() -> None:
    """root_tol 1e-12 is below float32's reach: every root of every step falls back, giving eigh's exact steps."""
    shapes = [(12, 20), (12, 20), (20, 8)]
    eigh, _ = _fismo_run(3, 1.0, shapes, root_method="eigh")
    newton, optimizer = _fismo_run(3, 1.0, shapes, root_method="newton", root_tol=1e-12)
    assert optimizer.root_fallbacks == 2 * len(shapes) * 3
    for p in optimizer.param_groups[0]["params"]:
        assert (
            int(optimizer.state[p]["root_fallbacks"]) == 6 and optimizer.state[p]["root_fallbacks"].device.type == "cpu"
        )
    for ours, theirs in zip(newton, eigh, strict=True):
        for u, v in zip(ours, theirs, strict=True):
            assert torch.equal(u, v)


def test_fismo_newton_state_bytes_include_the_fallback_counter() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer, routing = registry.build_with_routing("fismo", model, {"root_method": "newton"})
    model(torch.randn(5, 8)).sum().backward()
    optimizer.step()
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    hp = registry.resolve_hparams("fismo", {"root_method": "newton"})
    # 16 x 8: P, Q and roots (2 * 256 + 2 * 64), M 128 floats; three int64 counters, two bools (roots_due); AdamW: 2
    # floats per element + step
    fismo_bytes = 4 * (2 * 256 + 2 * 64 + 128) + 3 * 8 + 2
    fallback = [shapes[n] for n in routing.fallback]
    adamw_bytes = sum(2 * 4 * torch.Size(s).numel() + 4 for s in fallback)
    assert measure.state_bytes(optimizer) == fismo_bytes + adamw_bytes
    assert registry.get("fismo").state_bytes([shapes[n] for n in routing.structured], fallback, hp) == (
        fismo_bytes + adamw_bytes
    )


def _fismo_run_with_residuals(
    steps: int, scale: float, shapes: list[tuple[int, int]], **hparams: object
) -> tuple[list, list[float], Fismo]:
    gen = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.randn(*s, generator=gen) * 0.02) for s in shapes]
    optimizer = Fismo(params, **hparams)
    updates, residuals = [], []
    for _ in range(steps):
        before = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * scale
        optimizer.step()
        updates.append([p.detach() - b for p, b in zip(params, before, strict=True)])
        residuals.append(worst_fismo_root_residual(optimizer))
    return updates, residuals, optimizer


@pytest.mark.parametrize("root_tol", [1e-4, None])
@pytest.mark.parametrize(
    ("scale", "check"),
    [(1.0, "deferred"), (3.0, "deferred"), (1.0, "immediate"), (3.0, "immediate"), (10.0, "immediate")],
)
def test_fismo_newton_steps_stay_within_the_bound_of_the_float64_eigh_form(
    scale: float, check: str, root_tol: float | None
) -> None:
    """Six steps on 48 x 192 and 64 x 64 with fresh N(0, scale^2) gradients (factor condition numbers up to about
    3 at scale 3 and 250 at scale 10): each step's update differs from the float64-eigh run's by under
    3 root_tol relative (a root whose residual ||Z X Z - I|| / sqrt(d) is r is about r / 2 from the exact one,
    relative, and each update takes two roots), with no fallback; at root_tol 1e-4 and at the default, 1e-3.
    With root_check="immediate" every refresh is checked at once; with the default deferred check the claim needs
    every root the step used within root_tol (their residual is asserted, a posteriori; a root kept on its probe
    estimate passes above root_tol with probability below 2e-9, linalg.inverse_sqrt_newton_schulz): at scales 1
    and 3 the factors move by about 1 % and 8 % per step and the fixed warm updates keep up (at scale 10 they do
    not: `test_a_deferred_root_check_uses_a_failed_root_for_one_step_and_repairs_it`)."""
    shapes = [(48, 192), (64, 64)]
    tolerance = {} if root_tol is None else {"root_tol": root_tol}
    tol = registry.resolve_hparams("fismo", tolerance)["root_tol"]
    reference, _ = _fismo_run(6, scale, shapes, root_method="eigh", root_dtype="float64")
    newton, residuals, optimizer = _fismo_run_with_residuals(6, scale, shapes, root_check=check, **tolerance)
    assert optimizer.root_fallbacks == 0
    if check == "deferred":
        assert max(residuals) <= tol, residuals
    for ours, theirs in zip(newton, reference, strict=True):
        for u, v in zip(ours, theirs, strict=True):
            assert _relative(u, v) < 3 * tol


def test_a_deferred_root_check_uses_a_failed_root_for_one_step_and_repairs_it() -> None:
    """The deferred check's stated price, at scale 10 (factors moving by about half per step, condition numbers
    growing to about 250, where the warm iteration stops contracting: cond > 34): a step uses a root whose residual
    is above root_tol (more than 10 root_tol here), the steps before it stay within 3 root_tol of the float64-eigh
    run, and the next step repairs it (the roots stored after that step, when the repair is done, are back within
    root_tol) and switches the stack to the host-checked refresh, whose roots stay within root_tol."""
    shapes = [(48, 192), (64, 64)]
    tol = 1e-4
    reference, _ = _fismo_run(6, 10.0, shapes, root_method="eigh", root_dtype="float64")
    newton, residuals, _ = _fismo_run_with_residuals(6, 10.0, shapes, root_tol=tol, root_check="deferred")
    late = next(step for step, residual in enumerate(residuals) if residual > tol)
    assert residuals[late] > 10 * tol
    assert all(residual <= tol for residual in residuals[late + 1 :]), residuals
    for ours, theirs in zip(newton[:late], reference[:late], strict=True):
        for u, v in zip(ours, theirs, strict=True):
            assert _relative(u, v) < 3 * tol


@pytest.mark.parametrize("root_tol", [1e-4, None])
def test_fismo_newton_on_near_singular_factors_is_no_farther_from_float64_than_float32_eigh(
    root_tol: float | None,
) -> None:
    """Scale 20: a factor reaches condition number ~5e5, float32 eigh itself drifts ~4% from float64 in six
    steps; Newton–Schulz checked at once (root_check="immediate") falls back on some roots (counted) and ends no
    farther than 1.5x float32 eigh's drift plus 3 root_tol. (Deferred, a root that failed its check is used for one
    step: the previous test.)"""
    shapes = [(48, 192), (64, 64)]
    tolerance = {} if root_tol is None else {"root_tol": root_tol}
    slack = 3 * (registry.resolve_hparams("fismo", tolerance)["root_tol"])
    reference, _ = _fismo_run(6, 20.0, shapes, root_method="eigh", root_dtype="float64")
    eigh, _ = _fismo_run(6, 20.0, shapes, root_method="eigh")
    newton, optimizer = _fismo_run(6, 20.0, shapes, root_check="immediate", **tolerance)
    assert optimizer.root_fallbacks > 0
    for step in range(6):
        for i in range(len(shapes)):
            drift = _relative(eigh[step][i], reference[step][i])
            assert _relative(newton[step][i], reference[step][i]) <= 1.5 * drift + slack


def test_a_run_records_root_method_and_the_fallbacks(cli, tmp_path) -> None:
    """Through the CLI: the run's hparams carry root_method, root_check and matmul_precision, and its root_fallbacks
    column counts the fallbacks (root_tol 1e-12 is out of float32's reach: both factors of the quadratic's matrix fall
    back at each of 5 steps; the host-checked refresh needed a cold start, so every refresh is "checked", at once)."""
    settings = ("--set", "hparams.fismo.root_method=newton", "--set", "hparams.fismo.root_tol=1e-12")
    quick = ("--suite", "quadratic", "--steps", "5", "--seed", "0", "--quiet", "--optim", "fismo")
    result = cli("run", *quick, *settings, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    (run,) = read_runs(tmp_path).itertuples()
    hparams = json.loads(run.hparams)
    assert hparams["root_method"] == "newton"
    assert (hparams["root_check"], hparams["matmul_precision"]) == ("auto", "float32")
    assert run.status == "ok" and run.root_fallbacks == 2 * 5


def _same_updates(ours: list[list[torch.Tensor]], theirs: list[list[torch.Tensor]]) -> bool:
    """Whether two runs' per-step updates are equal bit for bit."""
    steps = zip(ours, theirs, strict=True)
    return all(torch.equal(a, b) for mine, other in steps for a, b in zip(mine, other, strict=True))


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_the_default_root_check_on_the_cpu_is_the_immediate_one(scale: float) -> None:
    """root_check "auto" (the default) on CPU tensors takes the host-checked refresh at every step: six steps equal
    root_check "immediate"'s bit for bit, so no stack takes the deferred path's fixed "warm" updates (which at these
    scales give other roots, hence other updates, than the host-checked refresh: the deferred run differs)."""
    shapes = [(48, 192), (64, 64)]
    auto, _, optimizer = _fismo_run_with_residuals(6, scale, shapes)
    immediate, _, _ = _fismo_run_with_residuals(6, scale, shapes, root_check="immediate")
    deferred, _, _ = _fismo_run_with_residuals(6, scale, shapes, root_check="deferred")
    assert _same_updates(auto, immediate) and not _same_updates(auto, deferred)
    assert optimizer.param_groups[0]["root_check"] == "auto"


@pytest.mark.parametrize(("check", "device", "at_once"), [
    ("auto", "cpu", True), ("auto", "cuda", False), ("auto", "mps", False),
    ("deferred", "cpu", False), ("immediate", "cuda", True),
])  # fmt: skip
def test_auto_defers_root_checks_only_where_the_device_queues_work(check: str, device: str, at_once: bool) -> None:
    assert fismo_module._checked_at_once(check, torch.device(device)) is at_once


def test_a_warm_start_is_kept_within_tol_and_iterated_above_it() -> None:
    """Z = sqrt(1 + r) A^{-1/2} has Z A Z - I = r I: residual and probe estimate are both r. With tol 1e-3,
    r = 4e-4 (below tol / PROBE_MARGIN = 5e-4) is kept as given; r = 7e-4 (within tol, but the probes cannot tell)
    and r = 1.5e-3 (above tol, below tol * PROBE_MARGIN) are updated to the root: once the full check's Z A Z is
    paid for, one more product refreshes the root."""
    a = _spd(32, 10.0, seed=4).float().unsqueeze(0)
    exact = _exact(a[0])
    for residual, updates in ((4e-4, 0), (7e-4, None), (1.5e-3, None)):
        init = ((1.0 + residual) ** 0.5 * exact).float().unsqueeze(0)
        found = linalg.inverse_sqrt_newton_schulz(a, init=init, tol=1e-3, probes=64)
        assert bool(found.converged)
        if updates == 0:
            assert found.iterations == 0 and torch.equal(found.root, linalg.symmetrize(init))
        else:
            assert found.iterations >= 1
            _assert_root_within_its_residual(found.root[0], a[0], 1e-3)


@pytest.mark.parametrize("shape", [(6, 10), (10, 6)])
def test_fismo_step_with_kept_roots_whitens_on_both_sides(shape: tuple[int, int]) -> None:
    """gamma = 1 freezes the factors (line 4: P_t = P_{t-1} when tr P_{t-1} = m), so the probe check keeps both
    roots and the step reuses the refresh's half-whitened gradients. With anisotropic P, Q (trace m, n; condition
    numbers 10 and 20) and exact roots set as the state, the update must be P^{-1/2} U V^T Q^{-1/2}, U V^T the
    polar factor of P^{-1/2} G Q^{-1/2} (lines 6-8; momentum zero before the step, so M = (1 - beta) G~), to float32
    rounding, for a wide and a tall matrix."""
    rows, cols = shape
    p_factor = rows * _spd(rows, 10.0, seed=2) / float(torch.trace(_spd(rows, 10.0, seed=2)))
    q_factor = cols * _spd(cols, 20.0, seed=3) / float(torch.trace(_spd(cols, 20.0, seed=3)))
    param = nn.Parameter(torch.zeros(shape))
    optimizer = Fismo([param], lr=1.0, gamma=1.0, polar="svd")
    param.grad = torch.ones(shape)
    optimizer.step()
    state = optimizer.state[param]
    roots = {"P_inv_root": _exact(p_factor).float(), "Q_inv_root": _exact(q_factor).float()}
    state.update(P=p_factor.float(), Q=q_factor.float(), momentum=torch.zeros(shape), **roots)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    before = param.detach().clone()
    param.grad = grad
    optimizer.step()
    assert all(torch.equal(state[k], v) for k, v in roots.items()) and optimizer.root_fallbacks == 0
    p_root, q_root = (state[k].to(F64) for k in ("P_inv_root", "Q_inv_root"))
    x = p_root @ grad.to(F64) @ q_root
    u, sv, vh = torch.linalg.svd(x, full_matrices=False)
    expected = p_root @ (u @ vh) @ q_root
    # float32 step from the exact float32 roots: X = P^-1/2 G Q^-1/2 off by gamma_(m+n) || |P^-1/2| |G| |Q^-1/2| ||_F;
    # the float32 SVD is backward stable (k u ||X||, k = max(m, n)) and the polar factor moves by <= 2 ||dX|| /
    # s_min(X), its float32 U, V are orthonormal to k u each; P^-1/2 O Q^-1/2 adds gamma_(m+n) || |P^-1/2| |O|
    # |Q^-1/2| ||_F; the weights (lr 1, W from its first step) round by u |W| before and after. Unwhitened or
    # one-sided updates are off by >= 10 % (cond 10 and 20).
    rows, cols = shape
    k = max(rows, cols)
    gamma = (rows + cols) * U32 / (1 - (rows + cols) * U32)
    dx = gamma * float(torch.linalg.matrix_norm(p_root.abs() @ grad.to(F64).abs() @ q_root.abs()))
    dx += k * U32 * float(sv[0])
    d_polar = 2 * dx / float(sv[-1]) + 2 * k * U32 * min(rows, cols) ** 0.5
    roots_2 = float(torch.linalg.matrix_norm(p_root, ord=2) * torch.linalg.matrix_norm(q_root, ord=2))
    error = roots_2 * d_polar + gamma * float(torch.linalg.matrix_norm(p_root.abs() @ (u @ vh).abs() @ q_root.abs()))
    error += U32 * float(torch.linalg.matrix_norm(before.to(F64)) + torch.linalg.matrix_norm(param.detach().to(F64)))
    assert _relative(before - param.detach(), expected) <= error / float(torch.linalg.matrix_norm(expected))


def test_fixed_warm_updates_reach_the_root_with_no_host_read_and_no_decomposition() -> None:
    """cond 10, d = 64, a one-step move: each warm update from the previous root shrinks the residual by at least
    the linear rate's bound |1/2 - (r + 1/r)/4| <= 0.37 for r <= sqrt(10) (0.4 with the move's change of
    spectrum and the second-order terms at residuals below 1e-3), so five updates bring it under 1e-5 and the root
    within its residual of the float64 root; the counted call reads nothing on the host, decomposes nothing and
    runs 2 + 3 x 5 matrix products."""
    previous = _spd(64, 10.0)
    a = _moved(previous).float().unsqueeze(0)
    init = _exact(previous).float().unsqueeze(0)
    residuals = [float(linalg.inverse_sqrt_warm_updates(a, init, updates=k, tol=1.0).residual) for k in range(1, 6)]
    assert all(later <= 0.4 * earlier for earlier, later in itertools.pairwise(residuals)), residuals
    found = linalg.inverse_sqrt_warm_updates(a, init, updates=5, tol=1e-5)
    assert bool(found.converged) and found.iterations == 5
    _assert_root_within_its_residual(found.root[0], a[0], 1e-5)
    cost = count(lambda: linalg.inverse_sqrt_warm_updates(a, init, updates=5, tol=1e-5))
    assert cost.reads == 0 and not cost.decompositions
    assert sum(cost.flops.values()) == (2 + 3 * 5) * 2 * 64**3


def test_fixed_warm_updates_never_return_a_root_worse_than_their_start() -> None:
    """cond 1e4 moved: the warm iteration amplifies the components between distant eigenvalues, so its updates are
    refused where they raise the residual. Per matrix of the stack the returned residual is at most the start's
    (both computed here in float64, the solver's float32 residual being within gamma_2d of its own), and the
    matrix is reported not converged, for the caller's fallback."""
    previous = torch.stack([_spd(48, 1e4, seed=5), _spd(48, 10.0, seed=6)])
    a = torch.stack([_moved(m) for m in previous])
    init = torch.stack([_exact(m) for m in previous]).float()
    found = linalg.inverse_sqrt_warm_updates(a.float(), init, updates=4, tol=1e-5)
    eye = torch.eye(48, dtype=F64)
    for i in range(2):
        start = init[i].to(F64)
        start = (start + start.T) / 2
        before = float(torch.linalg.matrix_norm(start @ a[i] @ start - eye))
        z = found.root[i].to(F64)
        after = float(torch.linalg.matrix_norm(z @ a[i] @ z - eye))
        magnitude = float(torch.linalg.matrix_norm(z.abs() @ a[i].abs() @ z.abs()))
        assert after <= before + 2 * (4 * 48 * U32) * magnitude
    assert found.converged.tolist() == [False, True]


def test_a_deferred_check_is_read_once_and_counted_apart_from_host_reads() -> None:
    """post then take gives the failed indices once; the take is a deferred read in the cost profile, not a host
    read (on a GPU it waits for an event recorded a step earlier, not for the queue)."""
    check = DeferredCheck()
    assert check.take() == [] and not check.pending
    check.post(torch.tensor([False, True, False, True]))
    assert check.pending
    cost = count(lambda: check.take())
    assert cost.reads == 0 and cost.deferred_reads == 1
    check.post(torch.tensor([True, False]))
    assert check.take() == [0] and check.take() == []
