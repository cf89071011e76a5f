"""Optimizers: the registry, `make_optimizer`, and one module per optimizer family.

Importing this package registers every optimizer. `get` and `names` also find plugins (`structbench.optim.plugins`):
a `package.module:Class` named on the command line, and the entry points of installed packages.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from structbench.optim import adagrad_norm as adagrad_norm
from structbench.optim import alice as alice
from structbench.optim import apollo as apollo
from structbench.optim import asgo as asgo
from structbench.optim import baselines as baselines
from structbench.optim import fira as fira
from structbench.optim import fismo as fismo
from structbench.optim import galore as galore
from structbench.optim import muon as muon
from structbench.optim import plugins, registry
from structbench.optim import racs as racs
from structbench.optim import shampoo as shampoo
from structbench.optim import shampoo4bit as shampoo4bit
from structbench.optim import soap as soap
from structbench.optim import sumo as sumo
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register


def names() -> list[str]:
    """Every optimizer's name: structbench's own and those installed packages register through the
    `structbench.optimizers` entry point (a `package.module:Class` named on the command line is not listed)."""
    plugins.load_entry_points()
    return registry.names()


def get(name: str) -> OptimizerEntry:
    """The entry of optimizer `name`: a registered one, a `package.module:Class`, or an installed plugin's; an unknown
    name is a usage error."""
    if registry.registered(name) is None:
        plugins.resolve(name)
    return registry.get(name)


def resolve_hparams(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`registry.resolve_hparams` for any optimizer `get` finds."""
    get(name)
    return registry.resolve_hparams(name, overrides)


def validate(name: str, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """`registry.validate` for any optimizer `get` finds."""
    get(name)
    return registry.validate(name, hparams)


def make_optimizer(name: str, model_or_named_params: nn.Module | NamedParams, **hparams: Any) -> torch.optim.Optimizer:
    """`registry.make_optimizer` for any optimizer `get` finds."""
    get(name)
    return registry.make_optimizer(name, model_or_named_params, **hparams)


def build_with_routing(
    name: str, model_or_named_params: nn.Module | NamedParams, hparams: Mapping[str, Any]
) -> tuple[torch.optim.Optimizer, Routing]:
    """`registry.build_with_routing` for any optimizer `get` finds."""
    get(name)
    return registry.build_with_routing(name, model_or_named_params, hparams)


__all__ = [
    "OptimizerEntry",
    "Routing",
    "build_with_routing",
    "get",
    "make_optimizer",
    "names",
    "register",
    "resolve_hparams",
    "validate",
]
