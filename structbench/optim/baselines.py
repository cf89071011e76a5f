"""First-order baselines: thin wrappers over `torch.optim.SGD` and `torch.optim.AdamW` (not rewritten)."""

from __future__ import annotations

from typing import Any

import torch

from structbench.optim.hparams import Declaration, code, decade_around, flag, lin, paper, real
from structbench.optim.hybrid import adamw_state_bytes
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

SHAMPOO_PAPER = "4-bit Shampoo (arXiv 2405.18144)"
TORCH_SGD = "pytorch torch/optim/sgd.py"
TORCH_ADAMW = "pytorch torch/optim/adamw.py"

SGD_HPARAMS = Declaration(
    real("lr", 0.1, paper(f"{SHAMPOO_PAPER} App. G, the SGD-M base's lr"), "(0, inf)", decade_around()),
    real("momentum", 0.9, paper(f"{SHAMPOO_PAPER} App. G, the SGD-M base's momentum"), "[0, 1)", lin(0.85, 0.95)),
    flag("nesterov", False, code(f"{TORCH_SGD} default")),
    real("weight_decay", 0.0, code(f"{TORCH_SGD} default"), "[0, inf)"),
)
"""torch.optim.SGD's keywords. It accepts any momentum >= 0; heavy-ball momentum (buf = mu*buf + g) is a geometric
average only for mu in [0, 1), and at mu >= 1 the buffer never forgets, so that is the range taken here."""

ADAMW_HPARAMS = Declaration(
    real("lr", 1e-3, code(f"{TORCH_ADAMW} default"), "(0, inf)", decade_around()),
    real("beta1", 0.9, code(f"{TORCH_ADAMW} default"), "[0, 1)", lin(0.85, 0.95)),
    real("beta2", 0.999, code(f"{TORCH_ADAMW} default"), "[0, 1)"),
    real("eps", 1e-8, code(f"{TORCH_ADAMW} default"), "[0, inf)"),
    real("weight_decay", 1e-2, code(f"{TORCH_ADAMW} default"), "[0, inf)"),
)


def _build_sgd(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for _, p in named], **SGD_HPARAMS.take(hp))


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
        hparams=SGD_HPARAMS,
        build=_build_sgd,
        state_bytes=lambda structured, fallback, hp: 4 * sum(_numel(s) for s in structured) if hp["momentum"] else 0,
    )
)

ADAMW = register(
    OptimizerEntry(
        name="adamw",
        summary="AdamW with decoupled weight decay (torch.optim.AdamW)",
        reference="Loshchilov & Hutter 2019, Algorithm 2; torch.optim.AdamW",
        hparams=ADAMW_HPARAMS,
        build=_build_adamw,
        state_bytes=lambda structured, fallback, hp: adamw_state_bytes(structured),
    )
)
