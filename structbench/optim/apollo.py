"""APOLLO (Apollo-svd) and APOLLO-Mini: the raw gradient scaled by ratios estimated in a low-rank Adam.

Paper: Zhu, Zhang, Cong, Liu, Park, Chandra, Long, Pan, Wang & Lee, "APOLLO: SGD-like Memory, AdamW-level
Performance" (arXiv 2412.05270) — not the 2020 quasi-Newton "Apollo" (pytorch_optimizer's ApolloDQN). The
algorithm box implemented is Algorithm 9 (App. B.12) of Gong, Scetbon, Ma & Meeds, "Towards Efficient Optimizer
Design for LLM via Structured Fisher Approximation with a Low-Rank Extension" (the RACS/Alice paper), whose
Apollo-mini and Apollo-svd baselines are cited from Zhu et al. and run by the reference code
zhuhanqing/APOLLO (`apollo_torch/apollo.py`, `random_projector.py`; CC BY-NC 4.0, read for its semantics
only). Per matrix W (m x n; conv filters as (out, in*kh*kw)), the projected side chosen as in GaLore:

    if t == 1 or t mod T == 0:                                                       (Alg. 9 line 4)
        U ~ N(0, 1/r) (m x r, or r x n on the right side), from a new seed               (lines 5-6)
        -- or, Apollo-svd: the top-r singular vectors of G, as GaLore
    sigma = U^T G (r x n) or G V (m x r)                                             (line 10)
    m = b1 m + (1 - b1) sigma;  v = b2 v + (1 - b2) sigma^2;  N = m / (sqrt(v) + eps)  (line 11, HF-style)
    s_c = ||N_c|| / (||sigma_c|| + 1e-8)  per channel c (norms along r: columns of a left projection, rows of
          a right one);  tensor-wise (APOLLO-Mini): s = ||N||_F / (||sigma||_F + 1e-8)    (line 12)
    G~ = G Diag(s)  (columns; Diag(s) G for rows) -- the FULL-RANK raw gradient is scaled  (line 13)
    eta = gamma / max(||G~||_F / psi, gamma) if psi > 0 else 1;  psi <- eta ||G~||_F   (norm-growth limiter)
    W <- W - lr sqrt(1 - b2^t) / (1 - b1^t) sqrt(scale) eta G~                        (line 13, descent sign)
    W <- W - lr wd W                                                      (decoupled, after the update)

Reading of Alg. 9 against the reference code (each in the registry notes or a declared source):
- Alg. 9 multiplies by a "scale alpha"; the reference multiplies by sqrt(`scale`) (APOLLO-Mini's scale 128
  is a factor sqrt(128) = 11.3). `scale` keeps the reference's meaning: alpha = sqrt(scale).
- Alg. 9 prints no limiter; the reference code applies Fira's norm-growth limiter (gamma 1.01) to G~, and the
  paper's memory count for Apollo-mini, mn + 2n + 2, holds two scalars besides the rank-1 moments: the seed
  and the limiter's norm. `limiter=True` is the default; False is Alg. 9 as printed (psi is still tracked).
- Adam's bias corrections multiply the whole step (HF-style, as the reference): s is computed from the
  uncorrected N. The ratio adds the reference's 1e-8 to the denominator (Alg. 9 prints none).
- The random projection is regenerated every step from a stored seed (the paper's "seed <- an independent new
  random seed" and its mn + 2n + 2 count); the reference stores the matrix instead (its comment calls this a
  lazy implementation). The seed of a refresh is derived from (`proj_seed`, the parameter's index in the
  optimizer, the step), so reruns and state_dict resumes draw the same projections. U is Gaussian and not
  orthonormalised, as in Alg. 9 and the reference.
- Refresh schedule "paper" (Alg. 9 line 4); "reference" is the code's 0-based counter (t = 1, T + 1, ...).
- `scaled_gradient="raw"` is Alg. 9 and the reference (a full-rank update); "projected" is pytorch_optimizer's
  APOLLO (4.1.0): sigma Diag(s) is limited in the low-rank space and projected back, U (sigma Diag(s)), a
  rank-r update — a different algorithm, offered for comparison only. (pytorch_optimizer also multiplies the
  projected-back update by `scale` once more, i.e. scale^1.5 in all; here the factor is sqrt(scale) in both
  modes.)

State per matrix (float32 unless said): `exp_avg`, `exp_avg_sq` (r x n or m x r), `limiter_norm` psi (0-d), and
`seed` (a 0-d int32 CPU tensor, random projection) or `projection` (SVD, as GaLore). Apollo-mini (rank 1):
2n + 2 elements (Table 3 / App. B.12: mn + 2n + 2); Apollo-svd: 2nr + mr + 1 (GaLore's count + psi).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from structbench.optim import memory
from structbench.optim.galore import (
    SIGN_INVARIANT_CHECK_HPARAMS,
    GaLore,
    effective_rank,
    galore_state_bytes,
    low_rank_shapes,
    projects_right,
)
from structbench.optim.hparams import Declaration, code, flag, integer, option, ours, paper
from structbench.optim.hybrid import adamw_fallback, adamw_state_bytes, hybrid_builder
from structbench.optim.norm_scaling import NORM_EPS, channel_ratio, limiter_norm
from structbench.optim.partition import head_switch, route_with_head_switch
from structbench.optim.racs import LIMITER_GAMMA, limiter_factor
from structbench.optim.racs import PAPER as RACS_ALICE_PAPER
from structbench.optim.registry import OptimizerEntry, register

PROJECTIONS = ("random", "svd")
SCALINGS = ("channel", "tensor")
SCALED_GRADIENTS = ("raw", "projected")
REFERENCE = "zhuhanqing/APOLLO apollo_torch/apollo.py"
SEED_BYTES = 4
"""The stored projection seed is a 0-d int32 tensor."""


def projection_seed(base: int, index: int, step: int) -> int:
    """The seed of the random projection drawn at 1-based `step` for parameter `index`: a 31-bit hash."""
    digest = hashlib.blake2b(f"{base}:{index}:{step}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def random_projection(
    shape: tuple[int, int], rank: int, right: bool, seed: int, device: torch.device | str = "cpu"
) -> Tensor:
    """Alg. 9 line 5: i.i.d. N(0, 1/r) entries, U (m x r) for the left side or V^T (r x n) for the right."""
    rows, cols = shape
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    size = (rank, cols) if right else (rows, rank)
    return torch.randn(size, generator=generator, device=device, dtype=torch.float32) / math.sqrt(rank)


def scaling_factor(normalized: Tensor, projected: Tensor, right: bool, scaling: str) -> Tensor:
    """Alg. 9 line 12: ||N_c|| / (||sigma_c|| + 1e-8) per channel ((m, 1) if right, else (1, n)), or tensor-wise."""
    if scaling == "tensor":
        return torch.linalg.matrix_norm(normalized) / (torch.linalg.matrix_norm(projected) + NORM_EPS)
    return channel_ratio(normalized, projected, right)


class Apollo(GaLore):
    """APOLLO / APOLLO-Mini (Alg. 9) over matrix parameters; see the module docstring."""

    matrices_only = "APOLLO"
    cpu_state_keys = ("seed",)

    hparams = GaLore.hparams.with_defaults(
        lr=(0.01, code(f"{REFERENCE}; the paper cites APOLLO's results and gives no hyperparameters")),
        rank=(128, code(f"{REFERENCE}: rank = hidden / 4, LLaMA-60M's hidden size 512")),
        update_proj_gap=(200, code(REFERENCE)),
        scale=(1.0, code(f"{REFERENCE}, channel-wise APOLLO; the update is multiplied by sqrt(scale)")),
        beta1=(0.9, code(REFERENCE)),
        beta2=(0.999, code(REFERENCE)),
        eps=(1e-6, code(f"{REFERENCE}: added to sqrt(v), bias corrections in the step size")),
        weight_decay=(0.0, code(f"{REFERENCE}: after the update, with the raw lr")),
    ) + Declaration(
        option("projection", "svd", PROJECTIONS, paper(f"{RACS_ALICE_PAPER} App. B.12: Apollo-svd, GaLore's SVD")),
        option("scaling", "channel", SCALINGS, paper(f"{RACS_ALICE_PAPER} Alg. 9 line 12: channel-wise")),
        option("scaled_gradient", "raw", SCALED_GRADIENTS, paper(f"{RACS_ALICE_PAPER} Alg. 9 line 13: the raw G")),
        flag("limiter", True, code(f"{REFERENCE}: Fira's limiter (Alg. 9 prints none; its mn + 2n + 2 counts psi)")),
        LIMITER_GAMMA,
        integer("proj_seed", 0, ours("seeds the random projections, with the parameter index and the step")),
    )

    def check_group(self, group: dict[str, Any]) -> None:
        if group["projection"] == "random" and group["reproject_moments"]:
            raise ValueError("reproject_moments needs orthonormal bases: use it with projection='svd' only")

    def step_group(self, group: dict[str, Any]) -> None:
        low = self.low_rank_adam(group)
        if low is None:
            return
        multiplier = math.sqrt(group["scale"])
        raw = group["scaled_gradient"] == "raw"
        for i, param in enumerate(low.params):
            psi = limiter_norm(self.state[param], param.device)
            factor = scaling_factor(low.normalized[i], low.projected[i], low.rights[i], group["scaling"])
            scaled = (low.grads[i] if raw else low.projected[i]) * factor
            norm = torch.linalg.matrix_norm(scaled)
            eta = limiter_factor(norm, psi, group["gamma"]) if group["limiter"] else torch.ones_like(norm)
            psi.copy_(eta * norm)
            update = scaled if raw else low.back(i, scaled)
            param.add_((update * (eta * (-low.step_sizes[i] * multiplier))).reshape(param.shape))
        self.decay_weights(group, low.params)

    def _projections(self, group: Mapping[str, Any], params: list[nn.Parameter], grads: list[Tensor]) -> list[Tensor]:
        if group["projection"] == "svd":
            return super()._projections(group, params, grads)
        return [
            random_projection(
                tuple(g.shape),
                effective_rank(group["rank"], tuple(g.shape)),
                projects_right(tuple(g.shape), group["proj_type"]),
                int(self.state[p]["seed"]),
                g.device,
            )
            for p, g in zip(params, grads, strict=True)
        ]

    def _refresh(self, group: dict[str, Any], params: list[nn.Parameter], grads: list[Tensor]) -> None:
        """SVD: GaLore's refresh. Random: a new seed (Alg. 9 line 6); moments are kept, as the reference does."""
        if group["projection"] == "svd":
            super()._refresh(group, params, grads)
            return
        index = {id(p): i for i, p in enumerate(q for g in self.param_groups for q in g["params"])}
        for param, grad in zip(params, grads, strict=True):
            state = self.state[param]
            if "exp_avg" not in state:
                shape = tuple(grad.shape)
                rank = effective_rank(group["rank"], shape)
                projected_shape = (shape[0], rank) if projects_right(shape, group["proj_type"]) else (rank, shape[1])
                self._start_moments(state, projected_shape, grad.device)
            seed = projection_seed(group["proj_seed"], index[id(param)], state["step"] + 1)
            state["seed"] = torch.tensor(seed, dtype=torch.int32)


