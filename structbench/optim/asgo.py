"""ASGO and DASGO: one-sided full-matrix and diagonal adaptive preconditioning of weight matrices.

Paper: K. An, Y. Liu, R. Pan, Y. Ren, S. Ma, D. Goldfarb, T. Zhang, "ASGO: Adaptive Structured Gradient
Optimization", NeurIPS 2025 (arXiv 2503.20762). `ASGO` implements Algorithm 2 ("A Practical Implementation
of ASGO", App. B); `DASGO` implements Algorithm 3 (App. B). For W in R^{m x n} (rows = output neurons, as in
nn.Linear.weight; a conv filter is viewed as (out, in*kh*kw)) with gradient G_t:

ASGO, Algorithm 2:
    M_t = beta1 M_{t-1} + (1 - beta1) G_t                        line 6, EMA momentum, no bias correction
    V_t = beta2 V_{t-1} + (1 - beta2) G_t G_t^T   if m < n        line 8, m x m (left side)
    V_t = beta2 V_{t-1} + (1 - beta2) G_t^T G_t   otherwise       line 10, n x n (right side; square -> right)
    Linv_t = (V_t + eps I)^{-1/2}  if t mod tau == 0, else Linv_{t-1}   lines 12-15 (eps INSIDE the root)
    W_{t+1} = W_t - lr Linv_t M_t  (left)  or  W_t - lr M_t Linv_t  (right)   lines 17-21

V is updated every step; its inverse root is recomputed only when t mod tau == 0 (t = 0 included), so a
fresh M_t meets a stale root in between. A 1-D parameter is a 1 x d row, so the smaller-side rule gives a
scalar preconditioner from ||g||^2: w <- w - lr m / sqrt(v + eps), the AdaGrad-Norm form App. B (i) says
makes a separate optimizer unnecessary. The side switch applies to matrices; vectors always take the scalar.

Switches (each off, i.e. at the paper's Algorithm 2, by default):
- `side`: "smaller" (Alg. 2 (i)), "left", "right" (Sec. 5: Hessian blocks are rows -> right side).
- `precondition_from`: "grad" (Alg. 2) or "momentum" (App. C.3 Eq. 4: V from M_t, which with beta2 = 0 and
  eps = 0 is Muon with momentum).
- `accumulation` "sum" (V_t = V_{t-1} + G G^T) and `eps_placement` "outside" ((V^{1/2} + eps I)^{-1}) give
  Algorithm 1, the theoretical ASGO (= "one-sided Shampoo" of Xie et al. 2025), with beta1 = 0, tau = 1,
  side = "left".
- `root`: "newton-schulz" (default; structbench's numerics, below), "eigh" (exact; App. C.3 uses an SVD of V),
  "newton" (coupled Newton, 50 iterations, Fig. 7c) or "polar-express" (the released code's root, below).
- `update_rms` > 0 rescales each update to Frobenius norm update_rms * sqrt(mn), and `weight_decay` is
  decoupled (W *= 1 - lr wd first): the released code's 0.2 and 0.1 (infinity-stars/ASGO), not the paper's.
  The released code (d3ef14b, `optimizers/asgo.py`, `dasgo.py`) also runs beta2 0.8, eps 1e-10 and a root every
  step (DASGO: beta2 0.95, eps 1e-8) and rejects conv filters. Its root is `root="polar-express"`
  (linalg.inverse_sqrt_polar_express, `POLAR_EXPRESS_STEPS` = 10 iterations of `_matrix_inverse_root_PolarExpress`,
  `optimizers/utils/matrix_decom.py` lines 98-125, in float32, a non-finite root replaced by I as asgo.py lines 61-64
  do): it approximates V^{-1/2}, eps entering only the normaliser 1.01 ||V + eps I||_F, and equals
  (V + eps I)^{-1/2} only where the iteration converges (relative 5e-5 for eigenvalues down to 1e-6 of ||V||_F, 4e-3
  at 1e-8, 0.7 at 1e-10: there the code's gain is three times below the exact root's). It costs 40 k x k products
  per root (4 per iteration), no host read and no decomposition; it has no residual check and no fallback. It needs
  eps_placement "inside" and eigenvalue_floor "none" (eps is the code's, in the normaliser). DASGO's released code
  takes no matrix root. tests/optim/test_asgo_authors_code.py steps ASGO (root "eigh" where PolarExpress has
  converged) and DASGO, and tests/optim/test_asgo_polar_express.py steps ASGO with root "polar-express" on an
  ill-conditioned statistic, beside a float64 transcription of that code.

Roots (eps > 0): (lambda + eps)^{-1/2} for each eigenvalue lambda of V clamped at 0 (rounding can make it
negative), exactly line 13. `eigenvalue_floor="resolution"` (structbench numerics, not the paper) first raises
eigenvalues below the float32 resolution of V, k * float32-eps * lambda_max, to that resolution: a float32 V
cannot resolve them, and accumulated V on an ill-conditioned problem with a tiny eps (1e-8) otherwise turns
that noise into gains of up to eps^{-1/2} and diverges where float64 does not. It changes the update wherever
the resolution exceeds about eps (lambda_max above eps / (k float32-eps): 0.011 for k = 768, eps = 1e-6).
eps = 0 is allowed with "eigh" and gives the pseudo-inverse root, which drops the eigenvalues below that
resolution (App. G proves ASGO = Muon with the compact SVD).

DASGO, Algorithm 3 (diagonal, right side, no tau):
    M_t = beta1 M_{t-1} + (1 - beta1) G_t ;  v_t = beta2 v_{t-1} + (1 - beta2) diag(G_t^T G_t)
    W_{t+1} = W_t - lr M_t diag(v_t + eps)^{-1/2}                 (eps inside the square root)
`side="left"` scales rows by the squared row norms instead (not in the paper).

Root "newton-schulz" (structbench's, not the paper's: matrix products only and no host read in the steady state, so
that a GPU need not run one cuSOLVER eigendecomposition per matrix every step, 373 ms per step at GPT-2-small x12 on
an H200 against Muon's 5.2 ms): each due root is `NEWTON_SCHULZ_UPDATES` (21) coupled Newton–Schulz updates from a
cold start (linalg.inverse_sqrt_cold_updates), which in exact arithmetic converge for every V + eps I with
||V + eps I||_F / lambda_min up to `NEWTON_SCHULZ_CONDITION` (1e6; with eps > 0, lambda_min >= eps). A warm start
from the previous root (linalg.inverse_sqrt_warm_updates) was measured and rejected: on the V of a tiny language
model (llama-tiny, beta2 0.95, eps 1e-6; cond(V + eps I) 1e3 to 1e6) the previous root's residual on the new V is
0.2 to 4 (V moves by O(1) relative to itself along its small eigenvalues) and no warm update lowered it at any step,
as the warm iteration diverges between eigenvalues more than 34 apart. Each root's residual
r = ||Z (V + eps I) Z - I||_F / sqrt(k) is checked on the device against `root_tol` (default 3e-2) and read a step
later (structbench.optim.deferred): a matrix that failed is given the eigh root of its current V at the start of
its next step, counted in its `root_fallbacks` (CPU state counter) and the optimizer's `root_fallbacks` (the run's
`root_fallbacks` column). The price: a root that failed its check is used for the step it was made in. A check
still pending when the state is saved is read into the state (`ROOT_DUE`), so that a resumed run repairs the same
matrices at the same step. A root with
residual r is within about (r sqrt(k) / 2) ||(V + eps I)^{-1/2}||_2 of the exact one in Frobenius norm (first
order; linalg.inverse_sqrt_warm_updates); root_tol 3e-2 lies below the 1 / sqrt(k) residual that a single
unconverged eigenvalue leaves (k up to 1100; GPT-2's k is 768) and above the float32 rounding level of converged
roots at cond 1e6 (measured 3e-3 to 1e-2: about u cond), and on those language-model statistics the Newton–Schulz root
was 5 to 20x closer to the float64 root than the float32 eigh root (relative Frobenius errors 2e-5 to 6e-3 against
2e-4 to 4e-2): float32 rounding, not the iteration, limits both at cond 1e6. eps = 0 (the pseudo-inverse),
eigenvalue_floor "resolution" and eps_placement "outside" need the eigenvalues: with any of them "newton-schulz"
computes every root by eigh, as "eigh" does (no fallback is counted).

Numerics: statistics, roots and the column norms are float32 whatever the parameter dtype; momentum has
the parameter's dtype. The inverse roots of all matrices of a param group that share a preconditioner size
are computed in one batched call. When a root fails (`SolverError` after linalg's float64 retry) the
matrix keeps its previous root (zero before its first successful one, so it stays put), `solver_failures`
counts one per matrix, and the error is re-raised after 3 consecutive failures of the same parameter.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from structbench.errors import SolverError
from structbench.optim.base import EagerStructuredOptimizer, StructuredOptimizer
from structbench.optim.deferred import DeferredCheck
from structbench.optim.hparams import Declaration, code, decade_around, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import adamw_fallback, adamw_state_bytes, hybrid_builder
from structbench.optim.linalg import (
    coupled_newton_schulz_updates,
    eigh_with_retry,
    from_eigenpairs,
    inverse_root_newton,
    inverse_sqrt_cold_updates,
    inverse_sqrt_polar_express,
)
from structbench.optim.partition import matrix_shape, matrix_view, parameter_kinds
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

SIDES = ("smaller", "left", "right")
DASGO_SIDES = ("right", "left")
PRECONDITION_SOURCES = ("grad", "momentum")
ACCUMULATIONS = ("ema", "sum")
EPS_PLACEMENTS = ("inside", "outside")
EIGENVALUE_FLOORS = ("none", "resolution")
ROOTS = ("newton-schulz", "eigh", "newton", "polar-express")
NEWTON_ITERS = 50
"""Coupled Newton iterations for `root="newton"` (App. C.3, Fig. 7c: 50 iterations)."""
POLAR_EXPRESS_STEPS = 10
"""PolarExpress iterations of `root="polar-express"`: infinity-stars/ASGO `optimizers/asgo.py` (commit d3ef14b) line
23 (`matalg_steps`), also its `LLMmodels/config/optimizer/asgo.yaml`."""
NEWTON_SCHULZ_CONDITION = 1e6
"""||V + eps I||_F / lambda_min up to which `root="newton-schulz"` converges in exact arithmetic (the cond 1e6 of
the statistics measured on a tiny language model; Table 4's eps 1e-6 reaches it when ||V||_F is about 1)."""
NEWTON_SCHULZ_UPDATES = coupled_newton_schulz_updates(NEWTON_SCHULZ_CONDITION, 1e-4)
"""Coupled Newton–Schulz updates per root (21): the smallest eigenvalue at that condition within 1e-4 of converged."""
ROOT_FALLBACKS = "root_fallbacks"
ROOT_DUE = "root_due"
"""State flag (a Python bool, present only when set) of a matrix whose root failed a check that `state_dict` read
before its repair: the resumed run repairs it at the same step as the run that saved it."""
_FLOAT32_EPS = torch.finfo(torch.float32).eps
PAPER = "An et al. (arXiv 2503.20762)"
RELEASED_CODE = "infinity-stars/ASGO optimizers/asgo.py, dasgo.py"

RELEASED_CODE_SWITCHES = Declaration(
    real("update_rms", 0.0, paper(f"{PAPER} Algs. 2-3 rescale nothing; {RELEASED_CODE} use 0.2"), "[0, inf)"),
    real("weight_decay", 0.0, paper(f"{PAPER} Algs. 2-3 decay nothing; {RELEASED_CODE} use 0.1"), "[0, inf)"),
)
"""What ASGO and DASGO's released code adds to the paper's algorithms, off by default."""


def _as_matrix(t: Tensor) -> Tensor:
    """A 1 x d row for a vector (or scalar), the (out, in*kh*kw) view of a conv filter, a matrix unchanged."""
    return t.reshape(1, -1) if t.ndim < 2 else matrix_view(t)


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    return (1, math.prod(shape)) if len(shape) < 2 else matrix_shape(shape)


def preconditions_left(shape: tuple[int, ...], side: str) -> bool:
    """Whether ASGO's preconditioner multiplies a parameter of `shape` from the left (Alg. 2 (i))."""
    rows, cols = _rows_cols(shape)
    if len(shape) < 2 or side == "smaller":
        return rows < cols
    return side == "left"


def preconditioner_size(shape: tuple[int, ...], side: str) -> int:
    """k of ASGO's k x k statistic for a parameter of `shape`: 1 for vectors, else the preconditioned side."""
    rows, cols = _rows_cols(shape)
    return rows if preconditions_left(shape, side) else cols


def inverse_root_from_eigenpairs(
    evals: Tensor, evecs: Tensor, eps: float, eps_placement: str, floor: bool = False
) -> Tensor:
    """(V + eps I)^{-1/2} ("inside", Alg. 2 line 13) or (V^{1/2} + eps I)^{-1} ("outside", Alg. 1) from V's
    eigenpairs, eigenvalues clamped at 0.

    With eps = 0, eigenvalues at or below the float32 resolution of V, k * float32-eps * lambda_max (k the matrix
    size), get a zero root (the pseudo-inverse). With `floor` and eps > 0 they are raised to that resolution
    before damping (the `eigenvalue_floor="resolution"` switch; not the paper's).
    """
    lam = evals.clamp_min(0.0)
    resolution = evals.size(-1) * _FLOAT32_EPS * lam.amax(dim=-1, keepdim=True)
    if floor and eps > 0.0:
        lam = torch.maximum(lam, resolution)
    roots = (lam + eps).rsqrt() if eps_placement == "inside" else (lam.sqrt() + eps).reciprocal()
    if eps == 0.0:
        roots = torch.where(lam > resolution, roots, torch.zeros_like(roots))
    return from_eigenpairs(roots, evecs)


def _descend(p: Tensor, update: Tensor, group: Mapping[str, Any]) -> None:
    """W <- W - lr U, U the float32 matrix update: after the released code's optional rescale of U to Frobenius
    norm update_rms * sqrt(mn) and its decoupled weight decay W <- (1 - lr wd) W."""
    if group["update_rms"] > 0.0:
        norm = torch.linalg.matrix_norm(update).clamp_min(torch.finfo(torch.float32).tiny)
        update = update * (group["update_rms"] * math.sqrt(update.numel()) / norm)
    lr, decay = group["lr"], group["weight_decay"]
    if decay != 0.0:
        p.mul_(1.0 - lr * decay)
    p.add_(update.view_as(p).to(p.dtype), alpha=-lr)


def uses_newton_schulz(group: Mapping[str, Any], size: int) -> bool:
    """Whether `root="newton-schulz"` computes the k x k roots of `group` by Newton–Schulz: it needs eps > 0 inside
    the root and no eigenvalue floor (else the eigenvalues are needed, and eigh computes them); a 1 x 1 root is a
    scalar."""
    return (
        group["root"] == "newton-schulz"
        and size > 1
        and group["eps"] > 0.0
        and group["eps_placement"] == "inside"
        and group["eigenvalue_floor"] == "none"
    )


def _released_code_roots(stack: Tensor, eps: float) -> Tensor:
    """The released code's inverse roots of a (k, d, d) stack: `POLAR_EXPRESS_STEPS` PolarExpress iterations
    (linalg.inverse_sqrt_polar_express), and the identity for a root with a non-finite entry (infinity-stars/ASGO
    `optimizers/asgo.py`, commit d3ef14b, lines 61-64; e.g. V = 0 with eps = 0), chosen on the device."""
    roots = inverse_sqrt_polar_express(stack, eps, POLAR_EXPRESS_STEPS)
    finite = roots.isfinite().all(dim=-1, keepdim=True).all(dim=-2, keepdim=True)
    return torch.where(finite, roots, torch.eye(stack.size(-1), dtype=roots.dtype, device=roots.device))


def _damped(stack: Tensor, eps: float) -> Tensor:
    """V + eps I for a (k, d, d) stack, as a new tensor."""
    damped = stack.clone()
    damped.diagonal(dim1=-2, dim2=-1).add_(eps)
    return damped


def _root_failure(p: Tensor, streak: int) -> str:
    return f"ASGO: the inverse root of a {tuple(p.shape)} parameter failed {streak} steps in a row"


class ASGO(EagerStructuredOptimizer):
    """ASGO, Algorithm 2 of An et al. (2025), over matrices, conv filters (as (out, in*kh*kw)) and vectors.

    State per parameter: `step` (float32 scalar), `momentum` (parameter dtype), `precond` (the k x k
    statistic V, float32), `inv_root` (its damped inverse root, float32) and, with `root="newton-schulz"`,
    `root_fallbacks` (int64: the eigh roots that repaired a failed Newton–Schulz root). Under torch.compile the
    step runs eagerly (`EagerStructuredOptimizer`): the deferred check and its fallback are data-dependent control
    flow.
    """

    cpu_state_keys = ("step", ROOT_FALLBACKS)
    """`step` is read on the host every step (is a refresh due?), `root_fallbacks` counts on the host: both stay on
    the CPU when state is loaded."""

    @property
    def root_fallbacks(self) -> int:
        """Eigendecompositions that repaired a failed `root="newton-schulz"` root, over all matrices and steps (the
        sum of the state counters, so that a resumed run keeps counting)."""
        return sum(int(state[ROOT_FALLBACKS]) for state in self.state.values() if ROOT_FALLBACKS in state)

    hparams = (
        Declaration(
            real("lr", 0.1, paper(f"{PAPER} Table 4, GPT-2 (NanoGPT, Table 3: 0.0147)"), "(0, inf)", decade_around()),
            real("beta1", 0.9, paper(f"{PAPER} Table 4 (Table 3: 0.9541)"), "[0, 1)", lin(0.85, 0.95)),
            real("beta2", 0.95, paper(f"{PAPER} Table 4 (Table 3: 0.8487)"), "[0, 1)"),
            real("eps", 1e-6, paper(f"{PAPER} Table 4; App. C.3's GPT-2 run used 0 with an SVD"), "[0, inf)"),
            integer("tau", 1, paper(f"{PAPER} Table 4 (Table 3: 15)"), "[1, inf)"),
            option("side", "smaller", SIDES, paper(f"{PAPER} Alg. 2 (i)")),
            option("precondition_from", "grad", PRECONDITION_SOURCES, paper(f"{PAPER} Alg. 2; 'momentum' is Eq. 4")),
            option("accumulation", "ema", ACCUMULATIONS, paper(f"{PAPER} Alg. 2 line 8; 'sum' is Alg. 1's")),
            option("eps_placement", "inside", EPS_PLACEMENTS, paper(f"{PAPER} Alg. 2 line 13; 'outside' is Alg. 1's")),
            option(
                "root",
                "newton-schulz",
                ROOTS,
                ours(
                    f"matrix products only, no host read (an eigh per matrix per step is {PAPER}'s cost on a GPU); "
                    "within root_tol of Alg. 2 line 13's exact root, eigh where the check fails; 'eigh' is exact "
                    "(App. C.3: an exact decomposition of V); 'polar-express' is the released code's "
                    "(infinity-stars/ASGO d3ef14b optimizers/utils/matrix_decom.py lines 98-125: 10 PolarExpress "
                    "iterations for V^(-1/2), eps in the normaliser only)"
                ),
            ),
            real(
                "root_tol",
                3e-2,
                ours("RMS of Z (V + eps I) Z - I accepted from 'newton-schulz': above float32 rounding at cond 1e6, "
                     "below one unconverged eigenvalue's 1/sqrt(k) for k <= 1100"),
                "(0, 1)",
            ),
            option(
                "eigenvalue_floor",
                "none",
                EIGENVALUE_FLOORS,
                paper(f"{PAPER} Alg. 2 line 13: (V + eps I)^(-1/2); 'resolution' floors at V's float32 resolution"),
            ),
        )
        + RELEASED_CODE_SWITCHES
    )

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], **hparams: Any) -> None:
        super().__init__(params, **hparams)
        self._root_streaks: dict[Tensor, int] = {}
        """Consecutive root failures per parameter (not part of the state: a resumed run starts them afresh)."""
        self._root_checks: dict[tuple[int, torch.device], tuple[DeferredCheck, list[Tensor]]] = {}
        """Per preconditioner size and device, the pending residual check of the last Newton–Schulz roots and the
        parameters they belong to, in the check's order."""

    def check_group(self, group: dict[str, Any]) -> None:
        if group["root"] == "newton" and (group["eps"] <= 0.0 or group["eps_placement"] != "inside"):
            raise ValueError('root="newton" computes (V + eps I)^{-1/2}: it needs eps > 0 and eps_placement="inside"')
        if group["root"] == "polar-express" and (
            group["eps_placement"] != "inside" or group["eigenvalue_floor"] != "none"
        ):
            raise ValueError(
                'root="polar-express" is the released code\'s root, eps in its normaliser only: it takes '
                'eps_placement="inside" and eigenvalue_floor="none"'
            )

    def step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if params:
            self._step_matrices(group, params)

    def _step_matrices(self, group: dict[str, Any], params: list[Tensor]) -> None:
        due: dict[tuple[int, torch.device], list[Tensor]] = defaultdict(list)
        for p in params:
            state = self._state(p, group)
            self._update_statistics(p, state, group)
            if int(state["step"]) % group["tau"] == 0:
                due[(state["precond"].size(-1), p.device)].append(p)
        repaired = self._repair_failed_roots(group)
        for key, owned in due.items():
            rest = [p for p in owned if id(p) not in repaired]
            if rest:
                self._refresh_inverse_roots(rest, group, key)
        for p in params:
            self._apply_update(p, self.state[p], group)

    def _state(self, p: Tensor, group: Mapping[str, Any]) -> dict[str, Tensor]:
        state = self.state[p]
        if not state:
            k = preconditioner_size(tuple(p.shape), group["side"])
            state["step"] = torch.zeros((), dtype=torch.float32, device="cpu")
            state["momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["precond"] = torch.zeros(k, k, dtype=torch.float32, device=p.device)
            state["inv_root"] = torch.zeros(k, k, dtype=torch.float32, device=p.device)
            if group["root"] == "newton-schulz":
                state[ROOT_FALLBACKS] = torch.zeros((), dtype=torch.int64, device="cpu")
        return state

    @staticmethod
    def _oriented(t: Tensor, left: bool) -> Tensor:
        """The float32 matrix whose rows are the preconditioned side: M for the left side, M^T for the right."""
        matrix = _as_matrix(t).float()
        return matrix if left else matrix.mT

    def _update_statistics(self, p: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        """Alg. 2 lines 6-11: the momentum EMA, then V from G_t (or from M_t for Eq. 4)."""
        momentum = state["momentum"]
        momentum.lerp_(p.grad, 1.0 - group["beta1"])
        source = p.grad if group["precondition_from"] == "grad" else momentum
        x = self._oriented(source, preconditions_left(tuple(p.shape), group["side"]))
        precond = state["precond"]
        if group["accumulation"] == "ema":
            precond.mul_(group["beta2"]).addmm_(x, x.mT, alpha=1.0 - group["beta2"])
        else:
            precond.addmm_(x, x.mT)

    def state_dict(self) -> dict[str, Any]:
        """The state, with every pending root check read into its failed matrices' state (`ROOT_DUE`), so that a
        resumed run repairs them at the same step as this one."""
        for key, (check, owners) in list(self._root_checks.items()):
            for i in check.take():
                self.state[owners[i]][ROOT_DUE] = True
            del self._root_checks[key]
        return super().state_dict()

    def _repair_failed_roots(self, group: Mapping[str, Any]) -> set[int]:
        """The eigh root of the current V for each matrix of this group whose last Newton–Schulz root failed its
        residual check (read a step late: `structbench.optim.deferred`; or settled into `ROOT_DUE` by
        `state_dict`), each counted in `root_fallbacks`. Returns the ids of the parameters repaired (ids: a tensor's
        `in` would compare values under torch.compile)."""
        members = {id(p) for p in group["params"]}
        failed: dict[tuple[int, torch.device], list[Tensor]] = defaultdict(list)
        for key, (check, owners) in list(self._root_checks.items()):
            if not owners or id(owners[0]) not in members:
                continue
            failed[key] += [owners[i] for i in check.take()]
            del self._root_checks[key]
        for p in group["params"]:
            if p in self.state and self.state[p].pop(ROOT_DUE, False):
                failed[(self.state[p]["precond"].size(-1), p.device)].append(p)
        repaired: set[int] = set()
        for key, owned in failed.items():
            if not owned:
                continue
            self._refresh_inverse_roots(owned, {**group, "root": "eigh"}, key)
            for p in owned:
                self.state[p][ROOT_FALLBACKS] += 1
            repaired.update(id(p) for p in owned)
        return repaired

    def _refresh_inverse_roots(
        self, owned: list[Tensor], group: Mapping[str, Any], key: tuple[int, torch.device]
    ) -> None:
        """Alg. 2 line 13 for every matrix in `owned` (all with the same k), in one batched call; Newton–Schulz
        roots post their residual check under `key`."""
        stack = torch.stack([self.state[p]["precond"] for p in owned])
        if uses_newton_schulz(group, stack.size(-1)):
            found = inverse_sqrt_cold_updates(
                _damped(stack, group["eps"]), updates=NEWTON_SCHULZ_UPDATES, tol=group["root_tol"], symmetric=True
            )
            check = DeferredCheck()
            check.post(~found.converged)
            self._root_checks[key] = (check, owned)
            for p, root in zip(owned, found.root.unbind(0), strict=True):
                self.state[p]["inv_root"].copy_(root)
            return
        try:
            roots = self._inverse_roots(stack, group)
        except SolverError:
            for p in owned:
                self.solver_failed(self._root_streaks, p, partial(_root_failure, p))
            return
        for p, root in zip(owned, roots.unbind(0), strict=True):
            self.state[p]["inv_root"].copy_(root)
            self.solver_ok(self._root_streaks, p, forget=True)

    @staticmethod
    def _inverse_roots(stack: Tensor, group: Mapping[str, Any]) -> Tensor:
        eps, placement = group["eps"], group["eps_placement"]
        floor = group["eigenvalue_floor"] == "resolution"
        if group["root"] == "polar-express":
            return _released_code_roots(stack, eps)
        if stack.size(-1) == 1:
            return inverse_root_from_eigenpairs(stack[..., 0], torch.ones_like(stack), eps, placement, floor)
        if group["root"] == "newton":
            return inverse_root_newton(stack, 2, eps=eps, max_iters=NEWTON_ITERS, relative_eps=False)
        evals, evecs = eigh_with_retry(stack)
        return inverse_root_from_eigenpairs(evals, evecs, eps, placement, floor)

    def _apply_update(self, p: Tensor, state: dict[str, Tensor], group: Mapping[str, Any]) -> None:
        """Alg. 2 lines 17-21, after the optional decoupled weight decay; then t <- t + 1."""
        momentum, inv_root = _as_matrix(state["momentum"]).float(), state["inv_root"]
        left = preconditions_left(tuple(p.shape), group["side"])
        _descend(p, inv_root @ momentum if left else momentum @ inv_root, group)
        state["step"] += 1


class DASGO(StructuredOptimizer):
    """DASGO, Algorithm 3 of An et al. (2025), over matrices and conv filters (as (out, in*kh*kw)).

    State per parameter: `momentum` (parameter dtype) and `col_sq` (the EMA of squared column norms,
    float32; squared row norms with side="left").
    """

    hparams = (
        Declaration(
            real("lr", 0.01, paper(f"{PAPER} Table 4, GPT-2 (NanoGPT, Table 3: 0.06)"), "(0, inf)", decade_around()),
            real("beta1", 0.9, paper(f"{PAPER} Table 4 (Table 3: 0.9584)"), "[0, 1)", lin(0.85, 0.95)),
            real("beta2", 0.99, paper(f"{PAPER} Table 4 (Table 3: 0.9435)"), "[0, 1)"),
            real("eps", 1e-6, paper(f"{PAPER} Table 4, inside the square root (Alg. 3)"), "[0, inf)"),
            option("side", "right", DASGO_SIDES, paper(f"{PAPER} Alg. 3; 'left' (row norms) is not in the paper")),
        )
        + RELEASED_CODE_SWITCHES
    )

    def check_group(self, group: dict[str, Any]) -> None:
        for p in group["params"]:
            if p.ndim < 2:
                raise ValueError(
                    f"DASGO optimizes matrices only; got a parameter of shape {tuple(p.shape)}. "
                    "Give 1-D parameters to the fallback optimizer (make_optimizer does this)."
                )

    def step_group(self, group: dict[str, Any]) -> None:
        for p in group["params"]:
            if p.grad is not None:
                self._step_param(p, group)

    def _step_param(self, p: Tensor, group: Mapping[str, Any]) -> None:
        """Alg. 3 lines 6-8, after the optional decoupled weight decay."""
        right = group["side"] == "right"
        state = self.state[p]
        if not state:
            rows, cols = matrix_shape(tuple(p.shape))
            state["momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["col_sq"] = torch.zeros(cols if right else rows, dtype=torch.float32, device=p.device)
        momentum, col_sq = state["momentum"], state["col_sq"]
        momentum.lerp_(p.grad, 1.0 - group["beta1"])
        grad = matrix_view(p.grad).float()
        col_sq.mul_(group["beta2"]).add_(grad.square().sum(dim=0 if right else 1), alpha=1.0 - group["beta2"])
        damped = col_sq + group["eps"]
        scale = torch.where(damped > 0, damped.rsqrt(), torch.zeros_like(damped))
        matrix = matrix_view(momentum).float()
        _descend(p, matrix * scale if right else matrix * scale.unsqueeze(1), group)


# ---- registry entries ----

CODE_ADAM = adamw_fallback(
    code(f"{RELEASED_CODE}: Adam at the matrix lr"), lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0
)
"""infinity-stars/ASGO's Adam for 1-D params and embeddings: betas (0.9, 0.95), eps 1e-8, wd 0, the matrix lr."""

ASGO_ROUTING = Declaration(
    option("one_d", "asgo", ("asgo", "adamw"), paper(f"{PAPER} App. B (i): a scalar AdaGrad-Norm preconditioner")),
    option("embeddings", "asgo", ("asgo", "adamw"), paper(f"{PAPER} App. B: every parameter through ASGO")),
)
DASGO_ROUTING = Declaration(
    option("embeddings", "adamw", ("dasgo", "adamw"), code(f"{RELEASED_CODE}; the paper does not say")),
)


def _routing(model: nn.Module | None, named: NamedParams, one_d: str, embeddings: str) -> Routing:
    """Structured unless a switch sends 1-D parameters or embedding tables to AdamW; the head stays structured."""
    kinds = parameter_kinds(model, named)

    def to_fallback(name: str, p: Tensor) -> bool:
        if p.ndim < 2:
            return one_d == "adamw"
        return kinds[name] == "embedding" and embeddings == "adamw"

    fallback = tuple(name for name, p in named if to_fallback(name, p))
    structured = tuple(name for name, _ in named if name not in fallback)
    return Routing(structured=structured, fallback=fallback, fallback_name="adamw" if fallback else None)


def _route_asgo(model: nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    return _routing(model, named, hp["one_d"], hp["embeddings"])


def _route_dasgo(model: nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    return _routing(model, named, "adamw", hp["embeddings"])


def asgo_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """Per owned parameter: float32 momentum, V and its inverse root (k x k each), a float32 step and, with
    `root="newton-schulz"`, an int64 `root_fallbacks`; + AdamW's."""
    total = adamw_state_bytes(fallback)
    counter = 8 if hp["root"] == "newton-schulz" else 0
    for shape in structured:
        k = preconditioner_size(shape, hp["side"])
        total += 4 * math.prod(shape) + 2 * 4 * k * k + 4 + counter
    return total


def dasgo_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """Per owned matrix: float32 momentum and one float32 norm per column (row, side="left"); + AdamW's."""
    total = adamw_state_bytes(fallback)
    for shape in structured:
        rows, cols = matrix_shape(shape)
        total += 4 * math.prod(shape) + 4 * (cols if hp["side"] == "right" else rows)
    return total


TITLE = "An et al. 2025, 'ASGO: Adaptive Structured Gradient Optimization', NeurIPS (arXiv 2503.20762)"

ASGO_ENTRY = register(
    OptimizerEntry(
        name="asgo",
        refresh_interval="tau",
        summary="ASGO: one-sided full-matrix preconditioner (V + eps I)^{-1/2} from EMA G G^T on the smaller side",
        reference=f"{TITLE}, App. B, Algorithm 2",
        hparams=ASGO.hparams + ASGO_ROUTING + CODE_ADAM,
        build=hybrid_builder(ASGO),
        route=_route_asgo,
        notes=(
            "The head is ASGO's (paper and code). Table 4's eps 1e-6 contradicts App. C.3 (GPT-2 used eps 0 with an "
            "SVD); eps 0 is allowed (pseudo-inverse root). Roots are Alg. 2 line 13's (V + eps I)^(-1/2); "
            "eigenvalue_floor 'resolution' first raises eigenvalues below V's float32 resolution (k fp32-eps "
            "lambda_max) to it (structbench numerics, not the paper: float32 statistics cannot resolve them). "
            "Default root 'newton-schulz' (structbench's numerics, not the paper's): 21 cold coupled Newton–Schulz "
            "updates, matrix products only, residual RMS(Z (V + eps I) Z - I) checked against root_tol 3e-2 a step "
            "later, failed matrices repaired by eigh and counted in root_fallbacks; eps 0, the resolution floor and "
            "eps outside take eigh; root 'eigh' is the exact decomposition. "
            "root 'newton' is the coupled Newton of Fig. 7c (50 iterations). "
            "Switches for the released code (infinity-stars/ASGO): update_rms 0.2, weight_decay 0.1, beta2 0.8, "
            "eps 1e-10, root 'polar-express' (its 10 PolarExpress iterations for V^(-1/2), eps only in the "
            "normaliser: within 5e-5 of (V + eps I)^(-1/2) down to eigenvalues 1e-6 ||V||_F, 0.7 off at 1e-10), "
            "one_d/embeddings 'adamw' (the adamw_* keys). accumulation 'sum' + eps_placement 'outside' + beta1 0 + "
            "side 'left' is Algorithm 1. Head-wise Q/K preconditioning (App. B) is not implemented."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=asgo_state_bytes,
        check_hparams={"tau": 2},
    )
)

DASGO_ENTRY = register(
    OptimizerEntry(
        name="dasgo",
        summary="DASGO: diagonal ASGO, momentum scaled per column by (EMA squared column norm + eps)^{-1/2}",
        reference=f"{TITLE}, App. B, Algorithm 3",
        hparams=DASGO.hparams + DASGO_ROUTING + CODE_ADAM,
        build=hybrid_builder(DASGO),
        route=_route_dasgo,
        notes=(
            "The paper does not say how DASGO treats 1-D params and embeddings: as in the released code "
            "(infinity-stars/ASGO) they go to Adam (the adamw_* keys); embeddings='dasgo' keeps embedding tables in "
            "DASGO. The head is DASGO's (code). Switches for the code: update_rms 0.2 (update RMS), weight_decay "
            "0.1, beta2 0.95, eps 1e-8 (the code takes no matrix root)."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=dasgo_state_bytes,
    )
)
