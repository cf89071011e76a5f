"""The optimizer registry: command-line name -> factory, declared hyperparameters and reference.

Every optimizer structbench benchmarks registers one `OptimizerEntry`. Its `hparams` declare the hyperparameters a
run starts from, each with its default and where that comes from (the paper's value, or the reference code's where
the paper is silent, or a structbench choice), its valid values and its tuning range (`structbench.optim.hparams`);
a suite or `--set` may override any of them and nothing else, and a value outside its declared range is a usage error.

Every entry takes `lr`, its main step size (the structured method's, or the grafted base's for Shampoo), so
`--set "hparams.*.lr=..."` means the same thing for every optimizer; `register` puts `lr` first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from structbench.errors import UsageError, unknown_name_message
from structbench.optim.hparams import Declaration

NamedParams = Sequence[tuple[str, nn.Parameter]]


@dataclass(frozen=True)
class Routing:
    """Which parameters the structured method owns and which go to its fallback optimizer."""

    structured: tuple[str, ...]
    fallback: tuple[str, ...]
    fallback_name: str | None = None

    def as_record(self) -> dict[str, Any]:
        return {
            "structured": list(self.structured),
            "fallback": list(self.fallback),
            "fallback_optimizer": self.fallback_name,
        }


def route_all(model: nn.Module | None, named_params: NamedParams, hp: Mapping[str, Any]) -> Routing:
    """Routing of a plain first-order optimizer: it owns every parameter."""
    return Routing(structured=tuple(name for name, _ in named_params), fallback=())


Builder = Callable[[NamedParams, Routing, dict[str, Any]], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerEntry:
    name: str
    summary: str
    reference: str
    hparams: Declaration
    build: Builder
    route: Callable[[nn.Module | None, NamedParams, Mapping[str, Any]], Routing] = route_all
    notes: str = ""
    lr_keys: tuple[str, ...] = field(default=("lr",))
    state_bytes: Callable[[list[tuple[int, ...]], list[tuple[int, ...]], Mapping[str, Any]], int] | None = None
    """Analytic state size for float32 parameters: (structured shapes, fallback shapes, hparams) -> bytes."""
    compile_supported: bool = True
    compile_unsupported_reason: str = ""
    """Why torch.compile is declared unsupported (required when compile_supported is False): the conformance kit's
    compile check is then a skip with this reason."""
    refresh_interval: str | None = None
    """The hyperparameter that sets how many steps apart the costly refreshes (roots, bases, projections) come, or
    None when every step costs the same: the cost profile (structbench.optim.cost_profile) amortises over it."""
    check_hparams: Mapping[str, Any] = field(default_factory=dict)
    """Overrides the conformance kit uses so every code path (refreshes, root updates) runs within a few steps."""
    origin: Mapping[str, Any] | None = None
    """None for structbench's own optimizers; a plugin's identity (structbench.optim.plugins), stored with its runs."""

    @property
    def defaults(self) -> dict[str, Any]:
        """The declared defaults: the hyperparameters a run starts from."""
        return self.hparams.defaults()


_REGISTRY: dict[str, OptimizerEntry] = {}


def register(entry: OptimizerEntry) -> OptimizerEntry:
    """Register `entry` with `lr` as the first of its hyperparameters; returns the entry as registered.

    Every optimizer must take `lr` (its main step size) and list it in `lr_keys`.
    """
    if entry.name in _REGISTRY:
        raise ValueError(f"optimizer {entry.name!r} is registered twice")
    if not entry.compile_supported and not entry.compile_unsupported_reason:
        raise ValueError(f"optimizer {entry.name!r} declares torch.compile unsupported without saying why")
    if "lr" not in entry.hparams or "lr" not in entry.lr_keys:
        raise ValueError(f"optimizer {entry.name!r} must take `lr` (its main step size) in hparams and lr_keys")
    entry = dataclasses.replace(entry, hparams=entry.hparams.first("lr"))
    _REGISTRY[entry.name] = entry
    return entry


def add(entry: OptimizerEntry) -> OptimizerEntry:
    """Register a plugin's entry (structbench.optim.plugins); a name already taken, or one that cannot be part of a
    run's file name (structbench.store.paths.check_name), is a usage error."""
    from structbench.store.paths import check_name

    check_name("optimizer name", entry.name)
    try:
        return register(entry)
    except ValueError as exc:
        raise UsageError(f"cannot register optimizer {entry.name!r}: {exc}.") from None


