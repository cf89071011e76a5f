"""SOAP and Eigen-Adam: Adam run in the eigenbasis of Shampoo's factors (two-sided) or of one factor.

SOAP — Vyas et al. (2024), "SOAP: Improving and Stabilizing Shampoo using Adam" (arXiv 2409.11321),
Algorithm 3, as coded in the reference implementation nikhilvyas/SOAP `soap.py` (a1e5535), which
structbench follows where Algorithm 3 is silent (the first step's skip, the eigenvalue sort). For a
matrix G (conv filters viewed as (out, in*kh*kw); the reference instead keeps one factor per tensor dimension):

    L <- b3 L + (1-b3) G G^T,   R <- b3 R + (1-b3) G^T G        (b3 = shampoo_beta, -1 means b2)
    G' = Q_L^T G Q_R                                             (rotate into the eigenbasis)
    m <- b1 m + (1-b1) G;  m' = Q_L^T m Q_R                      (first moment in the original space)
    v <- b2 v + (1-b2) G'^2                                      (second moment in the rotated space)
    W <- W - lr sqrt(1-b2^t)/(1-b1^t) Q_L (m' / (sqrt(v) + eps)) Q_R^T
    W <- W - lr wd W                                             (decoupled, after the update, raw lr)

Checked side by side with a float64 transcription of that file (tests/optim/test_soap_authors_code.py): with its
switches, `orthonormalize="householder"` and `momentum_in_eigenbasis=True`, and with the paper's moment, W follows it
to float32 rounding through every refresh on wide, tall, square and conv parameters; the reference's
`merge_dims=True`, with a max_precond_dim that in*kh*kw reaches and out*in exceeds, gives our conv view.

Reference order (`basis_from_current_grad=False`, SOAP's default): the first step only sets L, R and
Q = eigh (columns by descending eigenvalue) and leaves W unchanged; t counts the steps after it; L and R
take the current gradient after the update; every `precondition_frequency` steps the basis is refreshed
by one power iteration + QR: eigenvalues estimated as diag(Q^T L Q), sorted descending, v permuted the same
way, Q <- qr(L Q_sorted).

Eigen-Adam — Gong, Scetbon, Ma, Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher
Approximation with a Low-Rank Extension", Sec. 3.4, Eq. 13 and Algorithm 7 (= AdaDiag = one-sided
SOAP): the same update with only Q_L, the eigenbasis of EMA(G G^T) on the smaller side (the paper
assumes m <= n; a tall matrix uses G^T G). Algorithm 7's order is `basis_from_current_grad=True`: at
step t the statistic takes G_t first, then the basis is the full EVD of it when t == 1 or t mod K == 0,
then the Adam step, with no skipped step, no bias correction and no weight decay.

Both are one class, `SOAP`; `EigenAdam` only changes its defaults. Switches:
- `momentum_in_eigenbasis`: keep m in the rotated space and rotate it (back with the old basis, forward
  with the new) only when the basis changes, as the optax port does; the reference's Dec. 2024 change
  (f42d296) keeps m rotated too but re-projects it every step. In exact arithmetic it equals the paper
  version, since between refreshes the rotation is linear and fixed; it saves one projection per step.
- `refresh`: "qr" (power iteration + QR, SOAP) or "eigh" (full EVD, Algorithm 7).
- `orthonormalize`, the QR of the "qr" refresh: "cholesky-qr2" (default; `linalg.cholesky_qr2`: two Cholesky-QR
  passes over the stacked products, batched Cholesky factorisations and triangular solves where a GPU's
  cuSOLVER runs Householder QR one matrix at a time) or "householder" (`torch.linalg.qr`, the reference's).
  Deviation from the reference: Q is QR's Q with diag(R) > 0, so a column may have the opposite sign to
  LAPACK's (the update is unchanged: a column's sign cancels in Q (m' / (sqrt(v) + eps)) Q^T, and v holds squares);
  otherwise it agrees to rounding while the product with unit columns has condition < about u^{-1/2} (4096 in
  float32); a matrix whose Cholesky fails or whose Q is further from orthonormal than Householder QR's level
  (||Q^T Q - I||_F > 8 n sqrt(n) u, `linalg.cholesky_qr2_tolerance`: 1.0e-2 at n = 768 in float32) is recomputed
  by Householder QR and counted in its `qr_fallbacks` (the optimizer's `root_fallbacks`, recorded with the run).
  Eigen-Adam's default refresh stays "eigh": Algorithm 7 prescribes the full EVD, which one power iteration does not
  compute; its `refresh="qr"` takes this switch too.
- `matmul_precision` ("float32" default, "tf32", "bfloat16"; `structbench.optim.precision`): the precision of the
  step's rotations Q_L^T G Q_R, Q_L^T m Q_R and Q_L N Q_R^T (operands rounded, float32 accumulation). Each
  product deviates from float32 by <= `precision.product_error_bound` |A| |B| entrywise; the statistics, their
  power iteration and the momentum's rotation at a refresh stay float32. The default is float32, the reference's
  (no GPU was at hand to measure what a lower precision saves).
- `staggered_refresh` (default off, the reference's schedule: every matrix at t mod f == 0, f =
  `precondition_frequency`): each matrix gets a phase, its position among the group's same-shape matrices modulo f
  (assigned at its first step, kept in its state as `refresh_phase`), and refreshes at the steps t with t mod f ==
  phase (t >= 1; t > 1 with `basis_from_current_grad`), still every f steps, so each step refreshes about 1/f of
  the matrices and none carries all the refreshes. A deviation from both papers' schedules (a matrix's first
  refresh comes after phase steps instead of f).
- `sides`: "both" (SOAP), "smaller" (Eigen-Adam), "left" or "right". A dimension above
  `max_precond_dim` is never rotated (identity), as in the reference.
- `correct_bias`, `eps`, `normalize_grads` (update / (1e-30 + RMS(update)), the reference's form).

All state is float32 whatever the parameter dtype: per rotated side the factor statistic (`gg_left` /
`gg_right`) and its basis (`q_left` / `q_right`), plus `exp_avg` and `exp_avg_sq` (moments in float32 too,
not the parameter dtype, so bfloat16 runs keep their statistics), and Python ints `step` and
`failures_in_a_row` (and `qr_fallbacks`, `refresh_phase` once used). With `batch_matrices` "on" ("auto" on CUDA),
same-shape matrices are stacked and run through one batched eigh / QR / matmul; "off" ("auto" elsewhere) steps them
one at a time (`base.BATCH_MODES`).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from torch import Tensor

from structbench.errors import SolverError
from structbench.optim.base import BATCH_MATRICES, EagerStructuredOptimizer, gather, stacks_matrices
from structbench.optim.distributed import DISTRIBUTED
from structbench.optim.hparams import Declaration, code, decade_around, flag, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import (
    ADAMW_FALLBACK,
    adamw_fallback,
    adamw_form,
    fallback_state_bytes,
    hybrid_builder,
)
from structbench.optim.linalg import cholesky_qr2, eigh_with_retry
from structbench.optim.partition import matrix_shape, matrix_view, split
from structbench.optim.precision import MATMUL_PRECISIONS, matmul
from structbench.optim.racs import PAPER as RACS_ALICE_PAPER
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

SIDES = ("both", "smaller", "left", "right")
REFRESH_METHODS = ("qr", "eigh")
ORTHONORMALIZATIONS = ("cholesky-qr2", "householder")
QR_FALLBACKS = "qr_fallbacks"
REFRESH_PHASE = "refresh_phase"
_SIDE_NAMES = ("left", "right")
REFERENCE = "nikhilvyas/SOAP soap.py (a1e5535)"


def rotated_sides(rows: int, cols: int, sides: str, max_precond_dim: int) -> tuple[bool, bool]:
    """Which sides of a (rows, cols) matrix get an eigenbasis: (left, right)."""
    if sides == "both":
        left, right = True, True
    elif sides == "smaller":
        left, right = rows <= cols, rows > cols
    else:
        left, right = sides == "left", sides == "right"
    return left and rows <= max_precond_dim, right and cols <= max_precond_dim


def _scatter(batch: Tensor, tensors: list[Tensor]) -> None:
    """Write a batch made by `base.gather` (and changed in place, or recomputed) back into its tensors."""
    for target, value in zip(tensors, batch.unbind(0), strict=True):
        if target.data_ptr() != value.data_ptr():
            target.copy_(value)


def _rotate(
    x: Tensor, q_left: Tensor | None, q_right: Tensor | None, back: bool = False, precision: str = "float32"
) -> Tensor:
    """Q_L^T X Q_R into the eigenbasis, or Q_L X Q_R^T back (`back`), each product in `precision`; a missing side
    is the identity."""
    if q_left is not None:
        x = matmul(q_left if back else q_left.mT, x, precision)
    if q_right is not None:
        x = matmul(x, q_right.mT if back else q_right, precision)
    return x


def _accumulate(gg: Tensor, g: Tensor, side: str, beta: float) -> None:
    """gg <- beta gg + (1-beta) G G^T (left) or G^T G (right), in place."""
    if side == "left":
        gg.baddbmm_(g, g.mT, beta=beta, alpha=1.0 - beta)
    else:
        gg.baddbmm_(g.mT, g, beta=beta, alpha=1.0 - beta)


def _permute(v: Tensor, order: Tensor, side: str) -> Tensor:
    """Reorder v's rows (left) or columns (right) by `order` (B, k)."""
    if side == "left":
        return v.gather(-2, order.unsqueeze(-1).expand_as(v))
    return v.gather(-1, order.unsqueeze(-2).expand_as(v))


