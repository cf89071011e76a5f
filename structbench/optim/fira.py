"""Fira: GaLore plus a norm-scaled compensation of the residual gradient, with the norm-growth limiter.

Paper: Chen, Feng, Li, Lai, Yue, Yuan & Wang, "Fira: Can We Achieve Full-rank Training of LLMs Under Low-rank
Constraint?" (arXiv 2410.01623). Benchmarked here as the baseline of Gong, Scetbon, Ma & Meeds, "Towards
Efficient Optimizer Design for LLM via Structured Fisher Approximation with a Low-Rank Extension" (the
RACS/Alice paper): Sec. 7.2, App. E.5 and F.1 ("we follow the implementation of the official Fira repo and add
the compensation to GaLore", Algorithm 8 of App. B.11), F.2 (limiter threshold gamma = 1.01, the GaLore
hyperparameters of Table 7) and F.7 (Fira+). That paper prints no formula for Fira, so the update follows the
reference code xichen-fy/Fira (`optimizer_torch/fira_adamw.py`, `gradient_projection.py`, 136583b). Per
matrix W (m x n; conv filters as (out, in*kh*kw)), with GaLore's projection (`structbench.optim.galore`):

    G = gradient;  sigma = U^T G (left side, r x n) or G V (right side, m x r)       (Alg. 8, GaLore)
    m = b1 m + (1 - b1) sigma;  v = b2 v + (1 - b2) sigma^2;  N = m / (sqrt(v) + eps)  (HF-style Adam)
    phi_c = ||N_c|| / (||sigma_c|| + 1e-8)     for each channel c: the columns of a left projection, the rows
                                               of a right one; norms along the r dimension
    R = G - alpha back(sigma)                  (reference: back() carries GaLore's scale alpha)
    C = R Diag(phi)  (columns; Diag(phi) R for rows)
    eta = gamma / max(||C||_F / psi, gamma) if psi > 0 else 1;  psi <- eta ||C||_F;  C <- eta C   (limiter)
    W <- W - lr sqrt(1 - b2^t) / (1 - b1^t) (alpha back(N) + C)
    W <- W - lr wd W                                                      (decoupled, after the update)

back(X) = U X (left) or X V^T (right). The ratio phi is the Adam step's norm over the projected gradient's,
per channel: Fira's estimate of how Adam would scale the part of the gradient GaLore discards.

Switches (each declared in `Fira.hparams` with its source):
- `residual`: "reference" (default) is the official code's R = G - alpha U U^T G, which keeps (1 - alpha) of
  the in-subspace gradient when alpha != 1; "orthogonal" uses R = G - U U^T G, the orthogonal complement.
- `compensation`: "fira" (default); "fira+" is the RACS/Alice paper's F.7 variant: C rescaled to the
  Frobenius norm of the low-rank update alpha back(N) (= |alpha| ||N||, the projection being orthonormal), then
  multiplied by `alpha_c` (no limiter: the rescaling fixes the norm); "none" is GaLore exactly (the Fig. 5(c)
  no-compensation baseline).
- `gamma` (1.01) is the threshold the reference code hard-codes.
- Everything GaLore has: `refresh_schedule` ("paper" = t == 1 or t mod T == 0 as in Alg. 8; "reference" = the
  official code's 0-based counter, t = 1, T + 1, ...), `proj_type`, `reproject_moments`, `svd_method`. The SVD is
  GaLore's (`GaLore._bases`), taken of the gradient itself as the reference's `gradient_projection.py` does (lines
  93-116), so the singular vectors' signs, and with them the moments carried across a refresh, are the reference's
  on wide matrices too (tests/optim/test_fira_authors_code.py steps both side by side).

Differences from the reference code: the limiter divides by psi rather than psi + 1e-8 (`racs.limiter_factor`,
shared with RACS and Alice) and skips when psi = 0 rather than only at the first step; the reference takes
Python maxima of tensors (a device sync per matrix), this one is branch-free. The compensation runs per bucket
of same-shape matrices (`galore.LowRankBucket`: one batched product, ratio, norm and limiter for all of them, each
matrix with its own psi), with the per-matrix arithmetic. Norms along "the r dimension" is
what the reference's `0 if N.shape[0] < N.shape[1] else 1` selects except for a tall matrix under
`proj_type="reverse_std"` with r = n.

State per matrix: GaLore's float32 projection and moments, plus `limiter_norm` psi (a float32 0-d tensor, kept
in every compensation mode): mn + 2nr + mr (+1) of Table 6, which lists Fira = GaLore and omits the scalar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from structbench.optim import memory
from structbench.optim.galore import (
    GALORE_FALLBACK,
    SIGN_INVARIANT_CHECK_HPARAMS,
    GaLore,
    LowRankBucket,
    galore_state_bytes,
)
from structbench.optim.hparams import Declaration, code, option, ours, paper, real
from structbench.optim.hybrid import hybrid_builder
from structbench.optim.norm_scaling import channel_ratio, limit_norm_growth, limiter_norm
from structbench.optim.partition import head_switch, route_with_head_switch
from structbench.optim.racs import LIMITER_GAMMA
from structbench.optim.racs import PAPER as RACS_ALICE_PAPER
from structbench.optim.registry import OptimizerEntry, register

COMPENSATIONS = ("fira", "fira+", "none")
RESIDUALS = ("reference", "orthogonal")
REFERENCE = "xichen-fy/Fira optimizer_torch/fira_adamw.py"


class Fira(GaLore):
    """Fira-Adam over matrix parameters: GaLore's low-rank Adam plus the limited compensation term."""

    matrices_only = "Fira"

    hparams = GaLore.hparams + Declaration(
        LIMITER_GAMMA,
        option("compensation", "fira", COMPENSATIONS, code(f"{REFERENCE}; 'fira+' is the paper's F.7 variant")),
        real(
            "alpha_c",
            0.4,
            ours(f"Alice's alpha_c ({RACS_ALICE_PAPER} Table 11, 60M): the paper gives none for Fira+, its only user"),
            "[0, inf)",
        ),
        option("residual", "reference", RESIDUALS, code(f"{REFERENCE}: R = G - scale U U^T G")),
    )

    def step_group(self, group: dict[str, Any]) -> None:
        buckets = self.low_rank_adam(group)
        for bucket in buckets:
            for param in bucket.params:
                limiter_norm(self.state[param], param.device)
            extra = None if group["compensation"] == "none" else self._compensation(group, bucket)
            self.apply_low_rank_update(group, bucket, extra)
        self.decay_weights(group, [param for bucket in buckets for param in bucket.params])

    def _compensation(self, group: Mapping[str, Any], bucket: LowRankBucket) -> Tensor:
        """The full-rank terms C of a bucket's matrices (each limited by its norm psi, or rescaled for Fira+), a
        float32 (k, m, n) stack."""
        in_span = bucket.back(bucket.projected)
        kept = group["scale"] if group["residual"] == "reference" else 1.0
        residual = bucket.grads - kept * in_span
        comp = residual * channel_ratio(bucket.normalized, bucket.projected, bucket.right)
        norm = torch.linalg.matrix_norm(comp)
        if group["compensation"] == "fira+":
            target = abs(group["scale"]) * torch.linalg.matrix_norm(bucket.normalized)
            factor = torch.where(norm > 0, target / torch.where(norm > 0, norm, torch.ones_like(norm)), 0.0)
            return comp * (group["alpha_c"] * factor)[:, None, None]
        states = [self.state[param] for param in bucket.params]
        return comp * limit_norm_growth(states, norm, group["gamma"])[:, None, None]


