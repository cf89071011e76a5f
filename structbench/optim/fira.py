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

Switches (each in the registry notes):
- `residual`: "reference" (default) is the official code's R = G - alpha U U^T G, which keeps (1 - alpha) of
  the in-subspace gradient when alpha != 1; "orthogonal" uses R = G - U U^T G, the orthogonal complement.
- `compensation`: "fira" (default); "fira+" is the RACS/Alice paper's F.7 variant: C rescaled to the
  Frobenius norm of the low-rank update alpha back(N) (= |alpha| ||N||, the projection being orthonormal), then
  multiplied by `alpha_c` (no limiter: the rescaling fixes the norm); "none" is GaLore exactly (the Fig. 5(c)
  no-compensation baseline).
- `gamma` (1.01) is the threshold the reference code hard-codes.
- Everything GaLore has: `refresh_schedule` ("paper" = t == 1 or t mod T == 0 as in Alg. 8; "reference" = the
  official code's 0-based counter, t = 1, T + 1, ...), `proj_type`, `reproject_moments`, `svd_method`.

Differences from the reference code: the limiter divides by psi rather than psi + 1e-8 (`racs.limiter_factor`,
shared with RACS and Alice) and skips when psi = 0 rather than only at the first step; the reference takes
Python maxima of tensors (a device sync per matrix), this one is branch-free. Norms along "the r dimension" is
what the reference's `0 if N.shape[0] < N.shape[1] else 1` selects except for a tall matrix under
`proj_type="reverse_std"` with r = n.

State per matrix: GaLore's float32 projection and moments, plus `limiter_norm` psi (a float32 0-d tensor, kept
in every compensation mode): mn + 2nr + mr (+1) of Table 6, which lists Fira = GaLore and omits the scalar.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from structbench.optim import memory
from structbench.optim.galore import (
    GALORE_DEFAULTS,
    GALORE_FALLBACK_ADAMW,
    SIGN_INVARIANT_CHECK_HPARAMS,
    GaLore,
    LowRankAdam,
    galore_options,
    galore_state_bytes,
)
from structbench.optim.hybrid import build_hybrid
from structbench.optim.norm_scaling import channel_ratio, limiter_norm, validate_gamma
from structbench.optim.partition import route_with_head_switch
from structbench.optim.racs import limiter_factor
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

COMPENSATIONS = ("fira", "fira+", "none")
RESIDUALS = ("reference", "orthogonal")


def _validate_fira(group: Mapping[str, Any]) -> None:
    validate_gamma(group)
    alpha_c = group["alpha_c"]
    if isinstance(alpha_c, bool) or not isinstance(alpha_c, (int, float)) or not math.isfinite(alpha_c) or alpha_c < 0:
        raise ValueError(f"alpha_c must be a finite number >= 0; got {alpha_c!r}")
    if group["compensation"] not in COMPENSATIONS:
        raise ValueError(f"unknown compensation {group['compensation']!r}; valid: {', '.join(COMPENSATIONS)}")
    if group["residual"] not in RESIDUALS:
        raise ValueError(f"unknown residual {group['residual']!r}; valid: {', '.join(RESIDUALS)}")


class Fira(GaLore):
    """Fira-Adam over matrix parameters: GaLore's low-rank Adam plus the limited compensation term."""

    matrices_only = "Fira"

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.02,
        rank: int = 128,
        update_proj_gap: int = 200,
        scale: float = 0.3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        gamma: float = 1.01,
        compensation: str = "fira",
        alpha_c: float = 0.4,
        residual: str = "reference",
        proj_type: str = "std",
        refresh_schedule: str = "paper",
        reproject_moments: bool = False,
        svd_method: str = "exact",
        svd_seed: int = 0,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            rank=rank,
            update_proj_gap=update_proj_gap,
            scale=scale,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            proj_type=proj_type,
            refresh_schedule=refresh_schedule,
            reproject_moments=reproject_moments,
            svd_method=svd_method,
            svd_seed=svd_seed,
            extra_defaults={"gamma": gamma, "compensation": compensation, "alpha_c": alpha_c, "residual": residual},
        )

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        _validate_fira(group)

    def step_group(self, group: dict[str, Any]) -> None:
        low = self.low_rank_adam(group)
        if low is None:
            return
        limiter_norms = [limiter_norm(self.state[param], param.device) for param in low.params]
        extras = None
        if group["compensation"] != "none":
            extras = [self._compensation(group, low, i, psi) for i, psi in enumerate(limiter_norms)]
        self.apply_low_rank_update(group, low, extras)
        self.decay_weights(group, low.params)

    @staticmethod
    def _compensation(group: Mapping[str, Any], low: LowRankAdam, i: int, psi: Tensor) -> Tensor:
        """The full-rank term C of parameter i (limited by its norm psi, or rescaled for Fira+), (m x n) float32."""
        in_span = low.back(i, low.projected[i])
        kept = group["scale"] if group["residual"] == "reference" else 1.0
        residual = low.grads[i] - kept * in_span
        comp = residual * channel_ratio(low.normalized[i], low.projected[i], low.rights[i])
        norm = torch.linalg.matrix_norm(comp)
        if group["compensation"] == "fira+":
            target = abs(group["scale"]) * torch.linalg.matrix_norm(low.normalized[i])
            factor = torch.where(norm > 0, target / torch.where(norm > 0, norm, torch.ones_like(norm)), 0.0)
            return comp * (group["alpha_c"] * factor)
        eta = limiter_factor(norm, psi, group["gamma"])
        psi.copy_(eta * norm)
        return comp * eta


