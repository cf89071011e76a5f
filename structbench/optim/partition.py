"""Which parameters a structured optimizer owns, and which go to its first-order fallback.

The default policy (Muon's, and the rule most of the seed papers state): hidden matrices — 2-D weights
and convolution filters viewed as (out, in*kh*kw) — go to the structured method; biases, norm scales and
other 1-D parameters, embedding tables and the output head go to the fallback (AdamW unless the paper
says otherwise). The head is the last parameterised module when it is an `nn.Linear` (a classifier or
LM head); a method whose paper keeps the head structured says so with `head_to_fallback=False`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from structbench.optim.hparams import Declaration, Source, flag
from structbench.optim.registry import NamedParams, Routing

KINDS = ("matrix", "vector", "embedding", "head")


def parameter_kinds(model: nn.Module | None, named: NamedParams) -> dict[str, str]:
    """Map each parameter name to matrix | vector | embedding | head."""
    embedding_params: set[str] = set()
    head_params: set[str] = set()
    if model is not None:
        owners = [
            (name, module)
            for name, module in model.named_modules()
            if next(module.parameters(recurse=False), None) is not None
        ]
        for name, module in owners:
            if isinstance(module, nn.Embedding):
                embedding_params.update(_qualified(name, module))
        if owners and isinstance(owners[-1][1], nn.Linear):
            head_params.update(_qualified(*owners[-1]))
    kinds = {}
    for name, param in named:
        if name in embedding_params:
            kinds[name] = "embedding"
        elif name in head_params:
            kinds[name] = "head"
        elif param.ndim >= 2:
            kinds[name] = "matrix"
        else:
            kinds[name] = "vector"
    return kinds


def _qualified(prefix: str, module: nn.Module) -> list[str]:
    return [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)]


def split(
    model: nn.Module | None,
    named: NamedParams,
    fallback_name: str = "adamw",
    head_to_fallback: bool = True,
    structured_kinds: Sequence[str] = ("matrix",),
) -> Routing:
    """Route matrices (and the head, when `head_to_fallback` is False) to the structured method."""
    kinds = parameter_kinds(model, named)
    owned = set(structured_kinds) | (set() if head_to_fallback else {"head"})
    structured = tuple(n for n, _ in named if kinds[n] in owned and _is_matrix_like(dict(named)[n]))
    fallback = tuple(n for n, _ in named if n not in structured)
    return Routing(structured=structured, fallback=fallback, fallback_name=fallback_name if fallback else None)


def route_with_head_switch(model: nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    """The default split, the head routed by the `head_to_fallback` hyperparameter (a paper's Ppl / Ppl* choice)."""
    return split(model, named, head_to_fallback=bool(hp["head_to_fallback"]))


def head_switch(default: bool, source: Source) -> Declaration:
    """The `head_to_fallback` hyperparameter of `route_with_head_switch`, with an entry's default and its source."""
    return Declaration(flag("head_to_fallback", default, source))


def _is_matrix_like(param: torch.Tensor) -> bool:
    return param.ndim >= 2


def matrix_view(tensor: torch.Tensor) -> torch.Tensor:
    """A (out, in*kh*kw) view of a conv filter; a 2-D tensor unchanged."""
    return tensor if tensor.ndim == 2 else tensor.reshape(tensor.shape[0], -1)


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The (rows, cols) a structured method sees for a parameter of `shape`."""
    rows = int(shape[0])
    cols = 1
    for size in shape[1:]:
        cols *= int(size)
    return rows, cols
