"""SUMO: Subspace-Aware Moment-Orthogonalization (exact SVD of a low-rank first moment).

Paper: Y. Refael, G. Smorodinsky, T. Tirer, O. Lindenbaum, "SUMO: Subspace-Aware Moment-Orthogonalization
for Accelerating Memory-Efficient LLM Training" (NeurIPS 2025, arXiv 2505.24749), Algorithm 1 (Blocks 1-4),
read with the body text of §3.2 and App. C. No official code was identified (the paper links
none). For each matrix W (m x n; a conv filter as (out, in*kh*kw)) with gradient G_t, t = 0, 1, 2, ...:

    Block 1    if t mod K == 0:  Q_t = top-r left singular vectors of G_t     (randomized or exact truncated SVD)
    Block 1.1                    M <- (Q_t^T Q_{t-1}) M          (t >= 1; M = 0 at t = 0)   moment into the new basis
               G^_t = Q_t^T G_t                                                             (r x n)
    Block 2    M <- mu M + G^_t                                  (`momentum_form="ema"`: mu M + (1 - mu) G^_t)
               O_t = U V^T  where M = U S V^T                    (`orth`: exact SVD, or Newton-Schulz)
    Block 3    if ||O_t|| > gamma ||O_{t-1}||:  O_t <- O_t gamma ||O_{t-1}|| / ||O_t||      (norm-growth limiter)
    Block 4    W <- W - alpha lr s Q_t O_t - lr wd W                                         (wd on the pre-update W)

Choices where the paper is ambiguous or silent (each is a hyperparameter, declared with its source):
- Projected side (`proj_side`): "paper" projects from the left (Q m x r, M r x n) when m >= n and from the
  right (Q = top-r right singular vectors, n x r; G^ = G Q, m x r) when m < n, as §3.2 says; "galore" is
  GaLore's opposite choice; "left"/"right" force a side. Internally every matrix is handled in its oriented
  frame G_o = G (left) or G^T (right), so the basis always spans the top-r left singular space of G_o and the
  stored moment is r x (other side) — for the right side the transpose of the paper's m x r moment, the
  rotation M <- M (Q_{t-1}^T Q_t), derived here from Block 1.1, becoming R M.
- Shape scale s (`shape_scale`): the Block 4 text scales updates by sqrt(max(m, n)) (after Moonlight) while the
  algorithm box has only alpha; "sqrt_max" (default, the text) or "none" (the box as printed).
- The limiter uses Frobenius norms (the paper names no norm), compares with the previous step's *limited*
  O (the O that was applied), and does nothing at t = 0 or when the previous O was zero (there is no previous
  step to compare with; Algorithm 1's condition ||O_t||/||O_t|| is a typo for the text's ||O_t||/||O_{t-1}||).
- Rank-deficient moments: singular values of M at or below max(r, n) * eps * sigma_1 (torch.linalg.matrix_rank's
  default tolerance, with float32's eps, the precision linalg's SVDs run in) count as zero and their
  directions get no update (the limit Newton-Schulz also has), so a zero or rank-deficient moment (e.g.
  gradient rows of dead units) never moves W along arbitrary singular vectors; for a full-rank moment this
  is exactly U V^T. (The iteration below differs for one step; see there.)
- How U V^T is computed (`polar_method`, structbench numerics; the paper takes an SVD): "newton_schulz" (default)
  runs K steps of the inverse-free quintic polar iteration X <- X (15 I - 10 X^T X + 3 (X^T X)^2) / 8
  (linalg.NS_POLAR_QUINTIC, the [2/0] Padé iteration) from X0 = M / ||M||_F on the stack of all moments of one
  shape: matrix products only, no host read. It maps each singular value s / ||M||_F through an increasing f with
  f(1) = 1 and keeps M's singular vectors; K = linalg.polar_steps(max(r, n) eps / sqrt(r), polar_tol / 2) is the
  fewest steps that bring every singular value the SVD path keeps (s > max(r, n) eps s_1, so s / ||M||_F >=
  max(r, n) eps / sqrt(r)) within polar_tol / 2 of 1 (in |y^2 - 1|): K = 22 at r = 4, n = 64; 18 at r = 4, n = 768
  or r = 128, n = 5461. Deviation from the exact U V^T: ||O - U V^T||_F <= ||O O^T - I||_F (|y - 1| <= |y^2 - 1|),
  the residual checked (its RMS over the r x r Gram <= `polar_tol`), plus rounding: each step's products err by
  about gamma_n of ||X|| <= sqrt(r), which moves the iterate's polar factor by at most 2 ||E|| / s_r(X_k), X_k's
  smallest singular value, growing by up to 15/8 per step; in all about 4 gamma_n sqrt(r) ||M||_F / s_r(M), the
  order of the SVD's own 2 c n u ||M|| / s_r (tests/optim/test_sumo_polar.py checks both against float64 SVDs,
  cond(M) up to 1e4). The check is computed on the device and posted (structbench.optim.deferred); at the
  matrix's next step it is read (waiting for that copy only) and a matrix that failed gets its polar factor by
  the SVD instead (`polar_masked`; each adds one to the matrix's and the optimizer's `root_fallbacks`, recorded
  with the run), and keeps it while the iteration's check keeps failing. The price: a factor that failed its check
  is used for the step it was made in. For a rank-deficient moment that is the one step where the rule above does
  not hold: singular values below the threshold map to f^K(s / ||M||_F) in [0, 1) instead of 0 (||O - O_svd||_F
  <= sqrt(their number); a zero M still gives 0). A non-finite iterate (a non-finite moment) is replaced by zero
  for its step, as a failed SVD is. "svd" is the exact method: one batched SVD per stack per step.
- `moment_transform`: "rotate" (Block 1.1), "reset" (M <- 0 at each refresh) or "keep" (no rotation, GaLore's
  behaviour) for ablations; `orth`: "svd" (SUMO), "ns_quintic" (Muon's Newton-Schulz5 coefficients, the
  paper's "SUMO (Newton-Schulz5)" ablation, Tables 2 and 6) or "ns_cubic" (the classic iteration Lemma 3.2
  analyses), both run for `ns_steps` steps from X0 = M / ||M|| (`ns_normalize`: "frobenius" as Muon,
  "spectral" as the lemma's proof).
- The randomized SVD (Halko, Martinsson & Tropp 2011, Alg. 4.4 + 5.1; oversampling and power iterations
  unstated in the paper) draws its Gaussian sketch from a generator seeded by (`svd_seed`, t), so runs and
  resumed runs are bit-identical without any RNG state. One draw serves a whole refresh stack (below): its i-th
  matrix gets the draw's i-th slice, so a matrix's randomized basis depends on its place in the stack (a matrix
  refreshed alone gets the first slice); the exact method's does not.

Numerics: basis, moment and the limiter's previous norm are float32 whatever the parameter dtype (float64 for float64
parameters); bfloat16 parameters receive the float32 update rounded once. The step counter and the consecutive-failure
and fallback counters are int64 tensors kept on the CPU. Batching: at a refresh, the matrices due whose oriented
gradients G_o have one shape (across parameter shapes: a 3072 x 768 and a 768 x 3072 weight both give 3072 x 768 under
proj_side "paper") and, for the randomized SVD, one step count t form one stack, in the group's parameter order: one
batched truncated SVD, the rotation (Q_t^T Q_{t-1}) M as two batched products, and the new bases and moments written
into each matrix's own state tensors by `torch._foreach_copy_` (a first basis into new tensors, its moment zeroed by
`torch._foreach_zero_`), so the refresh's launches do not grow with the stack's size. Each matrix gets the basis it
would get refreshed alone (bit for bit for the exact SVD on a CPU: one LAPACK call per matrix either way; on CUDA the
batched and the single SVD may be different cuSOLVER routines, agreeing to the SVD's accuracy; the randomized sketch as
stated above, and a stack whose SVD failed is retried matrix by matrix, each drawing as alone) and its rotated moment
within the products' rounding of the alone one's, 2 gamma_{k+r} |Q_t^T| |Q_{t-1}| |M| entrywise (k the projected side;
the batched and the single product may round differently, each within half of that of the exact product). The moments of
one shape (across parameter shapes) are stacked for one polar iteration (or SVD, or Newton-Schulz) per step. A failed
refresh keeps the previous basis (and moment) and is retried at the next step; a matrix whose first refresh fails takes
no step. A failed orthogonalization gives that matrix a zero update for the step (the moment is kept). Each failure is
counted in `solver_failures`; the third consecutive failure of one kind for one matrix raises SolverError (a polar
iteration that passed its check ends an SVD failure streak). Under torch.compile the step runs eagerly
(`torch.compiler.disable`): its refresh schedule, batching by step count and solver fallbacks are data-dependent Python
control flow.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor

from structbench.errors import SolverError
from structbench.optim import linalg
from structbench.optim.base import EagerStructuredOptimizer
from structbench.optim.deferred import DeferredCheck
from structbench.optim.hparams import Declaration, code, decade_around, flag, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import adamw_fallback, adamw_form, fallback_state_bytes, hybrid_builder
from structbench.optim.partition import head_switch, matrix_shape, matrix_view, route_with_head_switch
from structbench.optim.registry import OptimizerEntry, register

ORTH_METHODS: dict[str, tuple[float, float, float] | None] = {
    "svd": None,
    "ns_quintic": linalg.NS_QUINTIC,
    "ns_cubic": linalg.NS_CUBIC,
}
SUBSPACE_METHODS = linalg.TRUNCATED_SVD_METHODS
PROJ_SIDES = ("paper", "galore", "left", "right")
MOMENT_TRANSFORMS = ("rotate", "reset", "keep")
MOMENTUM_FORMS = ("sum", "ema")
SHAPE_SCALES = ("sqrt_max", "none")
PAPER = "Refael et al. (arXiv 2505.24749)"
GALORE = "jiaweizzhao/GaLore galore_torch/adamw.py"

POLAR_METHODS = ("newton_schulz", "svd")
ROOT_FALLBACKS = "root_fallbacks"
_COUNTERS = ("step", "refresh_failures", "orth_failures", ROOT_FALLBACKS)
"""int64 scalar state kept on the CPU: updates taken (the paper's t), consecutive solver failures, and the polar
factors recomputed by the SVD after the iteration's check failed (cumulative)."""
POLAR_DUE = "polar_due"
"""State flag (a Python bool, present only when True) of a matrix whose iterative polar factor failed its check: its
next polar factor is computed by the SVD."""


def projects_left(shape: tuple[int, int], proj_side: str) -> bool:
    """True when Q spans the column space (Q m x r, G^ = Q^T G); False for the row space (G^ = G Q)."""
    rows, cols = shape
    if proj_side == "paper":
        return rows >= cols
    if proj_side == "galore":
        return rows < cols
    if proj_side in ("left", "right"):
        return proj_side == "left"
    raise ValueError(f"unknown proj_side {proj_side!r}; valid: {', '.join(PROJ_SIDES)}")


def effective_rank(rank: int, shape: tuple[int, int]) -> int:
    """The rank actually used: `rank` capped at min(m, n)."""
    return min(rank, *shape)


def shape_scale(shape: tuple[int, int], mode: str) -> float:
    """s in W <- W - alpha lr s Q O: sqrt(max(m, n)) (§3.2 Block 4 text) or 1 (Algorithm 1 as printed)."""
    if mode == "sqrt_max":
        return math.sqrt(max(shape))
    if mode == "none":
        return 1.0
    raise ValueError(f"unknown shape_scale {mode!r}; valid: {', '.join(SHAPE_SCALES)}")


def compute_dtype(param_dtype: torch.dtype) -> torch.dtype:
    """Dtype of basis, moment and update: float32, or float64 for float64 parameters."""
    return torch.float64 if param_dtype == torch.float64 else torch.float32


SOLVER_EPS = torch.finfo(torch.float32).eps
"""linalg solves in float32 first (float64 only as a retry), so this is the precision of bases and SVDs."""


def polar_masked(m: Tensor) -> Tensor:
    """U diag(1[s > tol]) V^T of M = U diag(s) V^T (batched), tol = max(rows, cols) * eps_float32 * s_1.

    The exact polar factor U V^T for a full-rank M; directions of (numerically) zero singular values, whose
    singular vectors are arbitrary, are dropped, and a zero M gives zero.
    """
    u, s, vh = linalg.truncated_svd(m, min(m.shape[-2:]), method="exact")
    tol = s[..., :1] * (max(m.shape[-2:]) * SOLVER_EPS)
    keep = (s > tol).to(m.dtype)
    return (u * keep.unsqueeze(-2)) @ vh


class Sumo(EagerStructuredOptimizer):
    """SUMO over matrix parameters (2-D, or conv filters through their (out, in*kh*kw) view).

    State per parameter: `basis` Q (k x r, k the projected side), `moment` M (r x other side), `prev_norm`
    (||O_{t-1}||_F after the limiter; 0 = none yet) — float32 (float64 for float64 parameters) on the
    parameter's device — and the CPU int64 scalars `step` (t), `refresh_failures`, `orth_failures`.
    """

    matrices_only = "SUMO"
    cpu_state_keys = _COUNTERS

    hparams = Declaration(
        real("lr", 1e-5, paper(f"{PAPER} Table 7, GLUE: 6 of 8 tasks"), "(0, inf)", decade_around()),
        integer("rank", 4, paper(f"{PAPER} Tables 2 and 7, GLUE rank 4 (C4: 128-512, Table 3)"), "[1, inf)"),
        integer("update_freq", 200, ours("K is not stated: about 200 (the authors' README), GaLore's gap"), "[1, inf)"),
        real("alpha", 4.0, paper(f"{PAPER} Table 7, the projection back scale at rank 4 (rank 8: 2)"), "(0, inf)"),
        real("momentum", 0.9, ours("Alg. 1's beta1 has no value: GaLore's Adam beta1"), "[0, 1)", lin(0.85, 0.95)),
        option("momentum_form", "sum", MOMENTUM_FORMS, paper(f"{PAPER} Alg. 1: mu M + G^ ('ema' is App. C's)")),
        real("weight_decay", 0.0, ours("not stated: GaLore's recipe, which the paper follows"), "[0, inf)"),
        flag("norm_limiter", True, paper(f"{PAPER} Sec. 3.2, Block 3")),
        real("nl_gamma", 1.1, paper(f"{PAPER} Sec. 3.2, Block 3"), "[1, inf)"),
        option("shape_scale", "sqrt_max", SHAPE_SCALES, paper(f"{PAPER} Sec. 3.2, Block 4 text ('none': the box)")),
        option("orth", "svd", tuple(ORTH_METHODS), paper(f"{PAPER} Alg. 1, Orthogonalization_SVD")),
        option(
            "polar_method",
            "newton_schulz",
            POLAR_METHODS,
            ours("orth 'svd''s U V^T by matrix products, no host read: within polar_tol of the SVD; 'svd' exact"),
        ),
        real("polar_tol", 1e-3, ours("RMS of O O^T - I accepted from 'newton_schulz', else SVD next step"), "(0, 1)"),
        integer("ns_steps", 5, paper(f"{PAPER} 'SUMO (Newton-Schulz5)', Tables 2 and 6"), "[1, inf)"),
        option(
            "ns_normalize", "frobenius", linalg.NS_NORMALIZATIONS, code("KellerJordan/Muon muon.py: X0 = M / ||M||_F")
        ),
        option("subspace", "randomized", SUBSPACE_METHODS, paper(f"{PAPER} Block 1: a randomized truncated SVD")),
        integer("rsvd_oversample", 5, ours("not stated: Halko, Martinsson & Tropp 2011's recommendation"), "[0, inf)"),
        integer("rsvd_power_iters", 2, ours("not stated: Halko, Martinsson & Tropp 2011's recommendation"), "[0, inf)"),
        integer("svd_seed", 0, ours("seeds the randomized SVD's sketch, with the step")),
        option("proj_side", "paper", PROJ_SIDES, paper(f"{PAPER} Sec. 3.2: the larger side")),
        option("moment_transform", "rotate", MOMENT_TRANSFORMS, paper(f"{PAPER} Block 1.1")),
    )

    def __init__(self, params: Any, **hparams: Any) -> None:
        super().__init__(params, **hparams)
        self._polar_checks: dict[tuple[int, ...], tuple[DeferredCheck, list[Tensor]]] = {}
        """Per stack of moments (keyed by its parameters' ids): the iterative polar factors' pending residual check."""

    @property
    def root_fallbacks(self) -> int:
        """Polar factors that `polar_method="newton_schulz"` recomputed by the SVD, over all matrices and steps (the
        sum of the state counters, so a resumed run keeps counting); the run records it as `root_fallbacks`."""
        return sum(int(st[ROOT_FALLBACKS]) for st in self.state.values() if ROOT_FALLBACKS in st)

    def state_dict(self) -> dict[str, Any]:
        """The state, with every pending polar check read into its failed matrices' state (`POLAR_DUE`), so that a
        resumed run repairs them at the same step as this one."""
        for stack in list(self._polar_checks):
            self._settle_check(stack)
        return super().state_dict()

    def full_moment(self, param: Tensor) -> Tensor | None:
        """The moment in the parameter's matrix space, Q M (left) or (Q M)^T (right); None before the first step."""
        state = self.state.get(param, {})
        if "basis" not in state:
            return None
        group = next(g for g in self.param_groups if any(p is param for p in g["params"]))
        full = state["basis"] @ state["moment"]
        return full if projects_left(matrix_shape(param.shape), group["proj_side"]) else full.mT

    def step_group(self, group: dict[str, Any]) -> None:
        live = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse for p in live):
            raise RuntimeError("SUMO does not support sparse gradients")
        for p in live:
            if not self.state[p]:
                self._init_state(p)
        oriented = [self._oriented_gradient(p, group) for p in live]
        due = [i for i, p in enumerate(live) if self._refresh_due(self.state[p], group)]
        if due:
            self._refresh(group, [live[i] for i in due], [oriented[i] for i in due])
        ready = [i for i, p in enumerate(live) if "basis" in self.state[p]]
        if not ready:
            return
        self._advance_moments(group, [live[i] for i in ready], [oriented[i] for i in ready])
        stacks: dict[tuple[torch.Size, torch.device, torch.dtype], list[Tensor]] = defaultdict(list)
        for i in ready:
            moment = self.state[live[i]]["moment"]
            stacks[(moment.shape, moment.device, moment.dtype)].append(live[i])
        for params in stacks.values():
            self._update(group, params)

    def _init_state(self, param: Tensor) -> None:
        state = self.state[param]
        for key in _COUNTERS:
            state[key] = torch.zeros((), dtype=torch.int64, device="cpu")
        state["prev_norm"] = torch.zeros((), dtype=compute_dtype(param.dtype), device=param.device)

    @staticmethod
    def _oriented_gradient(param: Tensor, group: Mapping[str, Any]) -> Tensor:
        """G_o: the gradient's matrix view in the compute dtype, transposed when Q spans its row space."""
        grad = matrix_view(param.grad).to(compute_dtype(param.dtype))
        return grad if projects_left(matrix_shape(param.shape), group["proj_side"]) else grad.mT

    def _advance_moments(self, group: Mapping[str, Any], params: list[Tensor], oriented: list[Tensor]) -> None:
        """The moment of Block 2, M <- mu M + Q^T G_o (or the EMA), for matrices that have a basis."""
        states = [self.state[p] for p in params]
        projected = [st["basis"].mT @ g for st, g in zip(states, oriented, strict=True)]
        moments = [st["moment"] for st in states]
        if group["momentum_form"] == "sum":
            torch._foreach_mul_(moments, group["momentum"])
            torch._foreach_add_(moments, projected)
        else:
            torch._foreach_lerp_(moments, projected, 1.0 - group["momentum"])

    def _update(self, group: dict[str, Any], owned: list[Tensor]) -> None:
        """Blocks 2-4 for matrices whose moments have one shape: one stacked orthogonalization, the limiter, W."""
        states = [self.state[p] for p in owned]
        ortho, failed = self._orthogonalize(torch.stack([st["moment"] for st in states]), owned, group)
        norms = torch.linalg.vector_norm(ortho, dim=(-2, -1))
        prev = torch.stack([st["prev_norm"] for st in states])
        if group["norm_limiter"]:
            ceiling = group["nl_gamma"] * prev
            limit = (prev > 0) & (norms > ceiling)
            factor = torch.where(limit, ceiling / torch.where(limit, norms, 1.0), 1.0)
            ortho = ortho * factor[:, None, None]
            norms = norms * factor
        if failed:
            kept = torch.zeros(len(owned), dtype=torch.bool)
            kept[failed] = True
            norms = torch.where(kept.to(norms.device), prev, norms)
        torch._foreach_copy_([st["prev_norm"] for st in states], list(norms.unbind(0)))
        if group["weight_decay"] > 0:
            torch._foreach_mul_(owned, 1.0 - group["lr"] * group["weight_decay"])
        for p, st, o in zip(owned, states, ortho.unbind(0), strict=True):
            shape = matrix_shape(p.shape)
            step = -group["lr"] * group["alpha"] * shape_scale(shape, group["shape_scale"])
            first, second = (st["basis"], o) if projects_left(shape, group["proj_side"]) else (o.mT, st["basis"].mT)
            if p.dtype == st["basis"].dtype and p.is_contiguous():
                matrix_view(p).addmm_(first, second, alpha=step)
            else:
                p.add_((first @ second).reshape(p.shape), alpha=step)
            st["step"] += 1

    @staticmethod
    def _refresh_due(state: Mapping[str, Any], group: Mapping[str, Any]) -> bool:
        if "basis" not in state or int(state["refresh_failures"]) > 0:
            return True
        return int(state["step"]) % group["update_freq"] == 0

    def _refresh(self, group: dict[str, Any], params: list[Tensor], oriented: list[Tensor]) -> None:
        """Blocks 1 + 1.1 for the matrices due, one stack per oriented shape (and step count, which seeds the
        randomized sketch): one batched truncated SVD, then `_install`. A matrix whose SVD failed keeps its basis and
        moment and is counted (the third failure in a row raises SolverError)."""
        stacks: dict[tuple[torch.Size, torch.device, torch.dtype, int], list[int]] = defaultdict(list)
        for i, (p, grad) in enumerate(zip(params, oriented, strict=True)):
            t = int(self.state[p]["step"]) if group["subspace"] == "randomized" else 0
            stacks[(grad.shape, grad.device, grad.dtype, t)].append(i)
        for (shape, *_, t), members in stacks.items():
            rank = effective_rank(group["rank"], (shape[0], shape[1]))
            bases, failed = self._bases_with_fallback(torch.stack([oriented[i] for i in members]), rank, group, t)
            if bases is not None:
                self._install(group, [params[i] for j, i in enumerate(members) if j not in failed], bases, shape[1])
            for j in failed:
                self._refresh_failed(params[members[j]])

    def _refresh_failed(self, param: Tensor) -> None:
        """Count a failed truncated SVD in the matrix's streak (the third in a row raises SolverError)."""
        describe = partial(_failure, "truncated SVD of the gradient", param)
        self.solver_failed(self.state[param], "refresh_failures", describe)

    def _bases_with_fallback(
        self, stacked: Tensor, rank: int, group: Mapping[str, Any], t: int
    ) -> tuple[Tensor | None, list[int]]:
        """New bases (b', k, r) for a stack of b oriented gradients, and the indices of the b - b' whose SVD failed
        (left out of the bases; None when all failed): on SolverError the batch is retried matrix by matrix."""
        try:
            return self._bases(stacked, rank, group, t), []
        except SolverError:
            if stacked.size(0) == 1:
                return None, [0]
        found: list[Tensor] = []
        failed: list[int] = []
        for index, grad in enumerate(stacked):
            try:
                found.append(self._bases(grad.unsqueeze(0), rank, group, t))
            except SolverError:
                failed.append(index)
        return (torch.cat(found) if found else None), failed

    @staticmethod
    def _bases(stacked: Tensor, rank: int, group: Mapping[str, Any], t: int) -> Tensor:
        generator = None
        if group["subspace"] == "randomized":
            generator = torch.Generator(device=stacked.device)
            generator.manual_seed((group["svd_seed"] * 1_000_003 + t) % (2**63))
        u, _, _ = linalg.truncated_svd(
            stacked,
            rank,
            method=group["subspace"],
            oversample=group["rsvd_oversample"],
            power_iters=group["rsvd_power_iters"],
            generator=generator,
        )
        return u.to(stacked.dtype)

    def _install(self, group: Mapping[str, Any], params: list[Tensor], bases: Tensor, other: int) -> None:
        """Block 1.1 for a stack of new bases Q_t (b, k, r), written into each matrix's own state tensors: a first
        basis into new tensors with a zero moment; otherwise the moment rotated, M <- (Q_t^T Q_{t-1}) M, by two
        batched products (or reset, or kept) and the old basis overwritten."""
        states = [self.state[p] for p in params]
        first = [j for j, st in enumerate(states) if "basis" not in st]
        later = [j for j, st in enumerate(states) if "basis" in st]
        if first:
            self._install_first([states[j] for j in first], _rows(bases, first), other)
        if later:
            self._install_later(group, [states[j] for j in later], _rows(bases, later))
        for state in states:
            if int(state["refresh_failures"]):
                self.solver_ok(state, "refresh_failures")

    @staticmethod
    def _install_first(states: list[dict[str, Any]], bases: Tensor, other: int) -> None:
        """A first basis per matrix, copied into a new tensor, and a new zero moment (r x `other`)."""
        _, k, r = bases.shape
        for state in states:
            state["basis"] = torch.empty(k, r, dtype=bases.dtype, device=bases.device)
            state["moment"] = torch.empty(r, other, dtype=bases.dtype, device=bases.device)
        torch._foreach_copy_([st["basis"] for st in states], list(bases.unbind(0)))
        torch._foreach_zero_([st["moment"] for st in states])

    @staticmethod
    def _install_later(group: Mapping[str, Any], states: list[dict[str, Any]], bases: Tensor) -> None:
        """Block 1.1 (`moment_transform`) by batched products, then the new bases over the old ones."""
        moments = [st["moment"] for st in states]
        if group["moment_transform"] == "rotate":
            rotation = bases.mT @ torch.stack([st["basis"] for st in states])
            torch._foreach_copy_(moments, list((rotation @ torch.stack(moments)).unbind(0)))
        elif group["moment_transform"] == "reset":
            torch._foreach_zero_(moments)
        torch._foreach_copy_([st["basis"] for st in states], list(bases.unbind(0)))

    def _orthogonalize(
        self, stacked: Tensor, owned: list[Tensor], group: Mapping[str, Any]
    ) -> tuple[Tensor, list[int]]:
        """Block 2's O for a (b, r, other) stack, and the indices of the matrices whose O failed (their O is 0)."""
        coefficients = ORTH_METHODS[group["orth"]]
        if coefficients is not None:
            ortho = linalg.newton_schulz(
                stacked,
                steps=group["ns_steps"],
                coefficients=coefficients,
                dtype=stacked.dtype,
                normalize=group["ns_normalize"],
            )
            return ortho, []
        if group["polar_method"] == "svd":
            return self._svd_polar(stacked, owned)
        return self._iterative_polar(stacked, owned, group["polar_tol"])

    def _iterative_polar(self, stacked: Tensor, owned: list[Tensor], tol: float) -> tuple[Tensor, list[int]]:
        """`polar_method="newton_schulz"`: the quintic iteration for the whole stack, its residual check posted for the
        next step, and the SVD for the matrices whose check failed at the previous step (counted in root_fallbacks).
        A non-finite iterate (a non-finite moment) is replaced by zero."""
        rank, other = stacked.shape[-2:]
        steps = linalg.polar_steps(max(rank, other) * SOLVER_EPS / math.sqrt(rank), tol / 2)
        found = linalg.polar_newton_schulz(stacked, steps, tol)
        ortho = torch.where(found.residual.isfinite()[:, None, None], found.polar, 0.0)
        due = self._fallbacks_due(owned)
        check = DeferredCheck()
        check.post(~found.converged)
        self._polar_checks[tuple(map(id, owned))] = (check, owned)
        if not due:
            return ortho, []
        for i in due:
            self.state[owned[i]][ROOT_FALLBACKS] += 1
        repaired, failed = self._svd_polar(stacked[due], [owned[i] for i in due])
        ortho[due] = repaired
        return ortho, [due[i] for i in failed]

    def _fallbacks_due(self, owned: list[Tensor]) -> list[int]:
        """Indices of the matrices whose iterative polar factor failed its check at their previous step (read from the
        pending checks that cover any of them); a matrix that passed ends its SVD failure streak."""
        ids = set(map(id, owned))
        for stack in [stack for stack in self._polar_checks if ids.intersection(stack)]:
            self._settle_check(stack)
        return [i for i, p in enumerate(owned) if self.state[p].pop(POLAR_DUE, False)]

    def _settle_check(self, stack: tuple[int, ...]) -> None:
        """Read the pending check of `stack` (waiting for its copy only) into its matrices' state: a failed one is due
        for the SVD at its next step (`POLAR_DUE`), a converged one ends its SVD failure streak."""
        check, params = self._polar_checks.pop(stack)
        failed = set(check.take())
        for index, param in enumerate(params):
            state = self.state[param]
            if index in failed:
                state[POLAR_DUE] = True
            elif int(state["orth_failures"]):
                self.solver_ok(state, "orth_failures")

    def _svd_polar(self, stacked: Tensor, owned: list[Tensor]) -> tuple[Tensor, list[int]]:
        """`polar_masked` of a stack, retried matrix by matrix when the batch fails; a failed matrix gets O = 0, is
        counted in `solver_failures` and its streak (the third in a row raises SolverError)."""
        try:
            ortho = polar_masked(stacked)
        except SolverError:
            ortho = torch.zeros_like(stacked)
            failed = []
            for i, moment in enumerate(stacked):
                try:
                    ortho[i] = polar_masked(moment)
                except SolverError:
                    failed.append(i)
                    describe = partial(_failure, "SVD of the moment", owned[i])
                    self.solver_failed(self.state[owned[i]], "orth_failures", describe)
        else:
            failed = []
        for i, p in enumerate(owned):
            if i not in failed:
                self.solver_ok(self.state[p], "orth_failures")
        return ortho, failed


