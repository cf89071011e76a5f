"""SOAP's GPU-fast switches (structbench.optim.soap): the Cholesky-QR2 refresh's fallback count, the rotations'
matmul precision, and the staggered refresh schedule, checked by exact counts and schedules; and a 20-step trajectory of
the default against the reference's Householder QR within an a posteriori bound."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import structbench.optim.soap as soap
from structbench.optim import registry
from structbench.optim.soap import SOAP
from tests.support.newton_schulz import gamma
from tests.support.steps import feed, random_grads


def _params(shapes: list[tuple[int, ...]], seed: int = 0) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]


def test_a_rank_deficient_statistic_falls_back_to_householder_and_is_counted():
    """Gradients with a zero row give L = EMA(G G^T) a zero row, so the refresh's product L Q has one: the
    Cholesky-QR2 check cannot pass (test_cholesky_qr2), and each refresh of the left side (the only one rotated)
    counts one fallback, in the matrix's qr_fallbacks and the optimizer's root_fallbacks; it is not a solver failure,
    and the basis stays orthonormal (Householder's, within 4 d u of it per test_soap's convention, d = 3)."""
    (p,) = _params([(3, 6)])
    grads = random_grads([(3, 6)], 5, seed=1)
    for (g,) in grads:
        g[1] = 0.0
    opt = SOAP([p], precondition_frequency=1, sides="left")
    feed(opt, [p], grads)  # the first step sets the basis by eigh, then 4 refreshes
    assert opt.state[p]["qr_fallbacks"] == 4 and opt.root_fallbacks == 4 and opt.solver_failures == 0
    q = opt.state[p]["q_left"].double()
    assert float((q.T @ q - torch.eye(3, dtype=torch.float64)).abs().max()) <= 2 * 4 * 3 * 2.0**-24
    householder = _params([(3, 6)])
    reference = SOAP(householder, precondition_frequency=1, sides="left", orthonormalize="householder")
    feed(reference, householder, grads)
    assert "qr_fallbacks" not in reference.state[householder[0]] and reference.root_fallbacks == 0


def test_the_run_records_the_fallbacks_through_the_registry_optimizer():
    """The hybrid optimizer's root_fallbacks (what the run records) sums its SOAP part's; the head goes to AdamW."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 3, bias=False), nn.ReLU(), nn.Linear(3, 2))
    opt = registry.make_optimizer("soap", model, precondition_frequency=1, sides="left")
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 6)).square().sum().backward()
        model[0].weight.grad[1] = 0.0
        opt.step()
    assert opt.root_fallbacks == 2  # two refreshes after the initialising step


@pytest.mark.parametrize("precision", ["tf32", "bfloat16"])
@pytest.mark.parametrize("momentum_in_eigenbasis", [False, True])
def test_the_step_rotations_and_only_they_take_the_matmul_precision(monkeypatch, precision, momentum_in_eigenbasis):
    """Per step and matrix: G and (paper momentum) m rotated in, the update rotated back, two products each, all in
    the declared precision; the refresh's power iteration and the momentum's rotation between bases stay float32."""
    calls: list[str] = []
    real = soap.matmul

    def spy(a: torch.Tensor, b: torch.Tensor, chosen: str) -> torch.Tensor:
        calls.append(chosen)
        return real(a, b, chosen)

    monkeypatch.setattr(soap, "matmul", spy)
    params = _params([(4, 5)])
    opt = SOAP(
        params, precondition_frequency=2, matmul_precision=precision, momentum_in_eigenbasis=momentum_in_eigenbasis
    )
    feed(opt, params, random_grads([(4, 5)], 3, seed=2))  # an initialising step, then 2 steps, 1 refresh
    per_step = 4 if momentum_in_eigenbasis else 6
    refresh = 4 if momentum_in_eigenbasis else 0
    assert calls.count(precision) == 2 * per_step and calls.count("float32") == refresh


def _refresh_log(monkeypatch: pytest.MonkeyPatch, opt: SOAP) -> list[list[dict[str, Any]]]:
    """Each step's refreshed states, in order (an empty list for a step without refresh)."""
    log: list[list[dict[str, Any]]] = []
    real = SOAP._refresh_basis

    def spy(self: SOAP, group: dict[str, Any], states: list[dict[str, Any]]) -> None:
        log[-1].extend(states)
        real(self, group, states)

    monkeypatch.setattr(SOAP, "_refresh_basis", spy)
    real_step = opt.step

    def step(closure: Any = None) -> Any:
        log.append([])
        return real_step(closure)

    monkeypatch.setattr(opt, "step", step)
    return log


