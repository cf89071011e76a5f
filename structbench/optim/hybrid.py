"""One optimizer made of a structured method and its fallback, stepped together.

`HybridOptimizer` is a `torch.optim.Optimizer` whose param groups are the very group dicts of its
parts, so learning-rate schedulers and `zero_grad` act on both; `state_dict()` nests the parts' own
state dicts and round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from structbench.optim.registry import NamedParams, Routing

FALLBACK_ADAMW_DEFAULTS: dict[str, Any] = {
    "adamw_lr": 3e-4,
    "adamw_beta1": 0.9,
    "adamw_beta2": 0.95,
    "adamw_eps": 1e-10,
    "adamw_weight_decay": 0.0,
}
"""Keller Jordan's Muon reference code's auxiliary Adam (lr 3e-4, betas (0.9, 0.95), eps 1e-10)."""


class HybridOptimizer(torch.optim.Optimizer):
    def __init__(self, parts: Mapping[str, torch.optim.Optimizer]) -> None:
        self.parts = dict(parts)
        groups = [group for part in self.parts.values() for group in part.param_groups]
        super().__init__(groups, defaults={})

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts.values():
            part.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"parts": {name: part.state_dict() for name, part in self.parts.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, part in self.parts.items():
            part.load_state_dict(state_dict["parts"][name])

    @property
    def solver_failures(self) -> int:
        return sum(int(getattr(part, "solver_failures", 0)) for part in self.parts.values())


def fallback_adamw(params: list[torch.nn.Parameter], hp: Mapping[str, Any]) -> torch.optim.AdamW:
    """`torch.optim.AdamW` from the `adamw_*` hyperparameters of a hybrid entry."""
    return torch.optim.AdamW(
        params,
        lr=hp["adamw_lr"],
        betas=(hp["adamw_beta1"], hp["adamw_beta2"]),
        eps=hp["adamw_eps"],
        weight_decay=hp["adamw_weight_decay"],
    )


def build_hybrid(
    named: NamedParams,
    routing: Routing,
    hp: Mapping[str, Any],
    make_structured: Callable[[list[torch.nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer],
    make_fallback: Callable[[list[torch.nn.Parameter], Mapping[str, Any]], torch.optim.Optimizer] | None = None,
) -> torch.optim.Optimizer:
    """The structured method on `routing.structured`, the fallback (AdamW by default) on `routing.fallback`.

    The default fallback's `adamw_*` hyperparameters are checked even when no parameter goes to it."""
    if make_fallback is None:
        check_fallback_adamw(hp)
    by_name = dict(named)
    parts: dict[str, torch.optim.Optimizer] = {}
    if routing.structured:
        parts["structured"] = make_structured([by_name[n] for n in routing.structured], hp)
    if routing.fallback:
        parts["fallback"] = (make_fallback or fallback_adamw)([by_name[n] for n in routing.fallback], hp)
    return HybridOptimizer(parts)


def check_fallback_adamw(hp: Mapping[str, Any]) -> None:
    """Raise ValueError unless the `adamw_*` hyperparameters lie in torch.optim.AdamW's ranges: betas in [0, 1), eps
    and weight decay >= 0 (its learning rate is one of the entry's `lr_keys`, checked by the registry)."""
    for key in ("adamw_beta1", "adamw_beta2"):
        if not 0.0 <= hp[key] < 1.0:
            raise ValueError(f"{key} must be in [0, 1); got {hp[key]!r}")
    for key in ("adamw_eps", "adamw_weight_decay"):
        if not hp[key] >= 0.0:
            raise ValueError(f"{key} must be >= 0; got {hp[key]!r}")


def adamw_state_bytes(shapes: list[tuple[int, ...]]) -> int:
    """torch.optim.AdamW's state: exp_avg and exp_avg_sq in float32 per element, a float32 step scalar each."""
    return sum(2 * 4 * _numel(s) + 4 for s in shapes)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
