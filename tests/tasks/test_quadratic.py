"""The quadratic problems against hand-derived facts: gradients, optima, spectra, noise statistics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from structbench.tasks import TaskContext, get_task
from structbench.tasks.spectra import eigenvalues, random_spd

CTX = TaskContext(seed=7, device=torch.device("cpu"), data_root=Path("."), batch_size=32)
U64, U32 = 2.0**-53, 2.0**-24  # float64 and float32 unit roundoff


def gamma(n: int, u: float = U64) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of an n-term sum or dot product."""
    return n * u / (1 - n * u)


def eigenvalue_error(size: int, roundings: int = 0) -> tuple[float, float]:
    """(delta_abs, delta_rel): float64 eigvalsh of random_spd(size, ...) (times a scale: `roundings` = 1) has
    |computed - lambda_i| <= delta_abs lambda_max + delta_rel lambda_i. Q D Q^T is rounded entrywise by at most
    gamma_{size+1} (|Q| D |Q|^T)_ij (one product, a size-term dot product), and u |A_ij| per scaling: in 2-norm
    <= (size gamma_{size+1} + roundings size u) lambda_max (||Q||_F^2 = size); eigvalsh is backward stable with
    ||E|| <= size u ||A|| (Weyl); Householder QR's Q is orthogonal to within size^2 u, a relative perturbation of
    every eigenvalue (Ostrowski)."""
    return size * gamma(size + 1) + (1 + roundings) * size * U64, size**2 * U64


def ratio_error(size: int, cond: float, roundings: int = 0) -> float:
    """Relative error bound of lambda_max / lambda_min (eigenvalue_error at both ends, lambda_min = lambda_max / cond),
    plus the division and 32 u for the reference endpoints (logspace or pow of rounded logarithms)."""
    delta_abs, delta_rel = eigenvalue_error(size, roundings)
    return delta_abs * (1 + cond) + 2 * delta_rel + 33 * U64


def build(**args):
    definition = get_task("quadratic")
    return definition.build({**definition.defaults, **args}, CTX)


@pytest.mark.parametrize("spectrum", ["geometric", "linear", "power"])
def test_spd_matrices_have_the_requested_condition_number(spectrum):
    a = random_spd(20, 250.0, spectrum, torch.Generator().manual_seed(0))
    evals = torch.linalg.eigvalsh(a)
    # a_ij and a_ji are the same dot product with the factors of each term swapped: each is within gamma_21 of the
    # exact (symmetric) value, |Q| D |Q|^T <= lambda_max = 1 entrywise (unit rows of Q, to n^2 u). A product
    # without the transpose or with a second independent Q is asymmetric by O(1).
    assert torch.allclose(a, a.T, rtol=0, atol=2 * gamma(20 + 2))
    # eigenvalue_error: the ratio is good to ~1.2e-11 (cond 250 amplifies the absolute error of lambda_min);
    # a wrong endpoint of the spectrum (1/cond missed by one step of the grid) is off by > 1e-2.
    assert float(evals.max() / evals.min()) == pytest.approx(250.0, rel=ratio_error(20, 250.0))
    delta_abs, delta_rel = eigenvalue_error(20)  # lambda_i <= lambda_max = 1
    assert torch.allclose(evals.flip(0), eigenvalues(20, 250.0, spectrum), rtol=0, atol=delta_abs + delta_rel)


def test_kronecker_gradient_is_a_diff_b_and_optimum_is_zero():
    task = build(problem="kronecker", m=6, n=4)
    w = task.model.weight
    task.train_loss(0).backward()
    diff = w.detach().double() - task.optimum
    expected = task.left @ diff @ task.right
    # Float32 autograd: grad = 1/2 fl(A D B) + A^T (1/2 D B^T), each product two dot products of m and n terms
    # (gamma_{m+n}), A, B and W* rounded to float32 and D = W - W* rounded (|dD| <= u (|W*| + |D|)), the halves
    # added once: |error| <= gamma_{m+n+5} |A| (|D| + |W*|) |B| (u = 2^-24; the float64 reference: gamma_{m+n}
    # with 2^-53). A missing 1/2, a missing factor or noise added at noise_scale 0 is off by O(|grad|).
    magnitude = task.left.abs() @ (diff.abs() + task.optimum.abs()) @ task.right.abs()
    bound = (gamma(6 + 4 + 5, U32) + gamma(6 + 4)) * magnitude
    error = (w.grad.double() - expected).abs()
    assert bool((error <= bound).all()), f"max error / bound {float((error / bound).max()):.3g}"
    assert task.suboptimality(task.optimum) == 0.0  # D = 0 exactly
    # f is 1/2 vec(D)^T (B kron A) vec(D) with column-major vec.
    d = w.detach().double() - task.optimum
    vec = d.T.reshape(-1)
    hessian = torch.kron(task.right, task.left)
    # Both sides are float64 forms in the same D: the task's two products and an mn-term sum (gamma_{m+n+mn+1}),
    # the Kronecker entries, a matrix-vector and a dot product of mn terms here (gamma_{2mn+1}), each relative to
    # 1/2 |vec|^T |B kron A| |vec|. A row-major vec (A kron B) or a missing 1/2 is off by O(1).
    magnitude = 0.5 * float(vec.abs() @ hessian.abs() @ vec.abs())
    value = 0.5 * float(vec @ hessian @ vec)
    tolerance = (gamma(6 + 4 + 24 + 1) + gamma(2 * 24 + 1)) * magnitude
    assert task.suboptimality(w) == pytest.approx(value, rel=0, abs=tolerance)
    assert task.evaluate().metric == 1.0  # f(W_0) / f(W_0): the same float64 computation on the unchanged weight