def _due(state: dict[str, Any], every: int) -> bool:
    """Whether a matrix's basis is refreshed at its current step: t mod f == its phase (0 unless staggered)."""
    return state["step"] % every == state.get(REFRESH_PHASE, 0)


def _eigenbasis(gg: Tensor) -> tuple[Tensor, list[bool]]:
    """Eigenvectors of each matrix in the batch, by descending eigenvalue, and which decompositions succeeded.

    One batched `eigh_with_retry`; when it fails for a batch of several, each matrix is retried alone so that
    only the failing ones are reported (their basis in the result is the identity, for the caller to replace).
    """
    try:
        _, vectors = eigh_with_retry(gg)
        return vectors.flip(-1), [True] * gg.size(0)
    except SolverError:
        if gg.size(0) == 1:
            return torch.eye(gg.size(-1), dtype=torch.float32, device=gg.device).expand_as(gg), [False]
        bases, ok = [], []
        for matrix in gg.unbind(0):
            try:
                _, vectors = eigh_with_retry(matrix)
                bases.append(vectors.flip(-1))
                ok.append(True)
            except SolverError:
                bases.append(torch.eye(matrix.size(-1), dtype=torch.float32, device=matrix.device))
                ok.append(False)
        return torch.stack(bases), ok


def _power_qr(gg: Tensor, q: Tensor, orthonormalize: str) -> tuple[Tensor, Tensor, list[bool], tuple[int, ...]]:
    """SOAP's refresh: est = diag(Q^T GG Q), sort descending, Q <- qr(GG Q_sorted) by `orthonormalize`.
    Returns (Q, order, ok, the indices that fell back from Cholesky-QR2 to Householder QR)."""
    product = torch.matmul(gg, q)
    estimates = (q * product).sum(dim=-2)
    order = torch.argsort(estimates, dim=-1, descending=True, stable=True)
    ordered = product.gather(-1, order.unsqueeze(-2).expand_as(product))
    if orthonormalize == "cholesky-qr2":
        result = cholesky_qr2(ordered)
        new_q, fallbacks = result.q, result.fallbacks
    else:
        new_q, fallbacks = torch.linalg.qr(ordered)[0], ()
    ok = torch.isfinite(new_q).flatten(1).all(dim=1).tolist()
    return new_q, order, ok, fallbacks


