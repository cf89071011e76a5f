"""Papers' claims checked at small scale (`structbench claims`): the registry by paper."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from structbench.claims.base import ClaimDef
from structbench.errors import Registry

_MODULES = {
    "4bit-shampoo": "shampoo4bit",
    "racs-alice": "racs_alice",
    "asgo": "asgo",
    "sumo": "sumo",
    "fismo": "fismo",
}
"""Each paper and the module of `structbench.claims` that lists its claims (`CLAIMS`), imported when asked for."""

PAPERS = tuple(_MODULES)


def _module_claims(module: str) -> Callable[[], list[ClaimDef]]:
    return lambda: list(importlib.import_module(f"structbench.claims.{module}").CLAIMS)


def _every_claim() -> list[ClaimDef]:
    return [claim for paper in PAPERS for claim in claims_of(paper)]


BY_PAPER: Registry[Callable[[], list[ClaimDef]]] = Registry(
    "paper",
    [*((paper, _module_claims(module)) for paper, module in _MODULES.items()), ("all", _every_claim)],
    sort=False,
)
"""What lists each paper's claims (and "all": every paper's, in PAPERS order), by the name `structbench claims`
takes."""


def claims_of(paper: str) -> list[ClaimDef]:
    """The registered claims of one paper ("all": of every paper, in PAPERS order)."""
    return BY_PAPER.lookup(paper)()
