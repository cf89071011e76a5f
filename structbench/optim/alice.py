"""Alice and Alice-0: low-rank Eigen-Adam with tracking, subspace switching and optimal compensation.

Paper: Gong, Scetbon, Ma & Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher
Approximation with a Low-Rank Extension", Sec. 5: Algorithm 4 (Alice / Alice-0), Algorithm 2 (subspace
switching), Algorithm 3 (compensation, Eq. 20-21 / Thm 5.1), Algorithm 10 (subspace iteration, App. B.13).
Per matrix W (m x n, oriented so that m <= n as the paper assumes: a tall matrix is processed as its
transpose; conv filters as (out, in*kh*kw)), rank r, leading-basis count l, interval K:

    if t == 1 or t mod K == 0:                                              (Alg. 4 line 5)
        Q_t = beta3 U_{t-1} Q~_{t-1} U_{t-1}^T + (1 - beta3) G_t G_t^T      (line 6; printed U_t, only U_{t-1} exists)
        U_t = Switch(Q_t, r, l, U_{t-1})                                    (line 7, Alg. 2)
    sigma = U_t^T G_t                                                       (line 11)
    Q~_t = beta3 Q~_{t-1} + (1 - beta3) sigma sigma^T                       (line 12, tracking; absent when beta3 = 0)
    m_t = beta1 m_{t-1} + (1 - beta1) sigma;  v_t = beta2 v_{t-1} + (1 - beta2) sigma^2   (lines 13-14, r x n)
    omega = m_t / sqrt(v_t)                                                 (line 15: no eps, no bias correction)
    Delta_c, p_t, phi_t = Compensation(G_t, U_t, p_{t-1}, phi_{t-1}, gamma, beta1)       (line 16, Alg. 3)
    W <- W - lr * alpha * (U_t omega + alpha_c Delta_c)                     (line 17)

Switch (Alg. 2): U' = SubspaceIteration(Q, init U_{t-1}) (Alg. 10, one step: QR(Q U_{t-1}), then the
Rayleigh-Ritz rotation U_T eigvecs(U_T^T Q U_T) sorted by descending Ritz value); keep its top l columns; the
complement of span(U') from a complete QR of U' (m - r columns); sample r - l of them uniformly without
replacement; U = [U'_{:l}, sampled].
Compensation (Alg. 3): p <- beta p + (1 - beta)(1^T G^2 - 1^T sigma^2) (per column, n);
C = sqrt(m - r) (G - U U^T G) Diag(p)^{-1/2}; eta = gamma / max(||C|| / phi, gamma) if phi > 0 else 1;
phi = ||eta C||; Delta_c = eta C.

Choices where the paper is silent (each marked in the registry notes or a hyperparameter's declared source):
- Step 1: U_0 = 0 makes Alg. 10's product Q U_0 zero, so at the first refresh U' is the full EVD(Q_1, r)
  (top-r eigenvectors) instead — never a QR of a zero matrix (structbench's choice).
- No re-projection of m, v, Q~ when U changes (Alg. 4 as printed). Eigenvector signs are
  arbitrary, so they are fixed: each Ritz vector is signed to overlap non-negatively with the same column of
  U_{t-1} (a flip would reverse the momentum carried in m for that direction); the step-1 eigenvectors have
  their largest-magnitude entry positive.
- If m - r < r - l the complement cannot supply r - l columns: l is raised to 2r - m. The rank is capped at m
  (at r = m there is no complement and the compensation is zero).
- Divisions without epsilon (`eps` = 0, the paper; eps > 0 is a switch added to sqrt(v)): an entry with
  v = 0 (or a column with p <= 0, which low precision can produce; p is used clamped at 0) contributes 0
  instead of 0/0.
- Sampling is seeded from (`switch_seed`, the parameter's index in the optimizer, the step), so resume and
  reruns draw the same columns with no RNG state to store.
Ablation switches (Table 5, Fig. 5): tracking = beta3 > 0 (Alice-0 is beta3 = 0);
`switching` in {"proposed", "none" (pure subspace iteration, top r), "gaussian" (r unit-norm Gaussian
columns), "gaussian-mix" (top l + unit-norm Gaussian columns), "full-basis" (r - l columns sampled from all
eigen-directions except the top l: U'_{l:} and the complement)}; `compensation` in {"optimal" (Alg. 3),
"fira" (G - U U^T G scaled per column by ||omega_i|| / ||sigma_i||, Fira's rule, with the limiter), "fira+"
(the Fira term rescaled to the Frobenius norm of U omega, then times alpha_c; F.7), "none"}; l, r, K.

State per matrix (float32, float64 for float64 parameters): `basis` U (m x r), `exp_avg` and `exp_avg_sq`
(r x n), `col_energy` p (n), `phi` (0-d), and `tracked` Q~ (r x r) only when beta3 > 0 — the paper's Table 6
counts 2nr + mr + n (+ r^2) plus the limiter scalar; Python ints `step` and `solver_failures`. Same-shape
matrices are stacked into one batched eigh / QR / matmul. A failed eigendecomposition keeps the previous basis,
counts the event and retries at the next step; the third consecutive failure raises SolverError.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from structbench.errors import SolverError
from structbench.optim import linalg, memory
from structbench.optim.base import StructuredOptimizer
from structbench.optim.hparams import Declaration, decade_around, integer, lin, option, ours, paper, real
from structbench.optim.hybrid import adamw_state_bytes, hybrid_builder
from structbench.optim.partition import head_switch, matrix_view, route_with_head_switch
from structbench.optim.racs import LIMITER_GAMMA, PAPER, PAPER_ADAM, limiter_factor
from structbench.optim.registry import OptimizerEntry, register

SWITCHING = ("proposed", "none", "gaussian", "gaussian-mix", "full-basis")
COMPENSATION = ("optimal", "fira", "fira+", "none")


def refresh_due(step: int, interval: int) -> bool:
    """Alg. 4 line 5 at 1-based step `step`: t == 1 or t mod K == 0."""
    return step == 1 or step % interval == 0


def ranks(rank: int, leading: int, m: int) -> tuple[int, int]:
    """(r, l) actually used for a matrix with m rows (m <= n): r <= m, l <= r, and r - l <= m - r."""
    r = min(rank, m)
    l_used = min(max(leading, 2 * r - m), r)
    return r, l_used


def ritz_basis(q: Tensor, init: Tensor) -> Tensor:
    """Alg. 10 with one step: U_1 = QR(Q init), then U_1 eigvecs(U_1^T Q U_1), by descending Ritz value.

    Column signs are chosen so that each Ritz vector has a non-negative inner product with `init`'s column.
    """
    u1 = linalg.subspace_iteration(q, init, iters=1)
    _, vecs = linalg.eigh_with_retry(u1.mT @ q @ u1)
    ritz = u1 @ vecs.to(u1.dtype).flip(-1)
    overlap = (ritz * init.to(ritz.dtype)).sum(-2, keepdim=True)
    return ritz * torch.where(overlap < 0, -1.0, 1.0).to(ritz.dtype)


def top_eigenvectors(q: Tensor, r: int) -> Tensor:
    """EVD(Q, r): the top-r eigenvectors by descending eigenvalue (the step-1 basis)."""
    _, vecs = linalg.eigh_with_retry(q)
    top = vecs.to(q.dtype).flip(-1)[..., :r]
    peak = top.gather(-2, top.abs().argmax(-2, keepdim=True))
    return top * torch.where(peak < 0, -1.0, 1.0).to(top.dtype)


def complement(u: Tensor) -> Tensor:
    """QR(U) of the paper's notation: an orthonormal basis of the orthogonal complement of span(U)."""
    full, _ = torch.linalg.qr(u, mode="complete")
    return full[..., u.size(-1) :]