class SOAP(EagerStructuredOptimizer):
    """Adam in the eigenbasis of Shampoo's factors (SOAP); `sides="smaller"` gives one-sided SOAP / Eigen-Adam.

    The step runs eagerly inside a compiled training step: its eigh / QR refreshes and Python-int step counters
    do not trace, and the matrix products gain nothing from compilation.
    """

    matrices_only = "SOAP"
    hparams = (
        Declaration(
            real("lr", 3e-3, code(REFERENCE), "(0, inf)", decade_around()),
            real("beta1", 0.95, code(REFERENCE), "[0, 1)", lin(0.91, 0.99)),
            real("beta2", 0.95, code(REFERENCE), "[0, 1)"),
            real("shampoo_beta", -1.0, code(f"{REFERENCE}: a negative value means beta2"), "(-inf, 1)"),
            real("eps", 1e-8, code(f"{REFERENCE}: added to sqrt(v)"), "[0, inf)"),
            real("weight_decay", 0.01, code(f"{REFERENCE}: after the update, with the raw lr"), "[0, inf)"),
            integer("precondition_frequency", 10, code(REFERENCE), "[1, inf)"),
            integer("max_precond_dim", 10000, code(f"{REFERENCE}: a larger side is never rotated"), "[0, inf)"),
            flag("normalize_grads", False, code(REFERENCE)),
            flag("correct_bias", True, code(REFERENCE)),
            option("sides", "both", SIDES, code(f"{REFERENCE}: both factors")),
            flag(
                "momentum_in_eigenbasis", False, paper("Vyas et al. (arXiv 2409.11321) Alg. 3: m in the original space")
            ),
            flag("basis_from_current_grad", False, code(f"{REFERENCE}: the first step only sets L, R and Q")),
            option("refresh", "qr", REFRESH_METHODS, code(f"{REFERENCE}: one power iteration + QR")),
            option(
                "orthonormalize",
                "cholesky-qr2",
                ORTHONORMALIZATIONS,
                ours("batched; QR's Q (diag(R) > 0) to rounding, Householder where its check fails (module doc)"),
            ),
            option("matmul_precision", "float32", MATMUL_PRECISIONS, code(f"{REFERENCE}: float32 rotations")),
            flag("staggered_refresh", False, code(f"{REFERENCE}: every matrix refreshes at t mod f == 0")),
        )
        + BATCH_MATRICES
    )
    hparams = hparams + DISTRIBUTED

    @property
    def root_fallbacks(self) -> int:
        """Householder QRs that `orthonormalize="cholesky-qr2"` fell back to, over all matrices and refreshes (the sum
        of the state counters, so a resumed run keeps counting): the run's `root_fallbacks` column."""
        return sum(state.get(QR_FALLBACKS, 0) for state in self.state.values())

    def step_group(self, group: dict[str, Any]) -> None:
        """One SOAP step for every parameter of the group with a gradient (see the module doc for the order)."""
        buckets: dict[tuple[Any, ...], list[Tensor]] = {}
        same_shape: Counter[tuple[Any, ...]] = Counter()
        for index, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            rows, cols = matrix_shape(p.shape)
            state = self.state[p]
            if "step" in state:
                sides = ("q_left" in state, "q_right" in state)
            else:
                sides = rotated_sides(rows, cols, group["sides"], group["max_precond_dim"])
                if group["staggered_refresh"]:
                    state[REFRESH_PHASE] = same_shape[(rows, cols, *sides)] % group["precondition_frequency"]
            same_shape[(rows, cols, *sides)] += 1
            alone = None if stacks_matrices(group["batch_matrices"], p.device) else index
            buckets.setdefault((rows, cols, *sides, p.device, alone), []).append(p)
        for (rows, cols, left, right, _, _), params in buckets.items():
            self._step_bucket(group, params, rows, cols, (left, right))

    def _step_bucket(
        self, group: dict[str, Any], params: list[Tensor], rows: int, cols: int, sides: tuple[bool, bool]
    ) -> None:
        """One step for same-shape matrices that rotate the same sides, batched (or for one matrix)."""
        fresh = ["step" not in self.state[p] for p in params]
        for p, new in zip(params, fresh, strict=True):
            if new:
                self._init_state(self.state[p], rows, cols, sides, p.device)
        grads = gather([matrix_view(p.grad).to(torch.float32) for p in params])
        states = [self.state[p] for p in params]
        beta3 = group["shampoo_beta"] if group["shampoo_beta"] >= 0 else group["beta2"]
        every = group["precondition_frequency"]
        if group["basis_from_current_grad"]:
            for state in states:
                state["step"] += 1
            self._accumulate_statistics(states, grads, beta3)
            first = [i for i, state in enumerate(states) if state["step"] == 1]
            due = [i for i, state in enumerate(states) if state["step"] > 1 and _due(state, every)]
            self._initial_basis([states[i] for i in first])
            self._refresh_basis(group, [states[i] for i in due])
            self._adam_step(group, params, states, grads)
            return
        running = [i for i, new in enumerate(fresh) if not new]
        first = [i for i, new in enumerate(fresh) if new]
        if first:
            first_grads = grads[first] if running else grads
            self._accumulate_statistics([states[i] for i in first], first_grads, beta3)
            self._initial_basis([states[i] for i in first])
        if not running:
            return
        run_params = [params[i] for i in running]
        run_states = [states[i] for i in running]
        run_grads = grads[running] if first else grads
        for state in run_states:
            state["step"] += 1
        self._adam_step(group, run_params, run_states, run_grads)
        self._accumulate_statistics(run_states, run_grads, beta3)
        self._refresh_basis(group, [state for state in run_states if _due(state, every)])

    @staticmethod
    def _init_state(
        state: dict[str, Any], rows: int, cols: int, sides: tuple[bool, bool], device: torch.device
    ) -> None:
        state["step"] = 0
        state["failures_in_a_row"] = 0
        for side, size, rotated in zip(_SIDE_NAMES, (rows, cols), sides, strict=True):
            if rotated:
                state[f"gg_{side}"] = torch.zeros(size, size, dtype=torch.float32, device=device)
                state[f"q_{side}"] = torch.zeros(size, size, dtype=torch.float32, device=device)
        state["exp_avg"] = torch.zeros(rows, cols, dtype=torch.float32, device=device)
        state["exp_avg_sq"] = torch.zeros(rows, cols, dtype=torch.float32, device=device)

    @staticmethod
    def _sides(states: list[dict[str, Any]]) -> list[str]:
        return [side for side in _SIDE_NAMES if f"q_{side}" in states[0]]

    def _accumulate_statistics(self, states: list[dict[str, Any]], grads: Tensor, beta3: float) -> None:
        for side in self._sides(states):
            tensors = [state[f"gg_{side}"] for state in states]
            gg = gather(tensors)
            _accumulate(gg, grads, side, beta3)
            _scatter(gg, tensors)

    def _initial_basis(self, states: list[dict[str, Any]]) -> None:
        """Q <- eigh of the statistic (columns by descending eigenvalue); the identity where eigh fails."""
        if not states:
            return
        failed = [False] * len(states)
        for side in self._sides(states):
            bases, ok = _eigenbasis(gather([state[f"gg_{side}"] for state in states]))
            _scatter(bases, [state[f"q_{side}"] for state in states])
            failed = [f or not good for f, good in zip(failed, ok, strict=True)]
        self._record_failures(states, failed)

    def _refresh_basis(self, group: dict[str, Any], states: list[dict[str, Any]]) -> None:
        """Refresh Q by power iteration + QR (permuting exp_avg_sq) or by eigh; keep Q where that fails."""
        sides = self._sides(states) if states else []
        if not sides:
            return
        in_eigenbasis = group["momentum_in_eigenbasis"]
        old = {side: gather([state[f"q_{side}"] for state in states]) for side in sides}
        if in_eigenbasis:
            exp_avg = _rotate(
                gather([state["exp_avg"] for state in states]), old.get("left"), old.get("right"), back=True
            )
        exp_avg_sq = gather([state["exp_avg_sq"] for state in states])
        new: dict[str, Tensor] = {}
        failed = [False] * len(states)
        for side in sides:
            gg = gather([state[f"gg_{side}"] for state in states])
            if group["refresh"] == "qr":
                basis, order, ok, fallbacks = _power_qr(gg, old[side], group["orthonormalize"])
                for i in fallbacks:
                    states[i][QR_FALLBACKS] = states[i].get(QR_FALLBACKS, 0) + 1
            else:
                basis, ok = _eigenbasis(gg)
                order = None
            if not all(ok):
                keep = torch.tensor(ok, device=basis.device).logical_not()
                basis = torch.where(keep[:, None, None], old[side], basis)
                if order is not None:
                    identity = torch.arange(order.size(-1), device=order.device).expand_as(order)
                    order = torch.where(keep[:, None], identity, order)
            if order is not None:
                exp_avg_sq = _permute(exp_avg_sq, order, side)
            new[side] = basis
            failed = [f or not good for f, good in zip(failed, ok, strict=True)]
        for side in sides:
            _scatter(new[side], [state[f"q_{side}"] for state in states])
        _scatter(exp_avg_sq, [state["exp_avg_sq"] for state in states])
        if in_eigenbasis:
            _scatter(_rotate(exp_avg, new.get("left"), new.get("right")), [state["exp_avg"] for state in states])
        self._record_failures(states, failed)

    def _record_failures(self, states: list[dict[str, Any]], failed: list[bool]) -> None:
        for state, fail in zip(states, failed, strict=True):
            if fail:
                self.solver_failed(state, "failures_in_a_row", self._basis_failure)
            else:
                self.solver_ok(state, "failures_in_a_row")

    def _basis_failure(self, streak: int) -> str:
        return f"{type(self).__name__}: the eigenbasis of a parameter failed {streak} refreshes in a row"

    def _adam_step(
        self, group: dict[str, Any], params: list[Tensor], states: list[dict[str, Any]], grads: Tensor
    ) -> None:
        """Adam in the rotated space, the update rotated back, then decoupled weight decay (raw lr)."""
        beta1, beta2 = group["beta1"], group["beta2"]
        q_left = gather([s["q_left"] for s in states]) if "q_left" in states[0] else None
        q_right = gather([s["q_right"] for s in states]) if "q_right" in states[0] else None
        precision = group["matmul_precision"]
        rotated_grad = _rotate(grads, q_left, q_right, precision=precision)

        exp_avg_list = [s["exp_avg"] for s in states]
        exp_avg = gather(exp_avg_list)
        if group["momentum_in_eigenbasis"]:
            exp_avg.lerp_(rotated_grad, 1.0 - beta1)
            rotated_avg = exp_avg
        else:
            exp_avg.lerp_(grads, 1.0 - beta1)
            rotated_avg = _rotate(exp_avg, q_left, q_right, precision=precision)
        _scatter(exp_avg, exp_avg_list)

        exp_avg_sq_list = [s["exp_avg_sq"] for s in states]
        exp_avg_sq = gather(exp_avg_sq_list)
        exp_avg_sq.mul_(beta2).addcmul_(rotated_grad, rotated_grad, value=1.0 - beta2)
        _scatter(exp_avg_sq, exp_avg_sq_list)

        denom = exp_avg_sq.sqrt().add_(group["eps"])
        update = _rotate(torch.div(rotated_avg, denom, out=denom), q_left, q_right, back=True, precision=precision)
        if group["normalize_grads"]:
            rms = update.square().mean(dim=(-2, -1), keepdim=True).sqrt_()
            update.div_(rms.add_(1e-30))

        lr, decay = group["lr"], group["weight_decay"]
        for p, state, u in zip(params, states, update.unbind(0), strict=True):
            step_size = lr
            if group["correct_bias"]:
                t = state["step"]
                step_size = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
            work = p.to(torch.promote_types(p.dtype, torch.float32))
            work.add_(u.view(p.shape), alpha=-step_size)
            if decay > 0:
                work.mul_(1.0 - lr * decay)
            if work is not p:
                p.copy_(work)