def apollo_state_bytes(
    structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]
) -> int:
    """float32 moments + limiter norm, and the SVD projection (float32) or the seed (int32), + the AdamW fallback."""
    limiter_bytes = memory.FLOAT32_BYTES * len(structured)
    if hp["projection"] == "svd":
        return galore_state_bytes(structured, fallback, hp) + limiter_bytes
    total = 0
    for shape in structured:
        _, moments_shape = low_rank_shapes(shape, hp)
        total += memory.FLOAT32_BYTES * 2 * math.prod(moments_shape) + SEED_BYTES
    return total + limiter_bytes + adamw_state_bytes(fallback)


_REFERENCE = (
    "Zhu et al. 2024 (APOLLO: SGD-like Memory, AdamW-level Performance, arXiv 2412.05270); algorithm box: "
    "Gong et al., RACS/Alice paper, Alg. 9 (App. B.12), memory Table 3 / App. E.5; reference code "
    "zhuhanqing/APOLLO apollo_torch/apollo.py + random_projector.py (CC BY-NC, semantics only)"
)

_NOTES = (
    "update W -= lr_bc sqrt(scale) eta G Diag(s): the full-rank raw gradient scaled per channel (s_c = "
    "||N_c|| / (||sigma_c|| + 1e-8), norms along r) or per tensor (Alg. 9; reference code). scale multiplies by "
    "its square root (reference code; Alg. 9's alpha = sqrt(scale)). limiter False = Alg. 9 as printed. Limiter "
    "differences from the code: psi without + 1e-8, skipped while psi = 0. projection 'random' = N(0, 1/r) "
    "Gaussian, not orthonormalised, regenerated each step from a seed hashed from (proj_seed, parameter index, "
    "refresh step) (Alg. 9 lines 5-6; the code stores the matrix and advances a per-parameter seed); 'svd' = "
    "GaLore's top-r singular vectors (Apollo-svd). refresh_schedule 'reference' = the code's t = 1, T+1, .... "
    "scaled_gradient 'projected' = pytorch_optimizer 4.1.0's APOLLO: sigma Diag(s) limited in the low-rank space, "
    "then projected back: a rank-r update (that package also multiplies by scale once more). Moments are kept "
    "across refreshes (reference). Routing (Sec. 7.1 / F.2): attention and MLP matrices to APOLLO; embeddings, "
    "norms, 1-D parameters (and the LM head, head_to_fallback) to AdamW with the reference code's settings for "
    "non-APOLLO parameters. Conv filters are (out, in*kh*kw) matrices. State: float32 moments and limiter norm, "
    "int32 seed (random) or float32 projection (svd)."
)

