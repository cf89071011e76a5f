"""GaLore: Adam on a low-rank projection of each matrix gradient, refreshed by SVD every T steps.

Paper: Zhao, Zhang, Chen, Wang, Anandkumar & Tian, "GaLore: Memory-Efficient LLM Training by Gradient
Low-Rank Projection" (ICML 2024). The algorithm box implemented here is Algorithm 8 (App. B.11) of Gong,
Scetbon, Ma & Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation with a
Low-Rank Extension" (the RACS/Alice paper, whose GaLore baseline ran the official package), with the
conventions of the reference code jiaweizzhao/GaLore (`galore_torch/adamw.py`, `galore_projector.py`,
proj_type "std"):

    for t = 1, 2, ...                       (per matrix W, m x n; a conv filter as (out, in*kh*kw))
        G_t = gradient of W
        if t == 1 or t mod T == 0:  U_r, V_r = top-r singular vectors of G_t   (SVD of the current gradient)
        sigma_t = G_t V_r (m >= n, m x r)      or      U_r^T G_t (m < n, r x n)
        m_t = b1 m_{t-1} + (1 - b1) sigma_t          v_t = b2 v_{t-1} + (1 - b2) sigma_t^2
        W  <- W - lr * sqrt(1 - b2^t) / (1 - b1^t) * alpha * back(m_t / (sqrt(v_t) + eps))
        W  <- W - lr * wd * W                                            (decoupled, after the update)

back(N) = N V_r^T (m >= n) or U_r N (m < n). Adam is the reference's HF-style AdamW: eps added to sqrt(v)
and the bias corrections folded into the step size (`galore_torch/adamw.py`); the Adam step counter
is per parameter, as in the reference. Weight decay uses the raw lr and is applied after the update (the
reference's order), only to parameters that received a gradient.

Choices and switches (every one declared in `GaLore.hparams` with its source, or in the registry notes):
- `refresh_schedule="paper"` refreshes at t = 1 and every multiple of T (Alg. 8, and pytorch_optimizer);
  "reference" refreshes at t = 1, T + 1, 2T + 1, ... as the official code does (0-based counter).
- `reproject_moments=False` is the reference: the Adam moments are kept unchanged when the subspace moves
  (GaLore issue #54; the RACS/Alice paper's Alice, Alg. 4, does not re-project either). True carries them
  into the new basis with R, the (r x r) overlap of the new basis with the old one (R = U_new^T U_old on the
  left side, m <- R m; R = V_old^T V_new on the right side, m <- m R). The first moment is linear, so this
  is exact for the part of the old subspace the new one keeps. The second moment becomes v <- (R o R) v
  (R squared elementwise; v R o R on the right side): the diagonal of R diag(v) R^T, i.e. the new-basis
  second moments if the old coordinates are uncorrelated — the diagonal model Adam itself assumes, and the
  optimal diagonal D* = Diag(E[(U^T G)^2]) of the RACS/Alice paper's Thm 3.2 (ii) for the new basis when
  E[g g^T] is that old diagonal model. It keeps v >= 0 and is exact when the new basis permutes or flips
  the old one. With it the update no longer depends on the arbitrary signs of the singular vectors; without
  it (reference) a sign flip at a refresh reverses the carried-over momentum of that direction.
- `proj_type="std"` projects the smaller side (reference default); "reverse_std" the larger one.
- `svd_method="exact"` is the reference's full SVD; "randomized" is linalg's Halko–Martinsson–Tropp
  truncated SVD, seeded from `svd_seed` and the step (deterministic, no RNG state to store).
- The rank is capped at min(m, n), as the reference's slicing `Vh[:rank]` does silently; at the cap the
  projection is a full orthogonal basis of the projected side, so the update is Adam in that rotated basis.

Numerics: projections, projected gradients and both moments are float32 whatever the parameter dtype
(bfloat16 parameters receive the float32 update rounded once). Each step runs per bucket of same-shape matrices
(`LowRankBucket`), not per matrix, so that its kernel launches do not grow with the number of matrices (a GPU's
fixed cost per launch): the bucket's gradients and projections are stacked (two copies), projected and mapped back
by one batched product each, the moments of all matrices advance by `torch._foreach_*` ops, and the update is added
to the parameters by one foreach add per distinct step size. The arithmetic is the per-matrix one, with the same
roundings except that the update is a product rounded then added to W (`add_stacked`), where an unbatched addmm
could fuse the two. Same-shape matrices refreshed at the same step share one batched SVD call. The SVD is taken as
the reference's projector takes it (`galore_projector.py` lines 76-93: torch.linalg.svd of the float32 gradient
itself, then U[:, :r] or Vh[:r]), so the singular vectors' signs are the reference's on every shape: with
`reproject_moments=False` the moments are carried unchanged across a refresh, and a basis vector of the opposite
sign would add that direction's old momentum with the opposite sign (decomposing a wide gradient through G^T, as
this module once did, put the weights 0.24 to 0.79 of the update's size away from the reference's within 12 steps:
tests/optim/test_galore_authors_code.py). Only with `reproject_moments=True`,
where the update does not depend on the signs, is a wide gradient decomposed through its transpose (same subspaces,
faster in LAPACK on CPU). A failed SVD keeps
the previous projection and counts the event in `solver_failures`; the SVD is retried at the next step and the
third consecutive failure for one matrix
raises `SolverError`. A matrix whose very first SVD fails takes no step (it has no projection yet).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from structbench.errors import SolverError
from structbench.optim import linalg, memory
from structbench.optim.base import StructuredOptimizer
from structbench.optim.hf_adamw import advance_moments
from structbench.optim.hparams import Declaration, code, decade_around, flag, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import adamw_fallback, adamw_state_bytes, hybrid_builder
from structbench.optim.partition import head_switch, matrix_shape, matrix_view, route_with_head_switch
from structbench.optim.racs import PAPER as RACS_ALICE_PAPER
from structbench.optim.registry import OptimizerEntry, register

PROJ_TYPES = ("std", "reverse_std")
REFRESH_SCHEDULES = ("paper", "reference")
REFERENCE = "jiaweizzhao/GaLore galore_torch/adamw.py"


def projects_right(shape: tuple[int, int], proj_type: str) -> bool:
    """True when the projection acts on the columns (G V_r, m x r); False for U_r^T G (r x n)."""
    rows, cols = shape
    return (rows >= cols) == (proj_type == "std")


def effective_rank(rank: int, shape: tuple[int, int]) -> int:
    """The rank actually used: `rank` capped at min(m, n)."""
    return min(rank, *shape)


def low_rank_shapes(shape: tuple[int, ...], settings: Mapping[str, Any]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(projection, moments) shapes of a parameter under `settings`' rank and proj_type (a param group or hparams).

    Right side: V_r^T (r x n) and m x r moments; left side: U_r (m x r) and r x n moments. A conv filter counts as
    (out, in*kh*kw).
    """
    rows, cols = matrix_shape(shape)
    rank = effective_rank(settings["rank"], (rows, cols))
    if projects_right((rows, cols), settings["proj_type"]):
        return (rank, cols), (rows, rank)
    return (rows, rank), (rank, cols)


