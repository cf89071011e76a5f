"""Numerical experiments: computations that produce a table and a verdict on a paper's claims.

An experiment is not a training run. `structbench run --suite <experiment suite>` calls its `run`
function, stores one run row (task `experiment:<name>`) plus the table in the results store, and
prints the table and each claim with the numbers behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch


@dataclass(frozen=True)
class Claim:
    """One statement from a paper (or a check of structbench's own), whether our numbers support it, and the numbers."""

    source: str
    statement: str
    holds: bool
    evidence: str


@dataclass(frozen=True)
class ExperimentResult:
    table: pd.DataFrame
    claims: list[Claim] = field(default_factory=list)


@dataclass(frozen=True)
class ExperimentDef:
    name: str
    summary: str
    defaults: Mapping[str, Any]
    run: Callable[[dict[str, Any], int, torch.device], ExperimentResult]
    validate: Callable[[Mapping[str, Any]], None] | None = None
    """Raises ValueError for arguments (defaults merged in) no run could use; called when the suite is resolved, so
    a bad argument is a usage error before anything runs or is written."""