APOLLO_FALLBACK = adamw_fallback(
    code(f"{REFERENCE}: the other parameters in the APOLLO group's AdamW, lr included"),
    lr=0.01,
    beta1=0.9,
    beta2=0.999,
    eps=1e-6,
    weight_decay=0.0,
)

HEAD_SWITCH = head_switch(True, paper(f"{RACS_ALICE_PAPER} Sec. 7.1, F.2: every Apollo number has the LM head on Adam"))

APOLLO_SVD = register(
    OptimizerEntry(
        name="apollo-svd",
        refresh_interval="update_proj_gap",
        summary="Apollo-svd: raw gradient scaled per channel by an SVD-projected low-rank Adam's norm ratios",
        reference=_REFERENCE,
        hparams=Apollo.hparams + HEAD_SWITCH + APOLLO_FALLBACK,
        build=hybrid_builder(Apollo),
        route=route_with_head_switch,
        notes="Apollo-svd (paper App. B.12: top-r singular vectors as GaLore; memory = GaLore's). " + _NOTES,
        lr_keys=("lr", "adamw_lr"),
        state_bytes=apollo_state_bytes,
        compile_supported=True,
        check_hparams=SIGN_INVARIANT_CHECK_HPARAMS,
    )
)

APOLLO_MINI = register(
    OptimizerEntry(
        name="apollo-mini",
        refresh_interval="update_proj_gap",
        summary="Apollo-mini: raw gradient scaled by one ratio from a rank-1 random-projection Adam (SGD-like memory)",
        reference=_REFERENCE,
        hparams=(
            Apollo.hparams.with_defaults(
                rank=(1, code(f"{REFERENCE}, APOLLO-Mini")),
                scale=(128.0, code(f"{REFERENCE}, APOLLO-Mini: a factor sqrt(128)")),
                projection=("random", paper(f"{RACS_ALICE_PAPER} App. B.12: Apollo-mini's rank-1 random projection")),
                scaling=("tensor", paper(f"{RACS_ALICE_PAPER} App. B.12: Apollo-mini's tensor-wise scaling")),
            )
            + HEAD_SWITCH
            + APOLLO_FALLBACK
        ),
        build=hybrid_builder(Apollo),
        route=route_with_head_switch,
        notes="Apollo-mini (paper App. B.12: memory mn + 2n + 2). " + _NOTES,
        lr_keys=("lr", "adamw_lr"),
        state_bytes=apollo_state_bytes,
        compile_supported=True,
        check_hparams={"update_proj_gap": 2},
    )
)
