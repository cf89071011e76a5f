"""A first-order rounding bound for Newton–Schulz iterations (structbench.optim.linalg), shared by the tests of the
iterations themselves and of the optimizers that run them."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

U32 = 2.0**-24


def gamma(k: int, u: float = U32) -> float:
    """gamma_k = k u / (1 - k u): the relative error bound of a k-term sum or product chain."""
    return k * u / (1 - k * u)


def ns_bound(
    singular: Iterable[float],
    rows: int,
    cols: int,
    coefficients: tuple[float, float, float],
    steps: int,
    input_error: float,
    u: float = U32,
) -> float:
    """First-order Frobenius bound on ||NS_fl(X0 + E) - NS(X0)|| for `steps` Newton–Schulz steps in precision u, X0
    with singular values `singular`, ||E||_F <= `input_error`. NS maps X = U S V^T to U f(S) V^T, f(x) = a x + b x^3
    + c x^5 per step, so the derivative of the k remaining steps F = f o ... o f at X is diagonal in that basis: its
    norm is the largest of F'(s_i), (F(s_i) -+ F(s_j)) / (s_i -+ s_j) and F(s_i) / s_i (Lewis–Sendov, for functions
    of singular values). A step's rounding, from gamma_k |A| |B| per product (C-S: || |A| |B| ||_F <= ||A||_F ||B||_F):
    the Gram matrix (inner size n) gamma_n ||X||_F^2, carried by B = b A + c A^2 with gain |b| + 2 |c| ||A||_2; B (one
    fused product of inner size r and a scaled add, or b A alone when c = 0) and X = a X + B X (the same) add
    gamma_{r+2} (|b| ||A||_F + |c| ||A||_F^2) ||X||_2 and gamma_{r+2} (|a| + ||B||_F) ||X||_F."""
    a, b, c = coefficients
    r, n = min(rows, cols), max(rows, cols)

    def image(x: float, k: int) -> tuple[float, float]:
        slope = 1.0
        for _ in range(k):
            slope, x = slope * (a + 3 * b * x**2 + 5 * c * x**4), a * x + b * x**3 + c * x**5
        return x, slope

    def gain(s: list[float], k: int) -> float:
        mapped = [image(x, k) for x in s]
        worst = max(max(abs(slope), abs(fx / x)) for x, (fx, slope) in zip(s, mapped, strict=True))
        for i, (x, (fx, _)) in enumerate(zip(s, mapped, strict=True)):
            for y, (fy, _) in zip(s[i + 1 :], mapped[i + 1 :], strict=True):
                worst = max(worst, abs((fx + fy) / (x + y)), abs((fx - fy) / (x - y)) if x != y else 0.0)
        return worst

    trajectory = [[float(x) for x in singular]]
    for _ in range(steps):
        trajectory.append([image(x, 1)[0] for x in trajectory[-1]])
    total = gain(trajectory[0], steps) * input_error
    for k in range(steps):
        s = trajectory[k]
        fro2, fro4, top = sum(x**2 for x in s), sum(x**4 for x in s), max(s)
        poly = math.sqrt(sum((b * x**2 + c * x**4) ** 2 for x in s))
        gram = gamma(n, u) * fro2 * (abs(b) + 2 * abs(c) * top**2) * top
        polynomial = (gamma(r + 2, u) if c else u) * (abs(b) * math.sqrt(fro4) + abs(c) * fro4) * top
        update = gamma(r + 2, u) * (abs(a) + poly) * math.sqrt(fro2)
        total += gain(trajectory[k + 1], steps - k - 1) * (gram + polynomial + update)
    return total


def root_residual_less_rounding(x: torch.Tensor, z: torch.Tensor) -> float:
    """||Z X Z - I||_F / sqrt(d) of a float64 factor X and root Z, less what a solver's float32 residual of the same
    pair may miss, gamma_2d || |Z| |X| |Z| ||_F / sqrt(d): at most the solver's tol for a root that passed its check."""
    d = x.size(0)
    residual = float(torch.linalg.matrix_norm(z @ x @ z - torch.eye(d, dtype=torch.float64))) / d**0.5
    magnitude = float(torch.linalg.matrix_norm(z.abs() @ x.abs() @ z.abs())) / d**0.5
    return residual - gamma(2 * d) * magnitude


def worst_fismo_root_residual(optimizer: torch.optim.Optimizer) -> float:
    """The largest `root_residual_less_rounding` over a FISMO optimizer's stored factors and roots (P with its root,
    Q with its): with the default deferred check, the roots its last step used."""
    return max(
        root_residual_less_rounding(state[factor].to(torch.float64), state[root].to(torch.float64))
        for state in optimizer.state.values()
        for factor, root in (("P", "P_inv_root"), ("Q", "Q_inv_root"))
    )