def refresh_due(step: int, gap: int, schedule: str) -> bool:
    """Whether the projection is recomputed at 1-based step `step`."""
    if schedule == "paper":
        return step == 1 or step % gap == 0
    return (step - 1) % gap == 0


@dataclass
class LowRankBucket:
    """One step's low-rank Adam (Alg. 8 up to Delta) for the same-shape matrices of a group, stacked along dim 0.

    k matrices of one (m x n) shape, gradient dtype and device, each with a projection; the tensors below are
    (k, ...) stacks in the order of `params`."""

    params: list[nn.Parameter]
    grads: Tensor
    """float32 (k, m, n) gradients (conv filters as (out, in*kh*kw))."""
    projections: Tensor
    """V_r^T (k, r, n) on the right side, U_r (k, m, r) on the left."""
    right: bool
    projected: Tensor
    """sigma = G V_r (k, m, r) on the right side, U_r^T G (k, r, n) on the left."""
    normalized: Tensor
    """N = m_t / (sqrt(v_t) + eps), sigma's shape, before the bias corrections."""
    step_sizes: list[float]
    """lr * sqrt(1 - b2^t) / (1 - b1^t) per matrix: the HF-style bias corrections folded into the step size."""

    def factors(self, low: Tensor) -> tuple[Tensor, Tensor]:
        """(left, right) with left @ right = back(low): low V_r^T on the right side, U_r low on the left."""
        return (low, self.projections) if self.right else (self.projections, low)

    def back(self, low: Tensor) -> Tensor:
        """A (k, ...) stack of projected-shape tensors mapped back to (k, m, n), one batched product."""
        left, right = self.factors(low)
        return torch.bmm(left, right)