class EigenAdam(SOAP):
    """Eigen-Adam / AdaDiag / one-sided SOAP with the defaults of Gong et al., Algorithm 7 (see module doc)."""

    matrices_only = "EigenAdam"
    hparams = SOAP.hparams.with_defaults(
        eps=(1e-8, ours("Alg. 7 prints m / sqrt(v): a guard against 0/0 where the gradient is exactly zero")),
        weight_decay=(0.0, paper(f"{RACS_ALICE_PAPER} Alg. 7 has no weight decay")),
        correct_bias=(False, paper(f"{RACS_ALICE_PAPER} Alg. 7 has no bias correction")),
        sides=("smaller", paper(f"{RACS_ALICE_PAPER} Sec. 3.4, Alg. 7: one side, the smaller (m <= n)")),
        basis_from_current_grad=(True, paper(f"{RACS_ALICE_PAPER} Alg. 7: the statistic takes G_t first")),
        refresh=("eigh", paper(f"{RACS_ALICE_PAPER} Alg. 7: a full EVD at t == 1 or t mod K == 0")),
    )


def _route(model: torch.nn.Module | None, named: NamedParams, hp: Any) -> Routing:
    return split(model, named, fallback_name="adamw")


def state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Any) -> int:
    """float32 exp_avg and exp_avg_sq (rows*cols each), and per rotated side of size k a k x k statistic and
    basis; `step` and `failures_in_a_row` are Python ints (no tensor bytes); plus the fallback's state (torch AdamW's,
    or `HFAdamW`'s for `adamw_form` other than "torch")."""
    total = 0
    for shape in structured:
        rows, cols = matrix_shape(shape)
        left, right = rotated_sides(rows, cols, hp["sides"], hp["max_precond_dim"])
        total += 4 * (2 * rows * cols + 2 * left * rows * rows + 2 * right * cols * cols)
    return total + fallback_state_bytes(fallback, hp)