def test_block_diagonal_hessian_has_a_block_per_column_and_is_not_kronecker():
    task = build(problem="block-diagonal", m=5, n=3)
    w = task.model.weight.detach().double()
    hessian = torch.autograd.functional.hessian(
        lambda x: 0.5 * ((x - task.optimum) * torch.einsum("jab,bj->aj", task.blocks, x - task.optimum)).sum(), w
    ).reshape(15, 15)
    column_major = torch.arange(15).reshape(5, 3).T.reshape(-1)
    h = hessian[column_major][:, column_major]
    # Autograd differentiates both factors: h = fl(1/2 H_ab + 1/2 H_ba) (the one-hot directions multiply and add
    # exactly). H_j = fl(fl(Q D Q^T) s_j) is symmetric to within 2 gamma_{m+2} s_j (see the test above), so
    # |h - H| <= gamma_{m+2} s_j + u |H_ab| <= gamma_{m+3}, lambda_max = s_0 = 1. A Kronecker Hessian, a block of
    # another column or a transposed einsum is off by O(0.1).
    assert torch.allclose(h, torch.block_diag(*task.blocks), rtol=0, atol=gamma(5 + 3))
    spectra = torch.stack([torch.linalg.eigvalsh(b) for b in task.blocks])
    # Each block has cond_left = 100; column scales span cond_right = 10, so the whole Hessian spans 1000.
    # ratio_error with the scaling's rounding: ~5e-13 relative per block. The whole Hessian's ends lie in two
    # blocks, each end good to its block's bound, and the column scales' logspace endpoint adds a few u: at most
    # twice the per-block bound. A wrong column scale or block condition number is off by O(1).
    ratio_tolerance = ratio_error(5, 100.0, roundings=1)
    ratios = spectra.max(1).values / spectra.min(1).values
    assert torch.allclose(ratios, torch.full((3,), 100.0, dtype=spectra.dtype), rtol=ratio_tolerance, atol=0)
    assert float(spectra.max() / spectra.min()) == pytest.approx(1000.0, rel=2 * ratio_tolerance)
    # Each block has its own eigenvectors, so the Hessian is not B kron A for any A, B. Blocks sharing Q (the bug)
    # give top eigenvectors equal to within the eigh error ~ m u / gap ~ 1e-14, below this 1e-3 separation
    # threshold; independent Haar vectors in R^5 differ by O(0.1) (0.54 here).
    top = [torch.linalg.eigh(b).eigenvectors[:, -1].abs() for b in task.blocks]
    assert not torch.allclose(top[0], top[1], rtol=0, atol=1e-3)


