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

Reading of Alg. 9 against the reference code (each in the registry notes):
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
    effective_rank,
    galore_options,
    galore_state_bytes,
    low_rank_shapes,
    projects_right,
)
from structbench.optim.hybrid import adamw_state_bytes, build_hybrid
from structbench.optim.norm_scaling import NORM_EPS, channel_ratio, limiter_norm, validate_gamma
from structbench.optim.partition import route_with_head_switch
from structbench.optim.racs import limiter_factor
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

PROJECTIONS = ("random", "svd")
SCALINGS = ("channel", "tensor")
SCALED_GRADIENTS = ("raw", "projected")
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


def _validate_apollo(group: Mapping[str, Any]) -> None:
    choices = {"projection": PROJECTIONS, "scaling": SCALINGS, "scaled_gradient": SCALED_GRADIENTS}
    for key, valid in choices.items():
        if group[key] not in valid:
            raise ValueError(f"unknown {key} {group[key]!r}; valid: {', '.join(valid)}")
    validate_gamma(group)
    if group["scale"] < 0:
        raise ValueError(f"scale must be >= 0 (the update is multiplied by sqrt(scale)); got {group['scale']!r}")
    if not isinstance(group["limiter"], bool):
        raise ValueError(f"limiter must be a bool; got {group['limiter']!r}")
    if isinstance(group["proj_seed"], bool) or not isinstance(group["proj_seed"], int):
        raise ValueError(f"proj_seed must be an int; got {group['proj_seed']!r}")
    if group["projection"] == "random" and group["reproject_moments"]:
        raise ValueError("reproject_moments needs orthonormal bases: use it with projection='svd' only")


class Apollo(GaLore):
    """APOLLO / APOLLO-Mini (Alg. 9) over matrix parameters; see the module docstring."""

    matrices_only = "APOLLO"
    cpu_state_keys = ("seed",)

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.01,
        rank: int = 128,
        update_proj_gap: int = 200,
        scale: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        projection: str = "random",
        scaling: str = "channel",
        scaled_gradient: str = "raw",
        limiter: bool = True,
        gamma: float = 1.01,
        proj_seed: int = 0,
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
            extra_defaults={
                "projection": projection,
                "scaling": scaling,
                "scaled_gradient": scaled_gradient,
                "limiter": limiter,
                "gamma": gamma,
                "proj_seed": proj_seed,
            },
        )

    def check_group(self, group: dict[str, Any]) -> None:
        super().check_group(group)
        _validate_apollo(group)

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


APOLLO_DEFAULTS: dict[str, Any] = {
    **GALORE_DEFAULTS,
    "lr": 0.01,
    "rank": 128,
    "update_proj_gap": 200,
    "scale": 1.0,
    "projection": "svd",
    "scaling": "channel",
    "scaled_gradient": "raw",
    "limiter": True,
    "gamma": 1.01,
    "proj_seed": 0,
    "head_to_fallback": True,
}

APOLLO_MINI_DEFAULTS: dict[str, Any] = {
    **APOLLO_DEFAULTS,
    "rank": 1,
    "scale": 128.0,
    "projection": "random",
    "scaling": "tensor",
}

APOLLO_FALLBACK_ADAMW: dict[str, Any] = {**GALORE_FALLBACK_ADAMW, "adamw_lr": 0.01}
"""The reference code's treatment of the other parameters: the same HF AdamW group, lr 0.01, betas (0.9, 0.999),
eps 1e-6, no wd (torch AdamW here, eps after the bias correction)."""


def make_apollo(params: list[nn.Parameter], hp: Mapping[str, Any]) -> Apollo:
    return Apollo(
        params,
        **galore_options(hp),
        projection=hp["projection"],
        scaling=hp["scaling"],
        scaled_gradient=hp["scaled_gradient"],
        limiter=hp["limiter"],
        gamma=hp["gamma"],
        proj_seed=hp["proj_seed"],
    )


def _build(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return build_hybrid(named, routing, hp, make_apollo)


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
    "its square root (reference code; Alg. 9's alpha = sqrt(scale)). lr 0.01, update_proj_gap 200, betas (0.9, "
    "0.999), eps 1e-6 (HF-style: sqrt(v) + eps, bias corrections in the step size), weight_decay 0 (after the "
    "update, raw lr): reference code (the paper cites Apollo's results and gives no hyperparameters). limiter "
    "True, gamma 1.01: reference code (Fira's limiter; Alg. 9 prints none, the paper's mn + 2n + 2 counts its "
    "scalar; False = Alg. 9 as printed). Limiter differences from the code: psi without + 1e-8, skipped while "
    "psi = 0. projection 'random' = N(0, 1/r) Gaussian, not orthonormalised, regenerated each step from a seed "
    "hashed from (proj_seed, parameter index, refresh step) (Alg. 9 lines 5-6; the code stores the matrix and "
    "advances a per-parameter seed); 'svd' = GaLore's top-r singular vectors (Apollo-svd). refresh_schedule "
    "'paper' (Alg. 9: t == 1 or t mod T == 0; 'reference' = the code's t = 1, T+1, ...). scaled_gradient 'raw' "
    "(default: Alg. 9, reference) | 'projected' (pytorch_optimizer 4.1.0's APOLLO: sigma Diag(s) limited in the "
    "low-rank space, then projected back: a rank-r update; that package also multiplies by scale once more). "
    "Moments are kept across refreshes (reference). Routing (Sec. 7.1 / F.2): attention and MLP matrices to "
    "APOLLO; embeddings, norms, 1-D parameters to AdamW; head_to_fallback True = the LM head on Adam, as in every "
    "Apollo number of the paper. Fallback: torch AdamW with the reference code's settings for non-APOLLO "
    "parameters (same lr 0.01, betas (0.9, 0.999), eps 1e-6, no wd). Conv filters are (out, in*kh*kw) "
    "matrices. State: float32 moments and limiter norm, int32 seed (random) or float32 projection (svd)."
)

APOLLO_SVD = register(
    OptimizerEntry(
        name="apollo-svd",
        summary="Apollo-svd: raw gradient scaled per channel by an SVD-projected low-rank Adam's norm ratios",
        reference=_REFERENCE,
        defaults={**APOLLO_DEFAULTS, **APOLLO_FALLBACK_ADAMW},
        build=_build,
        route=route_with_head_switch,
        notes=(
            "Apollo-svd (paper App. B.12: top-r singular vectors as GaLore, channel-wise scaling; memory = "
            "GaLore's). rank 128: the reference's rank = hidden/4 (LLaMA-60M hidden 512), scale 1: reference "
            "default for channel-wise APOLLO. " + _NOTES
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=apollo_state_bytes,
        compile_supported=True,
        check_hparams=SIGN_INVARIANT_CHECK_HPARAMS,
    )
)

APOLLO_MINI = register(
    OptimizerEntry(
        name="apollo-mini",
        summary="Apollo-mini: raw gradient scaled by one ratio from a rank-1 random-projection Adam (SGD-like memory)",
        reference=_REFERENCE,
        defaults={**APOLLO_MINI_DEFAULTS, **APOLLO_FALLBACK_ADAMW},
        build=_build,
        route=route_with_head_switch,
        notes=(
            "Apollo-mini (paper App. B.12: rank-1 random projection, tensor-wise scaling, memory mn + 2n + 2). "
            "rank 1, scaling 'tensor', scale 128 (a factor sqrt(128)): reference code's APOLLO-Mini settings. " + _NOTES
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=apollo_state_bytes,
        compile_supported=True,
        check_hparams={"update_proj_gap": 2},
    )
)