def same_shape_buckets(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """`params` (each with a gradient) split by matrix shape, gradient dtype and device, in first-appearance order."""
    buckets: dict[tuple[tuple[int, int], torch.dtype, torch.device], list[nn.Parameter]] = defaultdict(list)
    for param in params:
        buckets[(matrix_shape(param.shape), param.grad.dtype, param.grad.device)].append(param)
    return list(buckets.values())


def add_stacked(params: list[nn.Parameter], updates: Tensor, coefficients: list[float]) -> None:
    """params[i] += coefficients[i] * updates[i], for a (k, m, n) stack of float32 updates and parameters of any
    shape and dtype (each update computed in float32 and rounded once into the parameter): one foreach add per
    distinct coefficient (one in all when the matrices share their step count)."""
    by_coefficient: dict[float, list[int]] = defaultdict(list)
    for i, coefficient in enumerate(coefficients):
        by_coefficient[coefficient].append(i)
    rows = updates.unbind(0)
    for coefficient, members in by_coefficient.items():
        targets = [params[i] for i in members]
        torch._foreach_add_(targets, [rows[i].reshape(params[i].shape) for i in members], alpha=coefficient)


def transposes_wide_gradients(stacked: Tensor, group: Mapping[str, Any]) -> bool:
    """Whether a (k, m, n) stack of gradients is decomposed through its transpose: only a wide one (m < n), and only
    when the moments are re-projected at a refresh (the update then does not depend on the singular vectors' signs,
    and LAPACK's gesdd is faster on the tall orientation on CPU). Otherwise the stack is decomposed as it is, as the
    reference's projector does, so that the moments carried across a refresh keep the reference's signs."""
    return group["reproject_moments"] and stacked.size(-2) < stacked.size(-1)


def _svd_failure(shape: tuple[int, ...], streak: int) -> str:
    return f"GaLore: the SVD of a {shape[0]}x{shape[1]} gradient failed {streak} times in a row"


class GaLore(StructuredOptimizer):
    """GaLore-Adam over matrix parameters (2-D, or conv filters seen as (out, in*kh*kw)).

    State per parameter (all tensors float32): `projection` (r x n for the right side, m x r for the
    left), `exp_avg` and `exp_avg_sq` of the projected shape (m x r or r x n); plus the Python ints
    `step` (Adam steps taken) and `svd_failures` (consecutive failed refreshes).

    Fira and APOLLO build on it: `low_rank_adam` is the projection and projected Adam they share (per bucket of
    same-shape matrices, `LowRankBucket`), and their declarations extend `GaLore.hparams`.
    """

    matrices_only = "GaLore"

    hparams = Declaration(
        real("lr", 0.02, paper(f"{RACS_ALICE_PAPER} Table 7, 60M (1.3B: 0.01)"), "(0, inf)", decade_around()),
        integer("rank", 128, paper(f"{RACS_ALICE_PAPER} Table 7, 60M (1.3B: 512)"), "[1, inf)"),
        integer("update_proj_gap", 200, paper(f"{RACS_ALICE_PAPER} Table 7, T"), "[1, inf)"),
        real("scale", 0.3, paper(f"{RACS_ALICE_PAPER} Table 7, 60M (1.3B: 0.25)"), "(0, inf)"),
        real("beta1", 0.9, code(f"{REFERENCE}; the paper states none"), "[0, 1)", lin(0.85, 0.95)),
        real("beta2", 0.999, code(f"{REFERENCE}; the paper states none"), "[0, 1)"),
        real("eps", 1e-6, code(f"{REFERENCE}: added to sqrt(v), bias corrections in the step size"), "[0, inf)"),
        real("weight_decay", 0.0, code(f"{REFERENCE}: after the update, with the raw lr"), "[0, inf)"),
        option("proj_type", "std", PROJ_TYPES, code(f"{REFERENCE} + galore_projector.py: the smaller side")),
        option(
            "refresh_schedule",
            "paper",
            REFRESH_SCHEDULES,
            paper(f"{RACS_ALICE_PAPER} Alg. 8: t == 1 or t mod T == 0 ('reference': the code's t = 1, T+1, ...)"),
        ),
        flag("reproject_moments", False, code(f"{REFERENCE}: moments kept when the subspace moves")),
        option("svd_method", "exact", linalg.TRUNCATED_SVD_METHODS, code(f"{REFERENCE}: a full SVD")),
        integer("svd_seed", 0, ours("seeds the randomized SVD, with the step")),
    )

    def step_group(self, group: dict[str, Any]) -> None:
        buckets = self.low_rank_adam(group)
        for bucket in buckets:
            self.apply_low_rank_update(group, bucket)
        self.decay_weights(group, [param for bucket in buckets for param in bucket.params])

    def low_rank_adam(self, group: dict[str, Any]) -> list[LowRankBucket]:
        """Refresh due projections, project the gradients and advance the Adam moments (Alg. 8 up to Delta).

        One bucket per matrix shape (and gradient dtype and device) among the parameters that have both a gradient
        and a projection; none when no parameter has both.
        """
        live = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse for p in live):
            raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
        due = [p for p in live if self._refresh_due(group, self.state[p])]
        if due:
            self._refresh(group, due, [matrix_view(p.grad).to(torch.float32) for p in due])
        members = same_shape_buckets([p for p in live if "exp_avg" in self.state[p]])
        grads = [torch.stack([matrix_view(p.grad) for p in params]).to(torch.float32) for params in members]
        projections = [self._projections(group, params, g) for params, g in zip(members, grads, strict=True)]
        rights = [projects_right(tuple(g.shape[1:]), group["proj_type"]) for g in grads]
        projected = [
            torch.bmm(g, proj.mT) if right else torch.bmm(proj.mT, g)
            for g, proj, right in zip(grads, projections, rights, strict=True)
        ]
        normalized = self._adam_moments(group, members, projected)
        return [
            LowRankBucket(params, g, proj, right, sigma, n, self._step_sizes(group, params))
            for params, g, proj, right, sigma, n in zip(
                members, grads, projections, rights, projected, normalized, strict=True
            )
        ]

    def _adam_moments(
        self, group: Mapping[str, Any], members: list[list[nn.Parameter]], projected: list[Tensor]
    ) -> list[Tensor]:
        """m and v of every matrix advanced by its sigma (foreach over all buckets); N = m / (sqrt(v) + eps) restacked
        per bucket."""
        states = [self.state[p] for params in members for p in params]
        sigmas = [sigma for stack in projected for sigma in stack.unbind(0)]
        beta1, beta2 = group["beta1"], group["beta2"]
        exp_avgs = [st["exp_avg"] for st in states]
        exp_avg_sqs = [st["exp_avg_sq"] for st in states]
        denoms = advance_moments(exp_avgs, exp_avg_sqs, sigmas, beta1, beta2, group["eps"])
        normalized = torch._foreach_div(exp_avgs, denoms)
        stacks, start = [], 0
        for params in members:
            stacks.append(torch.stack(normalized[start : start + len(params)]))
            start += len(params)
        return stacks

    def _step_sizes(self, group: Mapping[str, Any], params: list[nn.Parameter]) -> list[float]:
        """Count one more Adam step per matrix; lr * sqrt(1 - b2^t) / (1 - b1^t) each (Python floats)."""
        beta1, beta2 = group["beta1"], group["beta2"]
        sizes = []
        for param in params:
            state = self.state[param]
            state["step"] += 1
            sizes.append(group["lr"] * math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"]))
        return sizes

    def apply_low_rank_update(
        self, group: Mapping[str, Any], bucket: LowRankBucket, extra: Tensor | None = None
    ) -> None:
        """W <- W - step_size * (scale * back(N) + extra), `extra` a (k, m, n) stack of full-rank terms (or none)."""
        left, right = bucket.factors(bucket.normalized)
        if extra is None:
            update = torch.bmm(left, right)
            coefficients = [-size * group["scale"] for size in bucket.step_sizes]
        else:
            update = torch.baddbmm(extra, left, right, alpha=group["scale"])
            coefficients = [-size for size in bucket.step_sizes]
        add_stacked(bucket.params, update, coefficients)

    @staticmethod
    def decay_weights(group: Mapping[str, Any], params: list[nn.Parameter]) -> None:
        """Decoupled weight decay after the update, with the raw lr (the reference code's order)."""
        if group["weight_decay"] > 0:
            torch._foreach_add_(params, params, alpha=-group["lr"] * group["weight_decay"])

    @staticmethod
    def _start_moments(state: dict[str, Any], projected_shape: tuple[int, int], device: torch.device) -> None:
        """A parameter's first projection: step 0 (unless already counted) and float32 zero moments of sigma's shape."""
        state.setdefault("step", 0)
        state["exp_avg"] = torch.zeros(projected_shape, dtype=torch.float32, device=device)
        state["exp_avg_sq"] = torch.zeros(projected_shape, dtype=torch.float32, device=device)

    @staticmethod
    def _refresh_due(group: Mapping[str, Any], state: Mapping[str, Any]) -> bool:
        return (
            "exp_avg" not in state
            or state.get("svd_failures", 0) > 0
            or refresh_due(state["step"] + 1, group["update_proj_gap"], group["refresh_schedule"])
        )

    def _projections(self, group: Mapping[str, Any], params: list[nn.Parameter], grads: Tensor) -> Tensor:
        """The (k, ...) stack of this step's projections of one bucket (GaLore: the stored SVD bases)."""
        return torch.stack([self.state[p]["projection"] for p in params])

    def _refresh(self, group: dict[str, Any], params: list[nn.Parameter], grads: list[Tensor]) -> None:
        """New projections from the SVD of the current gradients, one batched SVD per (shape, step) bucket."""
        buckets: dict[tuple[tuple[int, ...], torch.device, int], list[int]] = defaultdict(list)
        for i, (param, grad) in enumerate(zip(params, grads, strict=True)):
            next_step = self.state[param].get("step", 0) + 1
            buckets[(tuple(grad.shape), grad.device, next_step)].append(i)
        for (shape, _, next_step), members in buckets.items():
            rows, cols = shape
            rank = effective_rank(group["rank"], (rows, cols))
            right = projects_right((rows, cols), group["proj_type"])
            stacked = torch.stack([grads[i] for i in members])
            bases = self._bases_with_fallback(stacked, rank, right, group, next_step)
            for i, basis in zip(members, bases, strict=True):
                self._install(params[i], basis, right, group, shape)

    def _bases_with_fallback(
        self, stacked: Tensor, rank: int, right: bool, group: Mapping[str, Any], step: int
    ) -> list[Tensor | None]:
        """Projection bases for a batch; on SolverError, retried matrix by matrix to find which failed."""
        try:
            return list(self._bases(stacked, rank, right, group, step))
        except SolverError:
            if stacked.size(0) == 1:
                return [None]
        found: list[Tensor | None] = []
        for grad in stacked:
            try:
                found.append(self._bases(grad.unsqueeze(0), rank, right, group, step)[0])
            except SolverError:
                found.append(None)
        return found

    @staticmethod
    def _bases(stacked: Tensor, rank: int, right: bool, group: Mapping[str, Any], step: int) -> list[Tensor]:
        """Top-r singular vectors: rows of V^T (r x n) for the right side, columns of U (m x r) for the left.

        The gradient is decomposed as it is, as the reference's projector does (`galore_projector.py` line 81), so
        the signs are the reference's; `transposes_wide_gradients` says when a wide one is decomposed as its
        transpose, G^T = U' S V'^T, U = V' and V = U' (same subspaces, other signs).
        """
        generator = None
        if group["svd_method"] == "randomized":
            generator = torch.Generator(device=stacked.device)
            generator.manual_seed((group["svd_seed"] * 1_000_003 + step) % (2**63))
        transposed = transposes_wide_gradients(stacked, group)
        u, _, vh = linalg.truncated_svd(
            stacked.mT if transposed else stacked, rank, method=group["svd_method"], generator=generator
        )
        left, right_rows = (vh.mT, u.mT) if transposed else (u, vh)
        basis = right_rows if right else left
        return [b.clone(memory_format=torch.contiguous_format) for b in basis]

    def _install(
        self, param: nn.Parameter, basis: Tensor | None, right: bool, group: Mapping[str, Any], shape: tuple[int, ...]
    ) -> None:
        state = self.state[param]
        if basis is None:
            self.solver_failed(state, "svd_failures", partial(_svd_failure, shape))
            return
        old = state.get("projection")
        if old is None:
            projected_shape = (shape[0], basis.size(0)) if right else (basis.size(1), shape[1])
            self._start_moments(state, projected_shape, basis.device)
        elif group["reproject_moments"]:
            if right:
                overlap = old @ basis.mT
                state["exp_avg"] = state["exp_avg"] @ overlap
                state["exp_avg_sq"] = state["exp_avg_sq"] @ overlap.square()
            else:
                overlap = basis.mT @ old
                state["exp_avg"] = overlap @ state["exp_avg"]
                state["exp_avg_sq"] = overlap.square() @ state["exp_avg_sq"]
        self.solver_ok(state, "svd_failures")
        state["projection"] = basis


def galore_state_bytes(
    structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]
) -> int:
    """float32 projection (r x n or m x r) + exp_avg and exp_avg_sq of the projected shape, + AdamW fallback."""
    total = 0
    for shape in structured:
        projection_shape, moments_shape = low_rank_shapes(shape, hp)
        total += memory.FLOAT32_BYTES * (math.prod(projection_shape) + 2 * math.prod(moments_shape))
    return total + adamw_state_bytes(fallback)


