"""Tests for structbench.optim.adagrad_norm against Ward, Wu & Bottou (2020), Algorithm 1, written out by hand:
b_t^2 = b_0^2 + sum_{s <= t} ||G_s||^2 over ALL parameters of the group, x_{t+1} = x_t - lr G_t / b_t."""

from __future__ import annotations

import math

import torch
from torch import nn

import structbench.optim.adagrad_norm  # noqa: F401  (registers adagrad-norm)
from structbench import measure
from structbench.optim import registry
from structbench.optim.adagrad_norm import AdaGradNorm

F64 = torch.float64


def test_one_scalar_step_size_over_all_parameters():
    gen = torch.Generator().manual_seed(0)
    a, b = nn.Parameter(torch.randn(3, 4, dtype=F64)), nn.Parameter(torch.randn(5, dtype=F64))
    x_a, x_b = a.detach().clone(), b.detach().clone()
    lr, b0 = 0.7, 0.5
    optimizer = AdaGradNorm([a, b], lr=lr, b0=b0)
    b_sq = b0**2
    # The optimizer keeps b^2 in float32 whatever the parameters' dtype: each ||G||^2 from float32 entries (u),
    # a 12-term sum of squares, its sqrt and square (gamma_17), t running sums over two tensors plus b0^2
    # (gamma_(t+2)): b^2 off by rho = gamma_17 + gamma_(t+2) relative; the step lr / b by rho / 2 + 4 u (rsqrt,
    # the product with lr, the cast: 4 u). Each float64 update x - s G then moves x by |s G| (rho / 2 + 4 u) plus
    # float64 rounding (2^-52 |x|). A b summed per tensor instead of over the group, or b updated after the step,
    # moves x by >= 1e-2; the bound is ~1e-6.
    u = 2.0**-24
    bound_a, bound_b = torch.zeros(3, 4, dtype=F64), torch.zeros(5, dtype=F64)
    for t in range(1, 4):
        g_a, g_b = torch.randn(3, 4, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)
        a.grad, b.grad = g_a.clone(), g_b.clone()
        optimizer.step()
        b_sq += float(g_a.square().sum() + g_b.square().sum())
        step = lr / math.sqrt(b_sq)
        x_a, x_b = x_a - step * g_a, x_b - step * g_b
        rho = 17 * u / (1 - 17 * u) + (t + 2) * u / (1 - (t + 2) * u)
        bound_a += step * g_a.abs() * (rho / 2 + 4 * u) + 2.0**-52 * x_a.abs()
        bound_b += step * g_b.abs() * (rho / 2 + 4 * u) + 2.0**-52 * x_b.abs()
        assert bool(((a.detach() - x_a).abs() <= bound_a).all()) and bool(((b.detach() - x_b).abs() <= bound_b).all())


def test_parameters_without_gradients_keep_their_share_of_b_and_do_not_move():
    a, b = nn.Parameter(torch.zeros(2, dtype=F64)), nn.Parameter(torch.zeros(2, dtype=F64))
    optimizer = AdaGradNorm([a, b], lr=1.0, b0=1.0)
    a.grad, b.grad = torch.tensor([3.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0], dtype=F64)
    optimizer.step()  # b^2 = 1 + 9 + 16 = 26
    a.grad, b.grad = torch.tensor([1.0, 0.0], dtype=F64), None
    optimizer.step()  # b^2 = 27; b does not move
    # b^2 = 26 and 27 are exact in float32; 1 / sqrt(b) is rounded once to float32 (rsqrt, 2 u), then the float64
    # updates (2^-52 each): |error| <= 2 u sum |G / b|. 1 / sqrt(27) for a's first step (b counted without b's
    # gradient) would be off by 4e-3.
    u = 2.0**-24
    for got, expected, size in (
        (a.detach(), [-3 / math.sqrt(26) - 1 / math.sqrt(27), 0.0], 3 / math.sqrt(26) + 1 / math.sqrt(27)),
        (b.detach(), [0.0, -4 / math.sqrt(26)], 4 / math.sqrt(26)),
    ):
        torch.testing.assert_close(got, torch.tensor(expected, dtype=F64), rtol=0, atol=(2 * u + 2.0**-51) * size)


def test_registry_entry_owns_everything_and_state_is_one_float_per_tensor():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    optimizer, routing = registry.build_with_routing("adagrad-norm", model, {})
    assert routing.fallback == () and len(routing.structured) == 4
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    assert measure.state_bytes(optimizer) == 4 * 4
