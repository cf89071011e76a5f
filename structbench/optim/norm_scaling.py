"""Norm-ratio scaling shared by Fira and APOLLO on top of GaLore's low-rank Adam (`structbench.optim.galore`).

Both scale a full-rank term by how much Adam stretches the projected gradient, channel by channel:
phi_c = ||N_c|| / (||sigma_c|| + 1e-8), N the normalized Adam step and sigma the projected gradient, norms along
the r dimension (Fira's compensation ratio; APOLLO's channel-wise scaling, Alg. 9 line 12 of the RACS/Alice
paper). Both then bound the term's norm growth with the limiter of `racs.limiter_factor`, whose per-matrix norm
psi (`limiter_norm`) is kept here (its threshold gamma is `racs.LIMITER_GAMMA`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from structbench.optim.racs import limiter_factor

NORM_EPS = 1e-8
"""Added to the projected gradient's norms in the ratio (the reference codes' constant)."""


def channel_ratio(normalized: Tensor, projected: Tensor, right: bool) -> Tensor:
    """||N_c|| / (||sigma_c|| + 1e-8) per channel, norms along r: (..., m, 1) if right, else (..., 1, n)."""
    dim = -1 if right else -2
    return normalized.norm(dim=dim, keepdim=True) / (projected.norm(dim=dim, keepdim=True) + NORM_EPS)


def limiter_norm(state: dict[str, Any], device: torch.device) -> Tensor:
    """The limiter's psi of one matrix: a float32 0-d tensor in its state, zero until the first limited step."""
    if "limiter_norm" not in state:
        state["limiter_norm"] = torch.zeros((), dtype=torch.float32, device=device)
    return state["limiter_norm"]


def limit_norm_growth(states: list[dict[str, Any]], norms: Tensor, gamma: float | None) -> Tensor:
    """The limiter's eta of each of k matrices, eta = `racs.limiter_factor`(||C||, psi, gamma) (1 when `gamma` is
    None: no limiter), with each psi <- eta ||C|| stored back in its state; `norms` the (k,) ||C||, eta (k,).

    One launch per operation for the k matrices: their psi are stacked, and written back by one foreach copy."""
    psi = torch.stack([limiter_norm(state, norms.device) for state in states])
    eta = torch.ones_like(norms) if gamma is None else limiter_factor(norms, psi, gamma)
    torch._foreach_copy_([state["limiter_norm"] for state in states], list((eta * norms).unbind(0)))
    return eta