@pytest.mark.parametrize("batch_matrices", ["on", "off"])
@pytest.mark.parametrize("basis_from_current_grad", [False, True])
def test_staggered_refresh_gives_each_matrix_its_own_phase_and_keeps_every_f_steps(
    monkeypatch, batch_matrices, basis_from_current_grad
):
    """f = 3, five (6, 6) and two (4, 8) matrices: phases are the positions among same-shape matrices mod f
    (0, 1, 2, 0, 1 and 0, 1), a matrix refreshes exactly at the steps t with t mod 3 == its phase (t >= 1, or t > 1
    when t = 1 sets the basis), so every 3 steps, and no step refreshes more than ceil(5 / 3) + 1 of them. Without
    the switch every matrix refreshes at t mod 3 == 0, the reference's schedule, and no phase is stored."""
    shapes = [(6, 6)] * 5 + [(4, 8)] * 2
    grads = random_grads(shapes, 13, seed=3)
    expected_phases = [0, 1, 2, 0, 1, 0, 1]
    for staggered in (True, False):
        params = _params(shapes)
        opt = SOAP(
            params,
            precondition_frequency=3,
            staggered_refresh=staggered,
            batch_matrices=batch_matrices,
            basis_from_current_grad=basis_from_current_grad,
        )
        log = _refresh_log(monkeypatch, opt)
        feed(opt, params, grads)
        shift = 1 if basis_from_current_grad else 0  # call k is step t = k + shift (the reference's call 0: t = 0)
        for index, p in enumerate(params):
            state = opt.state[p]
            phase = expected_phases[index] if staggered else 0
            assert state.get("refresh_phase", 0) == phase and (("refresh_phase" in state) == staggered)
            steps = [call + shift for call, refreshed in enumerate(log) if any(s is state for s in refreshed)]
            possible = range(1 + shift, len(grads) + shift)
            assert steps == [t for t in possible if t % 3 == phase], (index, steps)
        if staggered:
            assert max(len(refreshed) for refreshed in log) <= 3


def test_staggered_with_frequency_one_is_bit_identical_to_the_reference_schedule():
    """With f = 1 every phase is 0: the staggered run makes the same operations as the reference's."""
    shapes = [(5, 5), (5, 5), (3, 7)]
    grads = random_grads(shapes, 6, seed=4)
    runs = []
    for staggered in (False, True):
        params = _params(shapes)
        feed(SOAP(params, precondition_frequency=1, staggered_refresh=staggered), params, grads)
        runs.append(params)
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


U32 = 2.0**-24


def _sign_aligned_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """min over column signs S of ||A - B S||_F (float64): the update is the same for either sign of a column."""
    signs = torch.where((a * b).sum(dim=0) < 0, -1.0, 1.0).to(torch.float64)
    return float(torch.linalg.matrix_norm(a - b * signs))


def _adam_snapshots(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[dict[str, torch.Tensor | float]]]:
    """Per optimizer (by id), after each matrix's Adam step: its bases, moments (as the step used them, before the
    refresh that may follow), bias-corrected step size and new parameter, in float64."""
    log: dict[int, list[dict[str, torch.Tensor | float]]] = {}
    real = SOAP._adam_step

    def spy(self: SOAP, group: dict[str, Any], params: list[torch.Tensor], states: list[dict[str, Any]], grads):
        real(self, group, params, states, grads)
        for p, state in zip(params, states, strict=True):
            t, beta1, beta2 = state["step"], group["beta1"], group["beta2"]
            snapshot = {key: state[key].double() for key in ("q_left", "q_right", "exp_avg", "exp_avg_sq")}
            snapshot["step_size"] = group["lr"] * (1 - beta2**t) ** 0.5 / (1 - beta1**t)
            snapshot["param"] = p.detach().double()
            log.setdefault(id(self), []).append(snapshot)

    monkeypatch.setattr(SOAP, "_adam_step", spy)
    return log