def fira_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """GaLore's float32 projection and moments + the float32 limiter norm per matrix, + the AdamW fallback."""
    return galore_state_bytes(structured, fallback, hp) + memory.FLOAT32_BYTES * len(structured)


FIRA = register(
    OptimizerEntry(
        name="fira",
        refresh_interval="update_proj_gap",
        summary="Fira: GaLore plus a norm-scaled full-rank compensation of the residual gradient, norm-limited",
        reference=(
            "Chen et al. 2024 (Fira, arXiv 2410.01623), as the baseline of Gong et al., RACS/Alice paper, Sec. 7.2, "
            "App. E.5, F.1, F.2, F.7 (GaLore = Alg. 8, App. B.11); reference code xichen-fy/Fira "
            "optimizer_torch/fira_adamw.py + gradient_projection.py (136583b)"
        ),
        hparams=(
            Fira.hparams
            + head_switch(False, paper(f"{RACS_ALICE_PAPER} Table 2 'Ppl.': the LM head trained by Fira"))
            + GALORE_FALLBACK
        ),
        build=hybrid_builder(Fira),
        route=route_with_head_switch,
        notes=(
            "GaLore's hyperparameters have GaLore's sources (Table 7 is shared by GaLore and Fira; the Fira code "
            "refreshes at t = 1, T+1, ...: refresh_schedule 'reference'). Compensation formula: reference code (the "
            "paper only says it follows the official repo): per channel (columns of a left projection, rows of a "
            "right one) ||N_c|| / (||sigma_c|| + 1e-8) with norms along r, times the residual R, limited; update "
            "lr_bc (scale back(N) + C). residual 'orthogonal' = G - U U^T G. compensation 'fira+' (paper F.7: C "
            "rescaled to ||scale back(N)||_F, times alpha_c, no limiter) | 'none' (= GaLore). Limiter differences "
            "from the code: psi without + 1e-8, skipped while psi = 0. head_to_fallback True gives 'Ppl.*'. "
            "Fallback AdamW as GaLore's reference code. State: float32 projection, moments and limiter norm."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=fira_state_bytes,
        compile_supported=True,
        check_hparams=SIGN_INVARIANT_CHECK_HPARAMS,
    )
)