def registered(name: str) -> OptimizerEntry | None:
    """The entry registered under `name` in this process, without looking for plugins."""
    return _REGISTRY.get(name)


def names() -> list[str]:
    """The names of the optimizers registered in this process (structbench's own, and plugins found so far), without
    the `package.module:Class` ones named on the command line; `structbench.optim.names` first loads the installed
    packages' entry points."""
    return sorted(name for name, entry in _REGISTRY.items() if (entry.origin or {}).get("kind") != "class")


def get(name: str) -> OptimizerEntry:
    """The entry registered under `name` in this process; an unknown name is a usage error. `structbench.optim.get`
    first looks for a plugin of that name."""
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UsageError(unknown_name_message("optimizer", name, names()))
    return entry


def resolve_hparams(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The entry's defaults updated by `overrides`; an unknown key, or a value of the wrong type or outside its
    declared range, is a usage error."""
    entry = get(name)
    unknown = sorted(set(overrides) - set(entry.hparams.names()))
    if unknown:
        raise UsageError(
            f"optimizer {name!r} has no hyperparameter {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(sorted(entry.hparams.names()))}."
        )
    hparams = {**entry.defaults, **overrides}
    first = next(entry.hparams.problems(hparams), None)
    if first is not None:
        key, problem = first
        raise UsageError(f"optimizer {name!r} rejects {key}={hparams[key]!r}: {problem}.")
    return hparams


def validate(name: str, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved hyperparameters of optimizer `name`, once its constructor has accepted them on a probe model.

    A ValueError or TypeError of the constructor becomes a usage error naming the hyperparameter(s) that alone make
    it fail (each tried on top of the defaults), so a grid is checked setting by setting before its first run.
    """
    resolved = resolve_hparams(name, hparams)
    problem = _construction_error(name, resolved)
    if problem is None:
        return resolved
    defaults = get(name).defaults
    changed = [key for key, value in resolved.items() if value != defaults[key]]
    culprits = [key for key in changed if _construction_error(name, {**defaults, key: resolved[key]})] or changed
    named = ", ".join(f"{key}={resolved[key]!r}" for key in culprits)
    raise UsageError(f"optimizer {name!r} rejects {named or 'its hyperparameters'}: {' '.join(problem.split())}")


def probe_model() -> nn.Module:
    """A hidden matrix, an output head and their biases (8 x 8, left uninitialised: no random draws), so that both
    the structured method and its fallback are built."""
    return nn.Sequential(nn.utils.skip_init(nn.Linear, 8, 8), nn.utils.skip_init(nn.Linear, 8, 8))


def _construction_error(name: str, hparams: Mapping[str, Any]) -> str | None:
    """The message of the ValueError or TypeError building `name` on the probe model raises, None if it builds."""
    try:
        build_with_routing(name, probe_model(), hparams)
    except (ValueError, TypeError) as exc:
        return str(exc) or type(exc).__name__
    return None


def make_optimizer(name: str, model_or_named_params: nn.Module | NamedParams, **hparams: Any) -> torch.optim.Optimizer:
    """Build optimizer `name` for a model (or its named parameters) with the given hyperparameters."""
    optimizer, _ = build_with_routing(name, model_or_named_params, hparams)
    return optimizer


def build_with_routing(
    name: str, model_or_named_params: nn.Module | NamedParams, hparams: Mapping[str, Any]
) -> tuple[torch.optim.Optimizer, Routing]:
    """Build optimizer `name` and return it with the parameter routing it used (stored with each run)."""
    entry = get(name)
    model = model_or_named_params if isinstance(model_or_named_params, nn.Module) else None
    if model is not None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    else:
        named = list(model_or_named_params)
    resolved = resolve_hparams(name, hparams)
    routing = entry.route(model, named, resolved)
    return entry.build(named, routing, resolved), routing
