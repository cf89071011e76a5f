"""FISMO's claims (Xu, Yan & Zhang, "FISMO: Fisher-Structured Momentum-Orthogonalized Optimizer"; cited by third
parties as arXiv 2601.21750, not verified here).

Section 7 / Figure 3: the condition number of the update matrices orders kappa_Adam > 1e8 >> kappa_FISMO ~ 1e2-1e3
> kappa_Muon(NS5) > kappa_Muon(NS7) > kappa_ideal-Muon = 1 (checked by the update-cond experiment on a shared
gradient trace). Section 6, Figures 1 and 2: FISMO reaches the lowest final loss on GPT-2/OpenWebText and the highest
accuracy on CIFAR-10, above Muon; here the weaker "at least matches Muon" on digits and a small LLaMA.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from structbench.claims.base import ClaimDef, Context, Outcome
from structbench.claims.numerical import experiment, from_experiment
from structbench.claims.trained import lm_claim, vision_claim

PAPER = "fismo"
SOURCE = "arXiv 2601.21750 (unverified id)"


def _args(scale: str) -> dict[str, Any]:
    if scale == "ci":
        return {"steps": 30, "log_every": 10, "methods": ["adam", "muon-ns5", "muon-ns7", "muon-svd", "fismo"]}
    return {}


def _medians(table: pd.DataFrame) -> dict[str, float]:
    pooled = table[(table["layer"] == "all") & table["step"].isna() & (table["grad_scale"] == 1.0)]
    return {f"{row.method}_median_cond".replace("-", "_"): float(row.cond_nonzero) for row in pooled.itertuples()}


def _condition(statement_start: str):
    def run(scale: str, ctx: Context) -> Outcome:
        args = _args(scale)
        result = experiment("update-cond", args, 0, ctx.device)
        budget = f"gradient trace of {args.get('steps', 200)} steps (MLP on a Gaussian mixture)"
        return from_experiment(
            result, statement_start, _medians(result.table), budget, "1 (seed 0; one shared gradient trace)"
        )

    return run


CLAIMS = [
    ClaimDef(
        PAPER,
        "update-condition-ordering",
        "Update condition numbers order kappa_Adam >> kappa_FISMO > kappa_Muon(NS5) > kappa_Muon(NS7) > 1",
        f"{SOURCE} §7, Figure 3",
        "kappa_Adam > 1e8, kappa_FISMO ~ 1e2-1e3, Muon towards 1 (Figure 3, read off the plot)",
        _condition("Ordering kappa_Adam"),
        needs=frozenset({"fismo", "muon", "adamw"}),
    ),
    ClaimDef(
        PAPER,
        "fismo-condition-1e2-1e3",
        "FISMO's update condition number is stable at about 1e2-1e3",
        f"{SOURCE} §7, Figure 3",
        "~1e2-1e3",
        _condition("FISMO's kappa is stable"),
        needs=frozenset({"fismo"}),
    ),
    ClaimDef(
        PAPER,
        "adam-condition-above-1e8",
        "Adam's update matrices are ill-conditioned (kappa > 1e8)",
        f"{SOURCE} §7, Figure 3",
        "> 1e8",
        _condition("Adam's update matrices"),
        needs=frozenset({"adamw"}),
    ),
    vision_claim(
        PAPER,
        "matches-muon-vision",
        "FISMO trains an image classifier at least as well as Muon (final test accuracy)",
        f"{SOURCE} §6, Figure 2 (SimpleDLA on CIFAR-10; FISMO highest test accuracy)",
        "FISMO above Muon throughout (Figure 2, no table)",
        "fismo",
        "muon",
        margin=0.01,
        lrs={"fismo": 0.1, "muon": 0.1},
    ),
    lm_claim(
        PAPER,
        "matches-muon-lm",
        "FISMO trains a language model at least as well as Muon (final test loss)",
        f"{SOURCE} §6, Figure 1 (GPT-2 124M on OpenWebText; FISMO lowest final loss)",
        "FISMO below Muon's loss throughout (Figure 1, no table)",
        "fismo",
        "muon",
        margin=0.02,
    ),
]