def _step_difference_bound(a: dict[str, Any], b: dict[str, Any], eps: float) -> float:
    """A bound on ||W_A - W_B||_F added by one step, given both runs' states as the step used them (module of the
    (the derivation is in the docstring of the trajectory test below)."""
    q_left, q_right, m = b["q_left"], b["q_right"], b["exp_avg"]
    assert torch.equal(a["exp_avg"], m)  # the same gradients, the same operations: the first moments agree bitwise
    delta = _sign_aligned_distance(a["q_left"], q_left) + _sign_aligned_distance(a["q_right"], q_right)
    assert delta <= 1e-3  # the same basis: a column of another sign or order would give sqrt(2) or more
    d_a, d_b = a["exp_avg_sq"].sqrt() + eps, b["exp_avg_sq"].sqrt() + eps
    rotated_m = q_left.T @ m @ q_right
    n = rotated_m / d_b
    inverse_d = float((1 / torch.minimum(d_a, d_b)).max())
    k = max(m.shape)
    m_norm, n_norm = float(torch.linalg.matrix_norm(m)), float(torch.linalg.matrix_norm(n))
    basis_term = 2 * delta * n_norm + 2 * delta * m_norm * inverse_d
    v_term = float(torch.linalg.matrix_norm(rotated_m.abs() * (d_a - d_b).abs() / (d_a * d_b)))
    rounding = 2 * (2 * gamma(k) * k * n_norm + 2 * gamma(k) * k * m_norm * inverse_d + 3 * U32 * n_norm)
    parameters = U32 * float(torch.linalg.matrix_norm(a["param"]) + torch.linalg.matrix_norm(b["param"]))
    return b["step_size"] * (basis_term + v_term + rounding) + parameters


def test_a_20_step_trajectory_stays_within_the_a_posteriori_bound_of_the_householder_run(monkeypatch):
    """SOAP's default (cholesky-qr2, float32) against the reference's Householder QR, 20 steps after the initialising
    one, refreshes every 3 steps, a fixed gradient stream (so the statistics and first moments agree bitwise and only
    the bases, and through them exp_avg_sq, differ), weight decay 0, both sides rotated.

    Bound, per step and matrix, on the update's difference (u = Q_L N Q_R^T, N = m' / d, m' = Q_L^T m Q_R,
    d = sqrt(v) + eps): with delta = the two bases' distance modulo column signs (summed over the sides, measured),
    ||Delta m'||_F <= 2 delta ||m||_F and the two outer rotations add 2 delta ||N||_F (first order in delta, about
    1e-6 here), exp_avg_sq's difference enters exactly as m' (d_B - d_A) / (d_A d_B) (measured d's); each run's own
    float32 rounding of its update adds 2 gamma_k k (||N||_F + ||m||_F / min d) for the four rotations of inner
    dimension <= k (|Q_L| |X| |Q_R| <= k ||X||_F in the Frobenius norm) and 3 u ||N||_F for the sqrt, + eps and
    division; times the step size, plus u ||W||_F per run for W - s u's rounding. Summed over the steps it bounds
    ||W_A - W_B||_F. Measured (a posteriori, from both runs' states): the bases' distance and exp_avg_sq; derived:
    how they reach the parameters. A wrong basis (a column of another sign or order, no refresh) fails the check
    delta <= 1e-3 before the sum."""
    shapes = [(6, 8), (8, 5)]
    grads = random_grads(shapes, 21, seed=7)
    log = _adam_snapshots(monkeypatch)
    runs = {}
    for method in ("cholesky-qr2", "householder"):
        params = _params(shapes, seed=8)
        opt = SOAP(params, lr=1e-2, precondition_frequency=3, weight_decay=0.0, orthonormalize=method)
        feed(opt, params, grads)
        runs[method] = (params, log[id(opt)])
    (ours, our_log), (reference, reference_log) = runs["cholesky-qr2"], runs["householder"]
    assert len(our_log) == len(reference_log) == 20 * len(shapes)
    eps = 1e-8
    for index, (p, q) in enumerate(zip(ours, reference, strict=True)):
        steps = zip(our_log[index :: len(shapes)], reference_log[index :: len(shapes)], strict=True)
        bound = sum(_step_difference_bound(a, b, eps) for a, b in steps)
        assert float(torch.linalg.matrix_norm(p.detach().double() - q.detach().double())) <= bound