SOAP_ADAMW = adamw_fallback(
    code(f"{REFERENCE}: 1-D parameters through its unrotated Adam, with SOAP's values"),
    lr=3e-3,
    beta1=0.95,
    beta2=0.95,
    eps=1e-8,
    weight_decay=0.01,
) + adamw_form(
    "hf-skip-first",
    code(
        f"{REFERENCE} lines 139-204: a 1-D parameter's first step only creates its state; then Adam with eps added to "
        "the uncorrected sqrt(v), lr sqrt(1-b2^t)/(1-b1^t), weight decay after the update with the raw lr"
    ),
)
"""The SOAP reference runs 1-D parameters through its own (unrotated) Adam: SOAP's lr, betas, eps and wd, and its
arithmetic (`hf_adamw.HFAdamW` with the skipped first step; `adamw_form="torch"` gives torch.optim.AdamW)."""

_CHECK_HPARAMS = {"precondition_frequency": 2}

SOAP_ENTRY = register(
    OptimizerEntry(
        name="soap",
        refresh_interval="precondition_frequency",
        summary="SOAP: Adam in the eigenbasis of Shampoo's two factors, basis refreshed by power iteration + QR",
        reference="Vyas et al. 2024, SOAP (arXiv 2409.11321), Alg. 3; reference code nikhilvyas/SOAP soap.py a1e5535",
        hparams=SOAP.hparams + SOAP_ADAMW,
        build=hybrid_builder(SOAP),
        route=_route,
        notes=(
            "eps HF style: sqrt(v)+eps, step lr*sqrt(1-b2^t)/(1-b1^t); t counts non-skipped steps. "
            "momentum_in_eigenbasis True = the reference's Dec. 2024 change (f42d296), done as in the optax port "
            "(rotated only on a refresh); both are equal in exact arithmetic. basis_from_current_grad/refresh switch "
            "to the order and full EVD of Gong et al.'s Alg. 6. Deviations: conv filters viewed as (out, in*kh*kw) "
            "(the reference "
            "keeps one factor per tensor dim); 1-D parameters, embeddings and the head go to the fallback, by default "
            "the reference's unrotated Adam for 1-D parameters (adamw_form 'hf-skip-first': skipped first step, eps "
            "on the uncorrected sqrt(v), decay after the update; 'torch' gives torch AdamW) with SOAP's own values "
            "(the reference rotates embeddings and the head on their sides <= max_precond_dim); "
            "precondition_1d, merge_dims and data_format are not offered; "
            "moments kept in float32 (the reference keeps them in the parameter dtype)."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=state_bytes,
        check_hparams=_CHECK_HPARAMS,
    )
)

EIGEN_ADAM_ENTRY = register(
    OptimizerEntry(
        name="eigen-adam",
        refresh_interval="precondition_frequency",
        summary="Eigen-Adam / AdaDiag / one-sided SOAP: Adam in the eigenbasis of EMA(G G^T) on the smaller side",
        reference="Gong, Scetbon, Ma & Meeds (arXiv 2502.07752), Sec. 3.4, Eq. 13, Alg. 7",
        hparams=EigenAdam.hparams + ADAMW_FALLBACK,
        build=hybrid_builder(EigenAdam),
        route=_route,
        notes=(
            "The paper is silent on the values Alg. 7 shares with SOAP (Eigen-Adam is not run), so they are the SOAP "
            "reference code's: shampoo_beta -1 (= beta2) for beta3, precondition_frequency 10 for K. The first "
            "moment stays in the original space, rotated every step. The reference's one-sided SOAP is "
            "basis_from_current_grad False, refresh 'qr', correct_bias True, weight_decay 0.01. Non-matrix "
            "parameters, embeddings and the head go to torch AdamW (fallback hyperparameters not stated by the "
            "paper: the project's adamw_* defaults)."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=state_bytes,
        check_hparams=_CHECK_HPARAMS,
    )
)