SIGN_INVARIANT_CHECK_HPARAMS: dict[str, Any] = {"update_proj_gap": 2, "rank": 4, "reproject_moments": True}
"""Conformance overrides of the SVD-projected methods (GaLore, Fira, Apollo-svd): a refresh at step 2, and moments
carried into the new basis so that the steps do not depend on singular-vector signs, which eager and compiled runs
(gradients equal to roundoff) may pick differently — without re-projection a flipped sign reverses that
direction's momentum."""


GALORE_FALLBACK = adamw_fallback(
    code(f"{REFERENCE}: the other parameters in the GaLore group's AdamW, lr included"),
    lr=0.02,
    beta1=0.9,
    beta2=0.999,
    eps=1e-6,
    weight_decay=0.0,
)
"""The reference code's treatment of non-GaLore parameters: the same AdamW, same lr, betas and eps, no weight
decay (torch AdamW here, whose eps comes after the bias correction)."""

GALORE = register(
    OptimizerEntry(
        name="galore",
        refresh_interval="update_proj_gap",
        summary="GaLore: Adam on an SVD low-rank projection of each matrix gradient, refreshed every T steps",
        reference=(
            "Zhao et al. 2024 (GaLore, ICML); algorithm box: Gong et al., RACS/Alice paper, Alg. 8 (App. B.11); "
            "reference code jiaweizzhao/GaLore galore_torch/adamw.py + galore_projector.py (2cc66f8)"
        ),
        hparams=(
            GaLore.hparams
            + head_switch(False, paper(f"{RACS_ALICE_PAPER} Table 2 'Ppl.': the LM head trained by GaLore"))
            + GALORE_FALLBACK
        ),
        build=hybrid_builder(GaLore),
        route=route_with_head_switch,
        notes=(
            "The 1.3B row of Table 7 (lr 0.01, scale 0.25, rank 512) is the reference README's. reproject_moments "
            "True rotates m by the basis overlap R and v by R elementwise-squared. rank is capped at min(m, n) as "
            "the reference's slicing does. svd_method 'randomized' is linalg's HMT. Conv filters are projected as "
            "(out, in*kh*kw) matrices (the reference's Tucker tensor projector is not reproduced). "
            "head_to_fallback True gives Table 2's 'Ppl.*'. Fallback AdamW (embeddings, 1-D params): the "
            "reference code's treatment. State: float32 projection and moments for any parameter dtype."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=galore_state_bytes,
        compile_supported=True,
        check_hparams=SIGN_INVARIANT_CHECK_HPARAMS,
    )
)