def _rows(stacked: Tensor, indices: list[int]) -> Tensor:
    """`stacked[indices]`, without the gather when the indices are all of it in order."""
    return stacked if indices == list(range(stacked.size(0))) else stacked[indices]


def _failure(what: str, param: Tensor, streak: int) -> str:
    return f"SUMO: the {what} of a {tuple(param.shape)} parameter failed {streak} times in a row"


COUNTER_BYTES = 8 * len(_COUNTERS)


def sumo_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """Table 1's (m + n) r floats per matrix (basis + moment) + prev_norm (4 B) + four int64 counters, + the
    fallback's state (torch AdamW's, or `HFAdamW`'s for `adamw_form` "hf")."""
    total = 0
    for shape in structured:
        rows, cols = matrix_shape(shape)
        rank = effective_rank(hp["rank"], (rows, cols))
        total += 4 * rank * (rows + cols) + 4 + COUNTER_BYTES
    return total + fallback_state_bytes(fallback, hp)


_NOTES = (
    "Other ranks in the paper: MAWPS 32/128, GSM8K 64. momentum_form 'ema' (App. C, beta M + (1 - beta) G^) gives "
    "the same direction after the SVD. Limiter on the Frobenius norm of the applied O, skipped at t = 0 and after a "
    "zero O. proj_side 'galore' is GaLore's opposite side; 'left'/'right' forced. moment_transform 'reset', 'keep' "
    "(GaLore's). orth 'ns_quintic' (Muon's NS5 coefficients, the 'SUMO (Newton-Schulz5)' ablation), 'ns_cubic' "
    "(Lemma 3.2's iteration), ns_normalize 'spectral' (the lemma's); NS runs in the state dtype. orth 'svd''s U V^T "
    "by polar_method 'newton_schulz' (default; structbench's: the quintic polar iteration to within polar_tol of "
    "the SVD's, checked on the device, a failed matrix recomputed by the SVD at its next step and counted in "
    "root_fallbacks) or 'svd' (exact). Singular "
    "values <= max(r, n) eps s_1 of the moment count as zero (matrix_rank's tolerance): no update along "
    "them. Not implemented: the adaptive switch ||G^|| <= varsigma, per-layer updates in backward (AdaLomo), "
    "the README's 'original space update'. Routing (unstated in the paper: GaLore's): SUMO on hidden matrices and conv "
    "filters (out, in*kh*kw); 1-D params, embeddings and the head (head_to_fallback) to an AdamW with "
    "GaLore's settings: torch AdamW (adamw_form 'torch', default) or GaLore's code's (adamw_form 'hf': eps on the "
    "uncorrected sqrt(v), decay after the update). State: float32 basis and moment for any parameter dtype."
)