FIRA_DEFAULTS: dict[str, Any] = {
    **GALORE_DEFAULTS,
    "gamma": 1.01,
    "compensation": "fira",
    "alpha_c": 0.4,
    "residual": "reference",
}


def make_fira(params: list[nn.Parameter], hp: Mapping[str, Any]) -> Fira:
    return Fira(
        params,
        **galore_options(hp),
        gamma=hp["gamma"],
        compensation=hp["compensation"],
        alpha_c=hp["alpha_c"],
        residual=hp["residual"],
    )


def _build(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return build_hybrid(named, routing, hp, make_fira)


def fira_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """GaLore's float32 projection and moments + the float32 limiter norm per matrix, + the AdamW fallback."""
    return galore_state_bytes(structured, fallback, hp) + memory.FLOAT32_BYTES * len(structured)


FIRA = register(
    OptimizerEntry(
        name="fira",
        summary="Fira: GaLore plus a norm-scaled full-rank compensation of the residual gradient, norm-limited",
        reference=(
            "Chen et al. 2024 (Fira, arXiv 2410.01623), as the baseline of Gong et al., RACS/Alice paper, Sec. 7.2, "
            "App. E.5, F.1, F.2, F.7 (GaLore = Alg. 8, App. B.11); reference code xichen-fy/Fira "
            "optimizer_torch/fira_adamw.py + gradient_projection.py (136583b)"
        ),
        defaults={**FIRA_DEFAULTS, **GALORE_FALLBACK_ADAMW},
        build=_build,
        route=route_with_head_switch,
        notes=(
            "lr 0.02, scale 0.3, rank 128, update_proj_gap 200: paper Table 7 (60M row; GaLore and Fira share it; "
            "1.3B: lr 0.01, scale 0.25, rank 512). gamma 1.01: paper F.2 (limiter of every method that has one). "
            "Compensation formula: reference code (the paper only says it follows the official repo): per channel "
            "(columns of a left projection, rows of a right one) ||N_c|| / (||sigma_c|| + 1e-8) with norms along r, "
            "times the residual R, limited; update lr_bc (scale back(N) + C). residual 'reference' (default) = the "
            "code's R = G - scale U U^T G; 'orthogonal' = G - U U^T G. compensation 'fira' (default) | 'fira+' "
            "(paper F.7: C rescaled to ||scale back(N)||_F, times alpha_c, no limiter) | 'none' (= GaLore). "
            "alpha_c 0.4 (inference: Alice's alpha_c, Table 11 60M; the paper gives no Fira+ value; used only by "
            "fira+). betas (0.9, 0.999), eps 1e-6 (HF-style, bias corrections in the step size), weight_decay 0 "
            "(after the update, raw lr): reference code (paper silent). Limiter differences from the code: psi "
            "without + 1e-8, skipped while psi = 0. refresh_schedule 'paper' (Alg. 8: t == 1 or t mod T == 0; "
            "the Fira code refreshes at t = 1, T+1, ...: 'reference'); proj_type, reproject_moments, svd_method "
            "as GaLore. head_to_fallback False: the paper's main Fira runs train the LM head with Fira (Table 2 "
            "'Ppl.'); True gives 'Ppl.*'. Fallback AdamW as GaLore's reference code (lr 0.02, betas (0.9, 0.999), "
            "eps 1e-6, no wd). State: float32 projection, moments and limiter norm."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=fira_state_bytes,
        compile_supported=True,
        check_hparams=SIGN_INVARIANT_CHECK_HPARAMS,
    )
)
