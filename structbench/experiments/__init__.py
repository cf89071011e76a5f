"""Numerical experiments by name (see `structbench.experiments.base`)."""

from __future__ import annotations

from structbench.errors import Registry
from structbench.experiments.base import Claim, ExperimentDef, ExperimentResult

EXPERIMENTS: Registry[ExperimentDef] = Registry("experiment")


def register_experiment(definition: ExperimentDef) -> ExperimentDef:
    """Register `definition` under its name; a name already registered is a ValueError."""
    return EXPERIMENTS.register(definition.name, definition)


def get_experiment(name: str) -> ExperimentDef:
    """The experiment registered as `name`; an unknown name is a usage error."""
    return EXPERIMENTS.lookup(name)


def _register_builtin() -> None:
    from structbench.experiments.orth_error import ORTH_ERROR
    from structbench.experiments.quant_error import QUANT_ERROR
    from structbench.experiments.update_cond import UPDATE_COND

    for definition in (ORTH_ERROR, QUANT_ERROR, UPDATE_COND):
        register_experiment(definition)


_register_builtin()

__all__ = ["EXPERIMENTS", "Claim", "ExperimentDef", "ExperimentResult", "get_experiment", "register_experiment"]
