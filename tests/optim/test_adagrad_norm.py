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
    for _ in range(3):
        g_a, g_b = torch.randn(3, 4, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)
        a.grad, b.grad = g_a.clone(), g_b.clone()
        optimizer.step()
        b_sq += float(g_a.square().sum() + g_b.square().sum())
        x_a, x_b = x_a - lr / math.sqrt(b_sq) * g_a, x_b - lr / math.sqrt(b_sq) * g_b
        torch.testing.assert_close(a.detach(), x_a, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(b.detach(), x_b, rtol=1e-6, atol=1e-7)


def test_parameters_without_gradients_keep_their_share_of_b_and_do_not_move():
    a, b = nn.Parameter(torch.zeros(2, dtype=F64)), nn.Parameter(torch.zeros(2, dtype=F64))
    optimizer = AdaGradNorm([a, b], lr=1.0, b0=1.0)
    a.grad, b.grad = torch.tensor([3.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0], dtype=F64)
    optimizer.step()  # b^2 = 1 + 9 + 16 = 26
    a.grad, b.grad = torch.tensor([1.0, 0.0], dtype=F64), None
    optimizer.step()  # b^2 = 27; b does not move
    torch.testing.assert_close(a.detach(), torch.tensor([-3 / math.sqrt(26) - 1 / math.sqrt(27), 0.0], dtype=F64))
    torch.testing.assert_close(b.detach(), torch.tensor([0.0, -4 / math.sqrt(26)], dtype=F64))


def test_registry_entry_owns_everything_and_state_is_one_float_per_tensor():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    optimizer, routing = registry.build_with_routing("adagrad-norm", model, {})
    assert routing.fallback == () and len(routing.structured) == 4
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    assert measure.state_bytes(optimizer) == 4 * 4
