"""AdaGrad-Norm: SGD with one scalar step size lr / b_t, b_t^2 = b_0^2 + the sum of squared gradient norms.

Paper: R. Ward, X. Wu, L. Bottou, "AdaGrad stepsizes: Sharp convergence over nonconvex landscapes", JMLR 21
(2020) (arXiv 1806.01811), Algorithm 1 (AdaGrad-Norm); also Streeter & McMahan (2010). With x the vector of
all parameters of a param group and G_t its stochastic gradient:

    b_t^2 = b_{t-1}^2 + ||G_t||^2          (b_0 > 0)
    x_{t+1} = x_t - (lr / b_t) G_t

One scalar for the whole group, not one per coordinate (AdaGrad) or per tensor. It is the theory baseline
ASGO is compared against (ASGO paper, Sec. 4 and App. B (i)). Each parameter keeps its own float32 running
sum of ||g||^2 (`sum_sq`); b_t^2 is b_0^2 plus the sum of those over the group, which equals the algorithm's
b_t^2 (a parameter without a gradient at a step contributes nothing to that step's norm and is not moved).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from structbench.optim.base import StructuredOptimizer
from structbench.optim.hparams import Declaration, decade_around, ours, real
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register


class AdaGradNorm(StructuredOptimizer):
    """AdaGrad-Norm (Ward, Wu & Bottou 2020, Algorithm 1) over every parameter of each param group.

    The paper fixes no values (its theory holds for any lr > 0 and b0 > 0), so both defaults are structbench's.
    """

    hparams = Declaration(
        real("lr", 1.0, ours("the paper fixes none; tune it per task"), "(0, inf)", decade_around()),
        real("b0", 1e-8, ours("a guard against division by zero; Algorithm 1 needs b0 > 0"), "(0, inf)"),
    )

    def step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if params:
            self._step_matrices(group, params)

    def _step_matrices(self, group: Mapping[str, Any], params: list[Tensor]) -> None:
        for p in params:
            state = self.state[p]
            if not state:
                state["sum_sq"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["sum_sq"].add_(torch.linalg.vector_norm(p.grad.float()).square())
        device = params[0].device
        b_sq = torch.full((), group["b0"] ** 2, dtype=torch.float32, device=device)  # a fill: no host-to-device copy
        for p in group["params"]:
            if p in self.state:
                b_sq = b_sq + self.state[p]["sum_sq"].to(device)
        step_size = group["lr"] * b_sq.rsqrt()
        for p in params:
            p.addcmul_(p.grad, step_size.to(p.device, p.dtype), value=-1.0)


def _route(model: torch.nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    return Routing(structured=tuple(name for name, _ in named), fallback=())


def _build(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return AdaGradNorm([p for _, p in named], **AdaGradNorm.hparams.take(hp))


def _state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """One float32 running sum of squared gradient norms per parameter tensor."""
    return 4 * len(structured)


ADAGRAD_NORM = register(
    OptimizerEntry(
        name="adagrad-norm",
        summary="AdaGrad-Norm: one scalar step size lr / sqrt(b0^2 + sum of squared gradient norms)",
        reference=(
            "Ward, Wu & Bottou 2020, 'AdaGrad stepsizes: Sharp convergence over nonconvex landscapes', JMLR 21, "
            "Algorithm 1; Streeter & McMahan 2010"
        ),
        hparams=AdaGradNorm.hparams,
        build=_build,
        route=_route,
        notes="Owns every parameter (one scalar per param group: the whole model).",
        state_bytes=_state_bytes,
    )
)