def test_exact_newton_step_solves_the_kronecker_problem():
    task = build(problem="kronecker", m=6, n=4)
    w = task.model.weight.detach().double()
    grad = task.left @ (w - task.optimum) @ task.right
    newton = w - torch.linalg.solve(task.left, grad) @ torch.linalg.inv(task.right)
    # e = newton - W* is float64 rounding, amplified by cond_A, cond_B (lambda_max = 1, ||A||_F <= sqrt(m)):
    # the gradient's gamma_{m+n} |A||D||B| (Frobenius <= gamma_{m+n} sqrt(mn) ||D||) through A^-1 and B^-1, the
    # solve and the inverse backward stable with a generous k^2 u, the product gamma_n sqrt(n) cond_B ||D||, the
    # subtraction u (||W|| + ||D||). f(newton) = 1/2 vec(e)^T (B kron A) vec(e) <= 1/2 ||e||_F^2 (~1e-21 here);
    # a wrong step (a transposed or missing factor, W* off) leaves f ~ f(W) ~ 1.
    m, n, d_norm = 6, 4, float((w - task.optimum).norm())
    cond_a, cond_b = float(torch.linalg.cond(task.left)), float(torch.linalg.cond(task.right))
    e_norm = d_norm * (
        cond_a * cond_b * (gamma(m + n) * math.sqrt(m * n) + m**2 * U64)
        + cond_b**2 * n**2 * U64
        + gamma(n) * math.sqrt(n) * cond_b
    ) + U64 * (float(w.norm()) + d_norm)
    assert task.suboptimality(newton) == pytest.approx(0.0, abs=0.5 * e_norm**2 * (1 + gamma(m * n + m + n + 1)))


@pytest.mark.parametrize("rank", [0, 2])
def test_gradient_noise_has_the_requested_rank_and_energy(rank):
    m, n, scale = 8, 6, 0.5
    task = build(problem="kronecker", m=m, n=n, noise_scale=scale, noise_rank=rank)
    samples = 4000
    noises = torch.stack([task._noise(m, n).double() for _ in range(samples)])
    # Statistical thresholds at 5 standard deviations (the draws are seeded float64, so fixed on every machine).
    # Entry ij has variance scale^2 (full rank) or scale^2 mn / r^2 ||P_i||^2 ||Q_j||^2 (rank r): its mean over
    # the samples is within 5 sd (a union bound over the 48 entries: p < 3e-5); uniform noise (mean scale/2) fails.
    if rank:
        rows, cols = task.noise_left.pow(2).sum(1), task.noise_right.pow(2).sum(1)
        variance = scale**2 * m * n / rank**2 * torch.outer(rows, cols)
    else:
        variance = torch.full((m, n), scale**2, dtype=torch.float64)
    assert bool((noises.mean(0).abs() <= 5 * (variance / samples).sqrt()).all())
    # ||N||_F^2 / scale^2 is chi-square with mn (full rank) or r^2 (rank r: ||Z||_F^2) degrees of freedom times
    # E / dof: relative sd sqrt(2 / dof / samples), 5 sd. A missing sqrt(mn) / r factor is off by >= 2x.
    dof = rank**2 if rank else m * n
    energy = float((noises**2).sum((1, 2)).mean())
    assert energy == pytest.approx(scale**2 * m * n, rel=5 * math.sqrt(2 / dof / samples))
    # The exactly rank-r float64 noise rounded to float32: |E| <= u |N|, so ||E||_2 <= u ||N||_F <= u sqrt(min(m, n))
    # sigma_1 (u = 2^-24), plus the float64 product and SVD (min(m, n) 2^-52 sigma_1): the zero singular values stay
    # below that threshold, the rank-r ones (the smallest of these 20 is 1e-2 sigma_1) above it.
    threshold = U32 * math.sqrt(min(m, n)) + 2 * min(m, n) * U64
    ranks = {int(torch.linalg.matrix_rank(nz, rtol=threshold)) for nz in noises[:20]}
    assert ranks == {rank if rank else min(m, n)}


def test_linear_regression_population_loss_is_suboptimality_plus_noise_floor():
    m, n, noise = 5, 3, 0.3
    task = build(problem="linear-regression", m=m, n=n, noise_scale=noise)
    task.batch_size = batch = 20000
    with torch.no_grad():
        minibatch = float(task.train_loss(0))
    # E[loss] = f(W) - f* + 1/2 noise^2 tr(Sigma_y B) with Sigma_y = B^{-1}: the floor is noise^2 n / 2.
    expected = task.suboptimality(task.model.weight) + 0.5 * noise**2 * n
    # Statistical: each row's 1/2 r^T B r is 1/2 sum_k lambda_k chi^2_1, relative sd sqrt(2 sum lambda^2) / sum lambda
    # <= sqrt(2), so the batch mean's is <= sqrt(2 / batch) = 0.01; 3 sd (seeded: fixed on every machine; float32
    # rounding of the cascade-summed loss is ~1e-6 relative). A floor of noise^2 n (no 1/2) is off by 28%.
    assert minibatch == pytest.approx(expected, rel=3 * math.sqrt(2 / batch))


def test_problems_are_reproducible_from_the_seed():
    a, b = build(problem="block-diagonal"), build(problem="block-diagonal")
    assert torch.equal(a.model.weight, b.model.weight) and torch.equal(a.blocks, b.blocks)  # same seed, same ops
