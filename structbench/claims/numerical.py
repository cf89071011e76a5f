"""Claims checked by the numerical experiments (structbench.experiments): run one once per process and read a
verdict off its table and its own claims."""

from __future__ import annotations

import json
from typing import Any

import torch

from structbench.claims.base import FAILS, HOLDS, Outcome
from structbench.experiments import ExperimentResult, get_experiment

_RESULTS: dict[str, ExperimentResult] = {}


def experiment(name: str, args: dict[str, Any], seed: int, device: torch.device) -> ExperimentResult:
    """The experiment's result for these arguments (computed once per process)."""
    key = json.dumps([name, args, seed, str(device)], sort_keys=True)
    if key not in _RESULTS:
        definition = get_experiment(name)
        merged = {**definition.defaults, **args}
        if definition.validate is not None:
            definition.validate(merged)
        _RESULTS[key] = definition.run(merged, seed, device)
    return _RESULTS[key]


def forget_results() -> None:
    _RESULTS.clear()


def from_experiment(
    result: ExperimentResult, statement_start: str, numbers: dict[str, float], budget: str, seeds: str
) -> Outcome:
    """The verdict of the experiment's own claim whose statement starts with `statement_start`."""
    matches = [c for c in result.claims if c.statement.startswith(statement_start)]
    if len(matches) != 1:
        raise LookupError(f"expected one experiment claim starting {statement_start!r}, found {len(matches)}")
    found = matches[0]
    return Outcome(
        HOLDS if found.holds else FAILS,
        numbers,
        found.evidence,
        seeds=seeds,
        budget=budget,
        reason="" if found.holds else f"{found.source}: the measured numbers contradict it",
    )
