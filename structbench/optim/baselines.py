"""First-order baselines: thin wrappers over `torch.optim.SGD` and `torch.optim.AdamW` (not rewritten)."""

from __future__ import annotations

from typing import Any

import torch

from structbench.optim.hybrid import adamw_state_bytes
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register


def _build_sgd(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    """torch.optim.SGD, which accepts any momentum >= 0; heavy-ball momentum (buf = mu*buf + g) is a geometric
    average only for mu in [0, 1), and at mu >= 1 the buffer never forgets, so that is the range taken here."""
    if not 0.0 <= hp["momentum"] < 1.0:
        raise ValueError(f"momentum must be in [0, 1); got {hp['momentum']!r}")
    return torch.optim.SGD(
        [p for _, p in named],
        lr=hp["lr"],
        momentum=hp["momentum"],
        nesterov=hp["nesterov"],
        weight_decay=hp["weight_decay"],
    )


def _build_adamw(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [p for _, p in named],
        lr=hp["lr"],
        betas=(hp["beta1"], hp["beta2"]),
        eps=hp["eps"],
        weight_decay=hp["weight_decay"],
    )


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


SGD = register(
    OptimizerEntry(
        name="sgd",
        summary="SGD with heavy-ball momentum (torch.optim.SGD semantics: buf = mu*buf + g)",
        reference="Polyak 1964; Sutskever et al. 2013 (Nesterov); torch.optim.SGD",
        defaults={"lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0},
        build=_build_sgd,
        state_bytes=lambda structured, fallback, hp: 4 * sum(_numel(s) for s in structured) if hp["momentum"] else 0,
        notes="lr 0.1 and momentum 0.9 are the 4-bit Shampoo paper's SGD-M base settings.",
    )
)

ADAMW = register(
    OptimizerEntry(
        name="adamw",
        summary="AdamW with decoupled weight decay (torch.optim.AdamW)",
        reference="Loshchilov & Hutter 2019, Algorithm 2; torch.optim.AdamW",
        defaults={"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2},
        build=_build_adamw,
        state_bytes=lambda structured, fallback, hp: adamw_state_bytes(structured),
        notes="Defaults are torch.optim.AdamW's.",
    )
)
