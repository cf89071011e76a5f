"""One optimizer made of a structured method and its fallback, stepped together.

`HybridOptimizer` is a `torch.optim.Optimizer` whose param groups are the very group dicts of its
parts, so learning-rate schedulers and `zero_grad` act on both; `state_dict()` nests the parts' own
state dicts and round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from structbench.optim.base import StructuredOptimizer
from structbench.optim.hf_adamw import HFAdamW, hf_adamw_state_bytes
from structbench.optim.hparams import Declaration, Source, code, decade_around, option, real
from structbench.optim.registry import Builder, NamedParams, Routing

AUX_ADAM = "KellerJordan/Muon muon.py, its auxiliary Adam"

ADAMW_FALLBACK = Declaration(
    real("adamw_lr", 3e-4, code(AUX_ADAM), "(0, inf)", decade_around(3)),
    real("adamw_beta1", 0.9, code(AUX_ADAM), "[0, 1)"),
    real("adamw_beta2", 0.95, code(AUX_ADAM), "[0, 1)"),
    real("adamw_eps", 1e-10, code(AUX_ADAM), "[0, inf)"),
    real("adamw_weight_decay", 0.0, code(f"{AUX_ADAM} (no weight decay)"), "[0, inf)"),
)
"""torch.optim.AdamW for the parameters a hybrid's structured method leaves to it, declared once for every hybrid:
its valid values are torch AdamW's (betas in [0, 1), eps and weight decay >= 0) and its defaults Keller Jordan's Muon
reference code's auxiliary Adam, whose arithmetic torch AdamW shares (muon.py `adam_update`, commit 857d1ad: eps added
to the bias-corrected sqrt(v), decay before the update; tests/optim/test_muon_authors_code.py). An entry whose paper
or reference code treats those parameters otherwise states its own defaults with `adamw_fallback` (or
`ADAMW_FALLBACK.with_defaults`, field by field)."""


ADAMW_FORMS = ("torch", "hf", "hf-skip-first")
"""The fallback's arithmetic: torch.optim.AdamW; the transformers-style AdamW of GaLore's and SOAP's code
(`hf_adamw.HFAdamW`: eps on the uncorrected sqrt(v), weight decay after the update); the same with SOAP's code's
skipped first step."""


def adamw_form(default: str, source: Source) -> Declaration:
    """The declared switch `adamw_form` (one of `ADAMW_FORMS`) of an entry whose fallback names a code's AdamW; an
    entry without it gets torch.optim.AdamW."""
    return Declaration(option("adamw_form", default, ADAMW_FORMS, source))


def adamw_fallback(
    source: Source, *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float
) -> Declaration:
    """`ADAMW_FALLBACK` with an entry's defaults, all from one source (a reference code's treatment of the other
    parameters)."""
    return ADAMW_FALLBACK.with_defaults(
        adamw_lr=(lr, source),
        adamw_beta1=(beta1, source),
        adamw_beta2=(beta2, source),
        adamw_eps=(eps, source),
        adamw_weight_decay=(weight_decay, source),
    )


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

    @property
    def root_fallbacks(self) -> int:
        """Iterative matrix roots that fell back to an eigendecomposition (FISMO's root_method="newton")."""
        return sum(int(getattr(part, "root_fallbacks", 0)) for part in self.parts.values())


def fallback_adamw(params: list[torch.nn.Parameter], hp: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The fallback from the `adamw_*` hyperparameters of a hybrid entry: `torch.optim.AdamW`, or `HFAdamW` where the
    entry's `adamw_form` asks for the code's arithmetic."""
    form = hp.get("adamw_form", "torch")
    if form != "torch":
        return HFAdamW(
            params,
            lr=hp["adamw_lr"],
            betas=(hp["adamw_beta1"], hp["adamw_beta2"]),
            eps=hp["adamw_eps"],
            weight_decay=hp["adamw_weight_decay"],
            skip_first_step=form == "hf-skip-first",
        )
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
    """The structured method on `routing.structured`, the fallback (AdamW by default) on `routing.fallback`."""
    by_name = dict(named)
    parts: dict[str, torch.optim.Optimizer] = {}
    if routing.structured:
        parts["structured"] = make_structured([by_name[n] for n in routing.structured], hp)
    if routing.fallback:
        parts["fallback"] = (make_fallback or fallback_adamw)([by_name[n] for n in routing.fallback], hp)
    return HybridOptimizer(parts)


def hybrid_builder(cls: type[StructuredOptimizer]) -> Builder:
    """The registry builder of a hybrid whose structured part is `cls`, given its declared hyperparameters, and whose
    fallback is AdamW."""

    def build(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
        return build_hybrid(named, routing, hp, lambda params, values: cls(params, **cls.hparams.take(values)))

    return build


def adamw_state_bytes(shapes: list[tuple[int, ...]]) -> int:
    """torch.optim.AdamW's state: exp_avg and exp_avg_sq in float32 per element, a float32 step scalar each."""
    return sum(2 * 4 * _numel(s) + 4 for s in shapes)


def fallback_state_bytes(shapes: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """The state bytes of the fallback `fallback_adamw` builds for `hp` (torch AdamW's float32 step scalars
    included; `HFAdamW` counts its steps in Python ints)."""
    if hp.get("adamw_form", "torch") == "torch":
        return adamw_state_bytes(shapes)
    return hf_adamw_state_bytes(shapes)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