SUMO_FALLBACK = adamw_fallback(
    code(f"{GALORE}, which the paper follows: the other parameters in the same AdamW, lr included"),
    lr=1e-5,
    beta1=0.9,
    beta2=0.999,
    eps=1e-6,
    weight_decay=0.0,
) + adamw_form(
    "torch",
    ours(
        "the paper says nothing of the other parameters' optimizer (no AdamW variant, no code); torch AdamW as in "
        "the galore entry's fallback, so both share it; 'hf' is GaLore's code's AdamW"
    ),
)
"""GaLore's recipe, which the paper follows: the other parameters in the same AdamW at the same lr (Table 7's). Its
values, and by default not its arithmetic: `adamw_form="torch"` is torch.optim.AdamW, which adds eps to the
bias-corrected sqrt(v) and decays before the update. GaLore's own AdamW (galore_torch/adamw.py, commit 2cc66f8, lines
120-126, 145-146; `adamw_form="hf"`, `hf_adamw.HFAdamW`) adds it to the uncorrected sqrt(v) and folds the corrections
into the step, an effective eps / sqrt(1 - beta2^t) (32 eps at t = 1), and decays the updated weights. The paper names
neither, so the default is the fallback the project's galore entry runs (torch AdamW, its documented deviation), which
keeps SUMO-against-GaLore comparisons on one fallback. At eps 0 and no weight decay the two agree to rounding; with
gradients near eps / sqrt(1 - beta2) the first updates differ by a large part of an update
(tests/optim/test_sumo_authors_code.py measures both)."""

