"""Optimizers stepped on given gradients: seeded random gradients and a loop that feeds them."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def random_grads(shapes: list[tuple[int, ...]], steps: int, seed: int = 0) -> list[list[Tensor]]:
    """`steps` lists of standard-normal gradients, one of each shape, from one generator seeded `seed`."""
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(*s, generator=gen) for s in shapes] for _ in range(steps)]


def feed(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], grads: list[list[Tensor]]) -> None:
    """One optimizer step per entry of `grads`, each parameter's gradient a copy of its tensor in its dtype."""
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone().to(p.dtype)
        optimizer.step()


def step_change(optimizer: torch.optim.Optimizer, param: nn.Parameter, grad: Tensor) -> Tensor:
    """One step of `optimizer` with a copy of `grad` (in the parameter's dtype) as `param`'s gradient; returns the
    parameter's change."""
    before = param.detach().clone()
    param.grad = grad.clone().to(param.dtype)
    optimizer.step()
    return param.detach() - before
