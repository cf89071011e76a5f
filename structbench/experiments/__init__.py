"""Numerical experiments by name (see `structbench.experiments.base`)."""

from __future__ import annotations

from structbench.errors import UsageError
from structbench.experiments.base import Claim, ExperimentDef, ExperimentResult
from structbench.optim.registry import unknown_name_message

EXPERIMENTS: dict[str, ExperimentDef] = {}


def register_experiment(definition: ExperimentDef) -> ExperimentDef:
    EXPERIMENTS[definition.name] = definition
    return definition


def get_experiment(name: str) -> ExperimentDef:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise UsageError(unknown_name_message("experiment", name, sorted(EXPERIMENTS))) from None


def _register_builtin() -> None:
    from structbench.experiments.orth_error import ORTH_ERROR
    from structbench.experiments.quant_error import QUANT_ERROR
    from structbench.experiments.update_cond import UPDATE_COND

    for definition in (ORTH_ERROR, QUANT_ERROR, UPDATE_COND):
        register_experiment(definition)


_register_builtin()

__all__ = ["EXPERIMENTS", "Claim", "ExperimentDef", "ExperimentResult", "get_experiment", "register_experiment"]
