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
        -- or, Apollo-svd: the top-r singular vectors of G, as GaLore (`GaLore._bases`)
    sigma = U^T G (r x n) or G V (m x r)                                             (line 10)
    m = b1 m + (1 - b1) sigma;  v = b2 v + (1 - b2) sigma^2;  N = m / (sqrt(v) + eps)  (line 11, HF-style)
    s_c = ||N_c|| / (||sigma_c|| + 1e-8)  per channel c (norms along r: columns of a left projection, rows of
          a right one);  tensor-wise (APOLLO-Mini): s = ||N||_F / (||sigma||_F + 1e-8)    (line 12)
    G~ = G Diag(s)  (columns; Diag(s) G for rows) -- the FULL-RANK raw gradient is scaled  (line 13)
    eta = gamma / max(||G~||_F / psi, gamma) if psi > 0 else 1;  psi <- eta ||G~||_F   (norm-growth limiter)
    W <- W - lr sqrt(1 - b2^t) / (1 - b1^t) sqrt(scale) eta G~                        (line 13, descent sign)
    W <- W - lr wd W                                                      (decoupled, after the update)

The step runs per bucket of same-shape matrices (`galore.LowRankBucket`): the ratios, norms and limiter of all its
matrices in one launch each, each matrix with its own s and psi, the per-matrix arithmetic but for one rounding:
eta G~ is rounded before the step size multiplies it (`galore.add_stacked`), where the per-matrix step rounded
eta times the step size first (a float32 ulp of the update apart).

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
  orthonormalised, as in Alg. 9 and the reference. The draw is Alg. 9's at a refresh (lines 5-6); the steps in
  between redraw the same U from the same seed, which is what keeps the state at the paper's count. Each step's
  draws go into one stack per bucket of same-shape matrices from one generator per device, re-seeded with each
  matrix's seed (`random_projections`): one `normal_` launch per matrix, no generator made per matrix, and the
  values of a matrix's U are those of its own seed whatever the other matrices of its bucket. (One draw for a
  whole bucket from per-matrix seeds would need a counter-based generator written out of elementwise integer
  operations: a score of launches per bucket, more than the one per matrix at GPT-2's buckets of 12 and 24, and
  a different stream from torch's.)
- Refresh schedule "paper" (Alg. 9 line 4); "reference" is the code's 0-based counter (t = 1, T + 1, ...).
- Apollo-svd's SVD is GaLore's, of the gradient itself as the reference's `svd_projector.py` (line 128) takes it, so
  the singular vectors' signs are the reference's on every shape: the moments are carried unchanged across a
  refresh, and opposite signs would add the old momentum of a direction with the opposite sign. The random
  projection's seeds are ours (the reference chains torch.randint draws from the parameter's index), so Apollo-mini
  agrees with the reference given the same draws (tests/optim/test_apollo_authors_code.py), not draw for draw.
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
from structbench.optim.base import eager
from structbench.optim.galore import (
    SIGN_INVARIANT_CHECK_HPARAMS,
    GaLore,
    LowRankBucket,
    add_stacked,
    effective_rank,
    galore_state_bytes,
    low_rank_shapes,
    projects_right,
)
from structbench.optim.hparams import Declaration, code, flag, integer, option, ours, paper
from structbench.optim.hybrid import adamw_fallback, adamw_state_bytes, hybrid_builder
from structbench.optim.norm_scaling import NORM_EPS, channel_ratio, limit_norm_growth
from structbench.optim.partition import head_switch, route_with_head_switch
from structbench.optim.racs import LIMITER_GAMMA
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


def random_projections(
    shape: tuple[int, int], rank: int, right: bool, seeds: list[int], generator: torch.Generator
) -> Tensor:
    """Alg. 9 line 5 for k same-shape matrices: i.i.d. N(0, 1/r) entries, a (k, r, n) stack of V^T for the right
    side or (k, m, r) of U for the left, one per seed, on the generator's device.

    Each draw is its seed's own: the generator is re-seeded before it, so the projection of a matrix does not depend
    on the other seeds of the stack; it is torch.randn of that size from a generator seeded with it, divided by
    sqrt(r), bit for bit (one `normal_` per matrix into its slice of the stack, one division for the stack)."""
    rows, cols = shape
    size = (rank, cols) if right else (rows, rank)
    stacked = torch.empty((len(seeds), *size), dtype=torch.float32, device=generator.device)
    for draw, seed in zip(stacked.unbind(0), seeds, strict=True):
        generator.manual_seed(seed)
        draw.normal_(generator=generator)
    return stacked.div_(math.sqrt(rank))


def random_projection(
    shape: tuple[int, int], rank: int, right: bool, seed: int, device: torch.device | str = "cpu"
) -> Tensor:
    """Alg. 9 line 5 for one matrix: `random_projections` of the one seed, U (m x r) or V^T (r x n)."""
    return random_projections(shape, rank, right, [seed], torch.Generator(device=device))[0]


def scaling_factor(normalized: Tensor, projected: Tensor, right: bool, scaling: str) -> Tensor:
    """Alg. 9 line 12 for a (k, ...) stack: ||N_c|| / (||sigma_c|| + 1e-8) per channel ((k, m, 1) if right, else
    (k, 1, n)), or tensor-wise ((k, 1, 1))."""
    if scaling == "tensor":
        n_norm = torch.linalg.matrix_norm(normalized, keepdim=True)
        return n_norm / (torch.linalg.matrix_norm(projected, keepdim=True) + NORM_EPS)
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

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], **hparams: Any) -> None:
        super().__init__(params, **hparams)
        self._generators: dict[torch.device, torch.Generator] = {}
        """One generator per device for the random projections, re-seeded for each matrix's draw."""

    def step_group(self, group: dict[str, Any]) -> None:
        buckets = self.low_rank_adam(group)
        for bucket in buckets:
            self._scaled_step(group, bucket)
        self.decay_weights(group, [param for bucket in buckets for param in bucket.params])

    def _scaled_step(self, group: Mapping[str, Any], bucket: LowRankBucket) -> None:
        """Alg. 9 lines 12-13 for a bucket: G~ = G Diag(s) limited per matrix, W <- W - lr_bc sqrt(scale) eta G~."""
        raw = group["scaled_gradient"] == "raw"
        factor = scaling_factor(bucket.normalized, bucket.projected, bucket.right, group["scaling"])
        scaled = (bucket.grads if raw else bucket.projected) * factor
        states = [self.state[param] for param in bucket.params]
        gamma = group["gamma"] if group["limiter"] else None
        eta = limit_norm_growth(states, torch.linalg.matrix_norm(scaled), gamma)
        update = (scaled if raw else bucket.back(scaled)) * eta[:, None, None]
        multiplier = math.sqrt(group["scale"])
        add_stacked(bucket.params, update, [-size * multiplier for size in bucket.step_sizes])

    def _projections(self, group: Mapping[str, Any], params: list[nn.Parameter], grads: Tensor) -> Tensor:
        if group["projection"] == "svd":
            return super()._projections(group, params, grads)
        shape = (grads.size(1), grads.size(2))
        seeds = [int(self.state[p]["seed"]) for p in params]
        rank = effective_rank(group["rank"], shape)
        right = projects_right(shape, group["proj_type"])
        if grads.device not in self._generators:
            self._generators[grads.device] = torch.Generator(device=grads.device)
        return eager(random_projections, shape, rank, right, seeds, self._generators[grads.device])

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
            state["seed"] = torch.tensor(seed, dtype=torch.int32, device="cpu")


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
