"""SUMO's claims (Refael et al., "SUMO: Subspace-Aware Moment-Orthogonalization for Accelerating Memory-Efficient
LLM Training", arXiv 2505.24749).

Lemma 3.2 (Section 3.1) bounds Newton–Schulz's error, ||E_i||_F <= sqrt(r) (1 - 1/kappa)^(2^i) with
kappa = cond(A A^T); Section 3.2 replaces Newton–Schulz by an exact SVD in the low-rank subspace. Both are checked by
the orth-error experiment on matrices with known singular vectors. Section 5 (Table 2, Figure 2) reports SUMO
converging faster than GaLore when pre-training LLaMA on C4; here the same comparison on a small LLaMA.
"""

from __future__ import annotations

from typing import Any

from structbench.claims.base import FAILS, HOLDS, ClaimDef, Context, Outcome
from structbench.claims.numerical import experiment, from_experiment
from structbench.claims.trained import lm_claim

PAPER = "sumo"
ARXIV = "arXiv 2505.24749"


def _args(scale: str) -> dict[str, Any]:
    if scale == "ci":
        return {"rows": 16, "cols": 64, "kappas": [1.0, 10.0, 100.0, 1e4], "steps": [5]}
    return {"rows": 16, "cols": 256}


def _budget(args: dict[str, Any]) -> str:
    merged = {"rows": 16, "cols": 256, "kappas": "1..1e6 (8 values)", "steps": [5, 7], **args}
    return f"{merged['rows']}x{merged['cols']} matrices, cond(A) {merged['kappas']}, NS steps {merged['steps']}"


def _bound(scale: str, ctx: Context) -> Outcome:
    result = experiment("orth-error", _args(scale), 0, ctx.device)
    table = result.table
    cubic = table[(table["method"] == "ns_cubic") & (table["dtype"] == "float64") & (table["spectrum"] == "geometric")]
    numbers = {
        "rows_within_bound": float(cubic["within_bound"].sum()),
        "rows": float(len(cubic)),
        "max_error_minus_bound": float((cubic["error"] - cubic["bound"]).max()),
    }
    return from_experiment(
        result, "The cubic Newton–Schulz error", numbers, _budget(_args(scale)), "1 (seed 0; exact computation)"
    )


def _plateau(scale: str, ctx: Context) -> Outcome:
    result = experiment("orth-error", _args(scale), 0, ctx.device)
    table = result.table
    plateau = table[(table["method"] == "ns_cubic") & (table["dtype"] == "float64") & (table["spectrum"] == "plateau")]
    numbers = {
        "rows_within_bound": float(plateau["within_bound"].sum()),
        "rows": float(len(plateau)),
        "max_error_minus_bound": float((plateau["error"] - plateau["bound"]).max()),
    }
    return from_experiment(
        result, "The bound holds as stated", numbers, _budget(_args(scale)), "1 (seed 0; exact computation)"
    )


def _svd(scale: str, ctx: Context) -> Outcome:
    """float32 rows: the SVD polar factor's error against Muon's NS5 (5 quintic steps) on the same matrices."""
    table = experiment("orth-error", _args(scale), 0, ctx.device).table
    svd = table[(table["method"] == "svd") & (table["dtype"] == "float32")]
    ns5 = table[(table["method"] == "ns_quintic") & (table["steps"] == 5) & (table["dtype"] == "float32")]
    paired = svd.merge(ns5, on=["spectrum", "dtype", "kappa_a"], suffixes=("", "_ns5"))
    moderate = paired[paired["kappa_a"] <= 100.0]
    numbers = {
        "svd_max_error_cond_le_100": float(moderate["error"].max()),
        "svd_max_error": float(paired["error"].max()),
        "ns5_min_error": float(paired["error_ns5"].min()),
        "min_ns5_minus_svd_error": float((paired["error_ns5"] - paired["error"]).min()),
    }
    holds = bool((paired["error"] < paired["error_ns5"]).all() and (moderate["error"] <= 1e-5).all())
    return Outcome(
        HOLDS if holds else FAILS,
        numbers,
        f"float32, {len(paired)} matrices: SVD error <= {numbers['svd_max_error']:.3g} (<= "
        f"{numbers['svd_max_error_cond_le_100']:.3g} for cond(A) <= 100) vs NS5 error >= {numbers['ns5_min_error']:.3g}"
        "; holds when the SVD's error is below NS5's on every matrix and <= 1e-5 up to cond(A) = 100",
        seeds="1 (seed 0; exact computation)",
        budget=_budget(_args(scale)),
    )


CLAIMS = [
    ClaimDef(
        PAPER,
        "ns-error-bound",
        "Newton–Schulz's orthogonalization error after i steps is at most sqrt(r) (1 - 1/kappa)^(2^i), "
        "kappa = cond(A A^T) (distinct singular values)",
        f"{ARXIV} §3.1 Lemma 3.2 (Remark 3.7: 0.99^32 ~ 0.725)",
        "bound sqrt(r) (1 - 1/kappa)^(2^i); 0.725 at 1 - 1/kappa = 0.99, 5 steps",
        _bound,
    ),
    ClaimDef(
        PAPER,
        "ns-error-bound-plateau",
        "The same bound with r = the number of singular values above a repeated smallest one",
        f"{ARXIV} §3.1 Lemma 3.2 (definition of r)",
        "bound sqrt(r) (1 - 1/kappa)^(2^i)",
        _plateau,
    ),
    ClaimDef(
        PAPER,
        "svd-exact-orthogonalization",
        "Orthogonalizing the (low-rank) moment by an exact SVD removes Newton–Schulz's error",
        f"{ARXIV} §3.2 (Orthogonalization_SVD, Algorithm 1)",
        "exact (error 0 up to rounding) vs Lemma 3.2's Newton–Schulz error",
        _svd,
    ),
    lm_claim(
        PAPER,
        "faster-than-galore",
        "SUMO reaches a lower evaluation perplexity than GaLore at the same step budget on LLaMA pre-training",
        f"{ARXIV} §5 Table 2 and Figure 2 (LLaMA-60M to 350M on C4)",
        "LLaMA-60M on C4: SUMO 31.87 vs GaLore 34.88 ppl (Table 2)",
        "sumo",
        "galore",
    ),
]
