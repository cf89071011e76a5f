"""Papers' claims checked at small scale (`structbench claims`): the registry by paper."""

from __future__ import annotations

from structbench.claims.base import ClaimDef
from structbench.errors import UsageError
from structbench.optim.registry import unknown_name_message

PAPERS = ("4bit-shampoo", "racs-alice", "asgo", "sumo", "fismo")


def claims_of(paper: str) -> list[ClaimDef]:
    """The registered claims of one paper ("all": of every paper, in PAPERS order)."""
    if paper == "all":
        return [c for name in PAPERS for c in claims_of(name)]
    if paper not in PAPERS:
        raise UsageError(unknown_name_message("paper", paper, [*PAPERS, "all"]))
    from structbench.claims import asgo, fismo, racs_alice, shampoo4bit, sumo

    modules = {"4bit-shampoo": shampoo4bit, "racs-alice": racs_alice, "asgo": asgo, "sumo": sumo, "fismo": fismo}
    return list(modules[paper].CLAIMS)
