"""SOAP's GPU-fast switches (structbench.optim.soap): the Cholesky-QR2 refresh's fallback count, the rotations'
matmul precision, and the staggered refresh schedule, checked by exact counts and schedules."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import structbench.optim.soap as soap
from structbench.optim import registry
from structbench.optim.soap import SOAP
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
