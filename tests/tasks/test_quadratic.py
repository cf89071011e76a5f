"""The quadratic problems against hand-derived facts: gradients, optima, spectra, noise statistics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from structbench.tasks import TaskContext, get_task
from structbench.tasks.spectra import eigenvalues, random_spd

CTX = TaskContext(seed=7, device=torch.device("cpu"), data_root=Path("."), batch_size=32)


def build(**args):
    definition = get_task("quadratic")
    return definition.build({**definition.defaults, **args}, CTX)


@pytest.mark.parametrize("spectrum", ["geometric", "linear", "power"])
def test_spd_matrices_have_the_requested_condition_number(spectrum):
    a = random_spd(20, 250.0, spectrum, torch.Generator().manual_seed(0))
    evals = torch.linalg.eigvalsh(a)
    assert torch.allclose(a, a.T)
    assert float(evals.max() / evals.min()) == pytest.approx(250.0, rel=1e-9)
    assert torch.allclose(evals.flip(0), eigenvalues(20, 250.0, spectrum), atol=1e-12)


def test_kronecker_gradient_is_a_diff_b_and_optimum_is_zero():
    task = build(problem="kronecker", m=6, n=4)
    w = task.model.weight
    task.train_loss(0).backward()
    expected = task.left @ (w.detach().double() - task.optimum) @ task.right
    assert torch.allclose(w.grad.double(), expected, rtol=1e-4, atol=1e-5)
    assert task.suboptimality(task.optimum) == 0.0
    # f is 1/2 vec(D)^T (B kron A) vec(D) with column-major vec.
    d = w.detach().double() - task.optimum
    vec = d.T.reshape(-1)
    assert task.suboptimality(w) == pytest.approx(0.5 * float(vec @ torch.kron(task.right, task.left) @ vec))
    assert task.evaluate().metric == pytest.approx(1.0)


def test_block_diagonal_hessian_has_a_block_per_column_and_is_not_kronecker():
    task = build(problem="block-diagonal", m=5, n=3)
    w = task.model.weight.detach().double()
    hessian = torch.autograd.functional.hessian(
        lambda x: 0.5 * ((x - task.optimum) * torch.einsum("jab,bj->aj", task.blocks, x - task.optimum)).sum(), w
    ).reshape(15, 15)
    column_major = torch.arange(15).reshape(5, 3).T.reshape(-1)
    h = hessian[column_major][:, column_major]
    assert torch.allclose(h, torch.block_diag(*task.blocks), atol=1e-10)
    spectra = torch.stack([torch.linalg.eigvalsh(b) for b in task.blocks])
    # Each block has cond_left = 100; column scales span cond_right = 10, so the whole Hessian spans 1000.
    assert torch.allclose(spectra.max(1).values / spectra.min(1).values, torch.full((3,), 100.0, dtype=spectra.dtype))
    assert float(spectra.max() / spectra.min()) == pytest.approx(1000.0, rel=1e-9)
    # Each block has its own eigenvectors, so the Hessian is not B kron A for any A, B.
    top = [torch.linalg.eigh(b).eigenvectors[:, -1].abs() for b in task.blocks]
    assert not torch.allclose(top[0], top[1], atol=1e-3)


def test_exact_newton_step_solves_the_kronecker_problem():
    task = build(problem="kronecker", m=6, n=4)
    w = task.model.weight.detach().double()
    grad = task.left @ (w - task.optimum) @ task.right
    newton = w - torch.linalg.solve(task.left, grad) @ torch.linalg.inv(task.right)
    assert task.suboptimality(newton) == pytest.approx(0.0, abs=1e-18)


@pytest.mark.parametrize("rank", [0, 2])
def test_gradient_noise_has_the_requested_rank_and_energy(rank):
    m, n, scale = 8, 6, 0.5
    task = build(problem="kronecker", m=m, n=n, noise_scale=scale, noise_rank=rank)
    noises = torch.stack([task._noise(m, n).double() for _ in range(4000)])
    assert float(noises.mean(0).abs().max()) < 0.05
    energy = float((noises**2).sum((1, 2)).mean())
    assert energy == pytest.approx(scale**2 * m * n, rel=0.05)
    ranks = {int(torch.linalg.matrix_rank(nz, rtol=1e-5)) for nz in noises[:20]}  # noise is float32
    assert ranks == {rank if rank else min(m, n)}


def test_linear_regression_population_loss_is_suboptimality_plus_noise_floor():
    m, n, noise = 5, 3, 0.3
    task = build(problem="linear-regression", m=m, n=n, noise_scale=noise)
    task.batch_size = 20000
    with torch.no_grad():
        minibatch = float(task.train_loss(0))
    # E[loss] = f(W) - f* + 1/2 noise^2 tr(Sigma_y B) with Sigma_y = B^{-1}: the floor is noise^2 n / 2.
    expected = task.suboptimality(task.model.weight) + 0.5 * noise**2 * n
    assert minibatch == pytest.approx(expected, rel=0.03)


def test_problems_are_reproducible_from_the_seed():
    a, b = build(problem="block-diagonal"), build(problem="block-diagonal")
    assert torch.equal(a.model.weight, b.model.weight) and torch.equal(a.blocks, b.blocks)