HEAD_SWITCH = head_switch(True, ours("the paper follows GaLore, whose recipe trains the head with AdamW"))

_CHECK_HPARAMS: dict[str, Any] = {"update_freq": 2, "rank": 2, "lr": 0.01, "adamw_lr": 0.01}

SUMO = register(
    OptimizerEntry(
        name="sumo",
        refresh_interval="update_freq",
        summary="SUMO: exact-SVD orthogonalized first moment in a rank-r gradient subspace refreshed every K steps",
        reference=(
            "Refael, Smorodinsky, Tirer & Lindenbaum 2025, 'SUMO: Subspace-Aware Moment-Orthogonalization' "
            "(NeurIPS 2025, arXiv 2505.24749), Algorithm 1"
        ),
        hparams=Sumo.hparams + HEAD_SWITCH + SUMO_FALLBACK,
        build=hybrid_builder(Sumo),
        route=route_with_head_switch,
        notes=_NOTES,
        lr_keys=("lr", "adamw_lr"),
        state_bytes=sumo_state_bytes,
        check_hparams=_CHECK_HPARAMS,
    )
)

SUMO_NS5 = register(
    OptimizerEntry(
        name="sumo-ns5",
        refresh_interval="update_freq",
        summary="SUMO with Newton-Schulz5 (Muon's quintic, 5 steps) instead of the exact SVD: the paper's ablation",
        reference=(
            "Refael et al. 2025 (arXiv 2505.24749), Algorithm 1 with Orthogonalization_SVD replaced by "
            "Newton-Schulz5, Tables 2 and 6 'SUMO (Newton-Schulz5)'; coefficients of Jordan et al. 2024 (Muon)"
        ),
        hparams=(
            Sumo.hparams.with_defaults(orth=("ns_quintic", paper(f"{PAPER} Tables 2 and 6, 'SUMO (Newton-Schulz5)'")))
            + HEAD_SWITCH
            + SUMO_FALLBACK
        ),
        build=hybrid_builder(Sumo),
        route=route_with_head_switch,
        notes=(
            "As 'sumo' with orth 'ns_quintic': the paper does not print its NS5 polynomial; it cites Muon, so "
            "Muon's quintic (3.4445, -4.7750, 2.0315) from X0 = M/(||M||_F + 1e-7), 5 steps "
            "(KellerJordan/Muon muon.py); "
            "it does not converge to U V^T (singular values end in about [0.68, 1.13]). orth 'ns_cubic' with "
            "ns_normalize 'spectral' is the iteration Lemma 3.2 analyses. " + _NOTES
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=sumo_state_bytes,
        check_hparams=_CHECK_HPARAMS,
    )
)