def _gaussian_columns(m: int, k: int, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    cols = torch.randn(m, k, generator=generator, dtype=torch.float64, device=generator.device)
    return (cols / cols.norm(dim=0, keepdim=True)).to(dtype)


def switch(ritz: Tensor, r: int, l_used: int, mode: str, generator: torch.Generator) -> Tensor:
    """Alg. 2 (and its ablation variants) for one matrix: the new m x r basis from the Ritz basis U' (m x r)."""
    m = ritz.size(-2)
    dtype = ritz.dtype
    if mode == "none":
        return ritz
    if mode == "gaussian":
        return _gaussian_columns(m, r, generator, dtype).to(ritz.device)
    lead = ritz[:, :l_used]
    if mode == "gaussian-mix":
        return torch.cat([lead, _gaussian_columns(m, r - l_used, generator, dtype).to(ritz.device)], dim=1)
    rest = complement(ritz)
    if mode == "full-basis":
        rest = torch.cat([ritz[:, l_used:], rest], dim=1)
    picks = torch.randperm(rest.size(1), generator=generator, device=generator.device)[: r - l_used].to(ritz.device)
    return torch.cat([lead, rest[:, picks]], dim=1)


def _divide_or_zero(num: Tensor, denom: Tensor) -> Tensor:
    """num / denom where denom > 0, else 0 (the paper has no epsilon)."""
    positive = denom > 0
    return torch.where(positive, num / torch.where(positive, denom, torch.ones_like(denom)), 0.0)


def _eigh_failure(param: Tensor, streak: int) -> str:
    return f"Alice: eigendecomposition failed {streak} times in a row for a {tuple(param.shape)} parameter"


class Alice(StructuredOptimizer):
    """Alice / Alice-0 (Alg. 4) over matrix parameters; see the module docstring."""

    matrices_only = "Alice"

    hparams = Declaration(
        real("lr", 0.02, paper(f"{PAPER} Table 11, 60M"), "(0, inf)", decade_around()),
        real("alpha", 0.3, paper(f"{PAPER} Table 11, 60M (1.3B: 0.25)"), "(0, inf)"),
        real("alpha_c", 0.4, paper(f"{PAPER} Table 11, 60M (1.3B: 0.2)"), "[0, inf)"),
        real("beta1", 0.9, paper(f"{PAPER} Table 11"), "[0, 1)", lin(0.85, 0.95)),
        real("beta2", 0.9, paper(f"{PAPER} Table 11 (not 0.999)"), "[0, 1)"),
        real("beta3", 0.999, paper(f"{PAPER} Table 11; 0 is Alice-0 (no tracking)"), "[0, 1)"),
        integer("rank", 128, paper(f"{PAPER} Table 11, 60M (1.3B: 512)"), "[1, inf)"),
        integer("leading", 40, paper(f"{PAPER} Table 11, 60M (1.3B: 160); at most the rank"), "[0, inf)"),
        integer("update_interval", 200, paper(f"{PAPER} Table 11, K"), "[1, inf)"),
        LIMITER_GAMMA,
        option("switching", "proposed", SWITCHING, paper(f"{PAPER} Alg. 2; the others are Table 5's ablations")),
        option("compensation", "optimal", COMPENSATION, paper(f"{PAPER} Alg. 3; the others are ablations (F.7)")),
        integer("switch_seed", 0, ours("seeds the switching's samples, with the parameter index and the step")),
        real("eps", 0.0, paper(f"{PAPER} Alg. 4 line 15 has no eps; eps > 0 is added to sqrt(v)"), "[0, inf)"),
    )

    def check_group(self, group: dict[str, Any]) -> None:
        if group["leading"] > group["rank"]:
            raise ValueError(f"leading must be an int in [0, rank]; got {group['leading']!r}")

    def step_group(self, group: dict[str, Any]) -> None:
        live = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse for p in live):
            raise RuntimeError("Alice does not support sparse gradients")
        index = {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}
        buckets: dict[tuple[Any, ...], list[nn.Parameter]] = defaultdict(list)
        for param in live:
            rows, cols = matrix_view(param.grad).shape
            st = self.state[param]
            due = "basis" not in st or st["solver_failures"] > 0
            due = due or refresh_due(st["step"] + 1, group["update_interval"])
            buckets[((rows, cols), param.device, param.dtype, due)].append(param)
        for ((rows, cols), _, _, due), params in buckets.items():
            self._step_bucket(group, params, rows > cols, due, [index[id(p)] for p in params])

    def _step_bucket(
        self, group: dict[str, Any], params: list[nn.Parameter], transpose: bool, due: bool, indices: list[int]
    ) -> None:
        dtype = torch.promote_types(params[0].dtype, torch.float32)
        grads = torch.stack([matrix_view(p.grad).to(dtype) for p in params])
        if transpose:
            grads = grads.mT
        m = grads.size(-2)
        r, l_used = ranks(group["rank"], group["leading"], m)
        beta1, beta2, beta3 = group["beta1"], group["beta2"], group["beta3"]
        for param in params:
            st = self.state[param]
            if "basis" not in st:
                st.setdefault("step", 0)
                st.setdefault("solver_failures", 0)
        if due:
            self._refresh(group, params, grads, r, l_used, indices)
        ready = [i for i, p in enumerate(params) if "basis" in self.state[p]]
        if not ready:
            return
        if len(ready) < len(params):
            params = [params[i] for i in ready]
            grads = grads[ready]
        states = [self.state[p] for p in params]
        basis = torch.stack([st["basis"] for st in states])
        sigma = basis.mT @ grads  # line 11
        if beta3 > 0:
            tracked = torch.stack([st["tracked"] for st in states])
            tracked.mul_(beta3).add_(sigma @ sigma.mT, alpha=1.0 - beta3)  # line 12
        exp_avg = torch.stack([st["exp_avg"] for st in states]).mul_(beta1).add_(sigma, alpha=1.0 - beta1)
        exp_avg_sq = torch.stack([st["exp_avg_sq"] for st in states]).mul_(beta2)
        exp_avg_sq.addcmul_(sigma, sigma, value=1.0 - beta2)  # lines 13-14
        omega = _divide_or_zero(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]))  # line 15
        low_rank = basis @ omega
        energy = torch.stack([st["col_energy"] for st in states])
        phi = torch.stack([st["phi"] for st in states])
        delta_c, energy, phi = self._compensation(group, grads, basis, sigma, omega, low_rank, energy, phi, r)
        update = low_rank if delta_c is None else low_rank + group["alpha_c"] * delta_c
        update = update.mul_(-group["lr"] * group["alpha"])  # line 17
        if transpose:
            update = update.mT
        for i, (param, st) in enumerate(zip(params, states, strict=True)):
            st["step"] += 1
            if beta3 > 0:
                st["tracked"].copy_(tracked[i])
            st["exp_avg"].copy_(exp_avg[i])
            st["exp_avg_sq"].copy_(exp_avg_sq[i])
            st["col_energy"].copy_(energy[i])
            st["phi"].copy_(phi[i])
            param.add_(update[i].reshape(param.shape).to(param.dtype))

    def _compensation(
        self,
        group: Mapping[str, Any],
        grads: Tensor,
        basis: Tensor,
        sigma: Tensor,
        omega: Tensor,
        low_rank: Tensor,
        energy: Tensor,
        phi: Tensor,
        r: int,
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """Alg. 3 (mode "optimal") or an ablation variant; returns (Delta_c or None, p, phi)."""
        mode = group["compensation"]
        beta1 = group["beta1"]
        m = grads.size(-2)
        residual = grads - basis @ sigma  # G - U U^T G
        if mode == "optimal":
            outside = grads.square().sum(-2) - sigma.square().sum(-2)
            energy = energy.mul_(beta1).add_(outside, alpha=1.0 - beta1)
            comp = math.sqrt(m - r) * _divide_or_zero(residual, energy.clamp_min(0.0).sqrt().unsqueeze(-2))
        elif mode in ("fira", "fira+"):
            ratio = _divide_or_zero(omega.norm(dim=-2), sigma.norm(dim=-2))
            comp = residual * ratio.unsqueeze(-2)
            if mode == "fira+":
                target = torch.linalg.matrix_norm(low_rank)
                scale = _divide_or_zero(target, torch.linalg.matrix_norm(comp))
                return comp * scale.view(-1, 1, 1), energy, phi
        else:
            return None, energy, phi
        norms = torch.linalg.matrix_norm(comp)
        eta = limiter_factor(norms, phi, group["gamma"])
        comp = comp * eta.view(-1, 1, 1)
        return comp, energy, eta * norms

    def _refresh(
        self,
        group: Mapping[str, Any],
        params: list[nn.Parameter],
        grads: Tensor,
        r: int,
        l_used: int,
        indices: list[int],
    ) -> None:
        """Alg. 4 lines 6-7 for a stack of same-shape matrices (one batched eigh / QR)."""
        beta3 = group["beta3"]
        states = [self.state[p] for p in params]
        stat = grads @ grads.mT
        fresh = ["basis" not in st for st in states]
        if beta3 > 0:
            stat = (1.0 - beta3) * stat
            kept = [i for i, f in enumerate(fresh) if not f]
            if kept:
                bases = torch.stack([states[i]["basis"] for i in kept])
                tracked = torch.stack([states[i]["tracked"] for i in kept])
                stat[kept] += beta3 * (bases @ tracked @ bases.mT)
        ritz = self._ritz_with_fallback(stat, states, fresh, r)
        for i, (param, st) in enumerate(zip(params, states, strict=True)):
            if ritz[i] is None:
                self.solver_failed(st, "solver_failures", partial(_eigh_failure, param))
                continue
            generator = torch.Generator()
            generator.manual_seed((group["switch_seed"] * 1_000_003 + indices[i] * 10_007 + st["step"] + 1) % (2**63))
            new_basis = switch(ritz[i], r, l_used, group["switching"], generator)
            self.solver_ok(st, "solver_failures")
            if fresh[i]:
                n = grads.size(-1)
                dtype, device = grads.dtype, grads.device
                st["exp_avg"] = torch.zeros(r, n, dtype=dtype, device=device)
                st["exp_avg_sq"] = torch.zeros(r, n, dtype=dtype, device=device)
                st["col_energy"] = torch.zeros(n, dtype=dtype, device=device)
                st["phi"] = torch.zeros((), dtype=dtype, device=device)
                if beta3 > 0:
                    st["tracked"] = torch.zeros(r, r, dtype=dtype, device=device)
                st["basis"] = new_basis.contiguous()
            else:
                st["basis"].copy_(new_basis)

    @staticmethod
    def _ritz(stat: Tensor, states: list[dict[str, Any]], fresh: list[bool], r: int) -> list[Tensor]:
        if all(fresh):
            return list(top_eigenvectors(stat, r))
        if not any(fresh):
            return list(ritz_basis(stat, torch.stack([st["basis"] for st in states])))
        return [
            top_eigenvectors(s, r) if f else ritz_basis(s, st["basis"])
            for s, st, f in zip(stat, states, fresh, strict=True)
        ]

    def _ritz_with_fallback(
        self, stat: Tensor, states: list[dict[str, Any]], fresh: list[bool], r: int
    ) -> list[Tensor | None]:
        try:
            return list(self._ritz(stat, states, fresh, r))
        except SolverError:
            pass
        found: list[Tensor | None] = []
        for s, st, f in zip(stat, states, fresh, strict=True):
            try:
                found.append(self._ritz(s.unsqueeze(0), [st], [f], r)[0])
            except SolverError:
                found.append(None)
        return found


def alice_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """float32 U, m, v, p, phi (and Q~ when beta3 > 0) per matrix — Table 6 + the limiter scalar — + AdamW."""
    elements = memory.structured_state_elements("alice", structured, hp)
    return memory.FLOAT32_BYTES * elements + adamw_state_bytes(fallback)


_NOTES = (
    "No eps and no bias correction (Alg. 4): v = 0 or p <= 0 entries contribute 0. Step-1 basis: full EVD(Q_1, "
    "r) (paper silent: U_0 = 0 makes Alg. 10 degenerate); later refreshes: 1-step subspace iteration + Rayleigh-Ritz "
    "(Alg. 10) warm-started from U_{t-1}, then Alg. 2 switching. Line 6 uses U_{t-1} (printed U_t). m, v, Q~ "
    "are not re-projected at a refresh (Alg. 4). Compensation p decays with beta1 (Alg. 4 line 16), limiter "
    "Frobenius per matrix. Refresh at t == 1 or t mod K == 0. Switching samples without replacement, seeded by "
    "switch_seed, the parameter index and the step. r capped at m; l raised to 2r - m when the complement is "
    "too small. Ablations: compensation fira (Fira's column-norm rule with the limiter) and fira+ (rescaled to "
    "||U omega|| then x alpha_c, F.7; Fira's exact residual follows its code with the GaLore scale 1). "
    "Orientation m <= n (tall matrices transposed; conv filters (out, in*kh*kw), not in the paper). Routing: "
    "attention/MLP matrices to Alice, embeddings, norms and 1-D parameters to Adam; head_to_fallback False = the "
    "paper's main 'Ppl.' (LM head trained by Alice), True = 'Ppl.*'. eps > 0 is a switch: with no eps a direction "
    "whose sigma is only roundoff, e.g. an exactly rank-deficient gradient at r = m, takes a full sign step. "
    "State float32: U, m, v, p, phi (+ Q~ when beta3 > 0); compensation p and phi "
    "are kept for every compensation mode."
)

_REFERENCE = (
    "Gong, Scetbon, Ma & Meeds, Towards Efficient Optimizer Design for LLM via Structured Fisher Approximation "
    "with a Low-Rank Extension: Sec. 5, Algorithms 2, 3, 4 and 10 (App. B.13), Eq. 17-21, Thm 5.1"
)

_CHECK = {"update_interval": 2, "rank": 4, "leading": 2, "head_to_fallback": True}
"""The toy head (3 classes) has a rank-2 gradient (softmax rows sum to 0), so with r = m = 3 one direction of
sigma is pure roundoff and the eps-free omega = m / sqrt(v) is its sign: eager and compiled steps then differ
by a full step in that direction. The conformance run keeps the head on AdamW; every other path is default."""

HEAD_SWITCH = head_switch(False, paper(f"{PAPER} Table 2 'Ppl.': the LM head trained by Alice ('Ppl.*': by Adam)"))

ALICE_ENTRY = register(
    OptimizerEntry(
        name="alice",
        refresh_interval="update_interval",
        summary="Alice: low-rank Eigen-Adam with tracking, subspace switching and optimal compensation",
        reference=_REFERENCE,
        hparams=Alice.hparams + HEAD_SWITCH + PAPER_ADAM,
        build=hybrid_builder(Alice),
        route=route_with_head_switch,
        notes=_NOTES,
        lr_keys=("lr", "adamw_lr"),
        state_bytes=alice_state_bytes,
        compile_supported=True,
        check_hparams=_CHECK,
    )
)

ALICE0_COMPILE_REASON = (
    "Without tracking (beta3 = 0) the basis of rank-deficient gradients "
    "includes directions that carry only roundoff, and the eps-free omega = m / sqrt(v) turns that roundoff into "
    "full-size steps, so compiled and eager runs (or 1 and 2 BLAS threads) diverge by whole steps: a compiled step "
    "runs but cannot be checked against eager."
)
ALICE0_COMPILE_NOTE = f" torch.compile: declared unsupported. {ALICE0_COMPILE_REASON}"

ALICE0_ENTRY = register(
    OptimizerEntry(
        name="alice-0",
        refresh_interval="update_interval",
        summary="Alice-0: Alice without low-rank tracking (beta3 = 0); switching and compensation kept",
        reference=_REFERENCE,
        hparams=(
            Alice.hparams.with_defaults(beta3=(0.0, paper(f"{PAPER} Alg. 4, Table 11: Alice-0 tracks nothing")))
            + HEAD_SWITCH
            + PAPER_ADAM
        ),
        build=hybrid_builder(Alice),
        route=route_with_head_switch,
        notes=_NOTES + ALICE0_COMPILE_NOTE,
        lr_keys=("lr", "adamw_lr"),
        state_bytes=alice_state_bytes,
        compile_supported=False,
        compile_unsupported_reason=ALICE0_COMPILE_REASON,
        check_hparams=_CHECK,
    )
)
