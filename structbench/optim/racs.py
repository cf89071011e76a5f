"""RACS: Row And Column Scaled SGD — the S (x) Q Fisher structure with positive diagonal S and Q.

Paper: Gong, Scetbon, Ma & Meeds, "Towards Efficient Optimizer Design for LLM via Structured Fisher
Approximation with a Low-Rank Extension", Sec. 4, Proposition 3 (Eq. 16) and Algorithm 1. Per matrix
W (m x n, oriented so that m <= n as the paper assumes; a tall matrix is processed as its transpose, conv
filters as (out, in*kh*kw)):

    s_0 = 0, q_0 = 0, phi_0 = 0                                         (Alg. 1 line 2)
    G_t = grad of W                                                     (line 4)
    P = G_t^2 (1-sample estimate of E[G^2]);  q = 1                     (Sec. 4, "in practice")
    repeat `iterations` (5) times:  s = P^T q / ||q||^2;  q = P s / ||s||^2   (Eq. 16, line 5)
    s_t = beta s_{t-1} + (1 - beta) s;  q_t = beta q_{t-1} + (1 - beta) q     (lines 6-7; no bias correction)
    G~ = Diag(q_t)^{-1/2} G_t Diag(s_t)^{-1/2}                          (line 8)
    eta = gamma / max(||G~|| / phi_{t-1}, gamma)  (t > 1),  1 at t = 1    (line 9)
    phi_t = eta ||G~||                                                  (line 10)
    W <- W - lr * eta * alpha * G~                                      (line 11)

Eq. 16 in the elementwise form of the proof (App. D.3): Diag(E[G^T Q G]) = P^T q and ||Q||_F^2 = ||q||^2,
so the iteration is a power iteration on P whose fixed point is (up to scale) its principal right (s) and
left (q) singular vectors. q is computed from s last, which fixes how the arbitrary scale is split between
s and q (it matters once s and q are EMA'd separately). The update is invariant to the gradient's scale:
G -> cG sends s -> c^2 s and leaves q unchanged, so G~ is unchanged.

Choices (paper silent, marked in the registry notes):
- ||.|| in the limiter is the Frobenius norm of the matrix, one phi per matrix (Fira's code, which Alg. 1
  borrows the limiter from). "t > 1" is read as "phi_{t-1} > 0" (Alg. 3's form), so no step counter is kept.
- No epsilon: an entry of G~ whose q_i s_j is 0 (a zero row or column of every gradient so far) is set to 0
  rather than 0/0; likewise ||q||^2 or ||s||^2 of an all-zero gradient leaves the estimate at 0.
Switches: `ema` False uses the current estimate directly (the Fig. 5(e) ablation); `iterations`;
`limiter` False sets eta = 1 (phi is still tracked).

State per matrix (float32, or float64 for float64 parameters): `row_scale` q (m), `col_scale` s (n), `phi` (a
0-d tensor) — m + n + 1 elements, the paper's count. With `batch_matrices` "on" ("auto" on CUDA), same-shape
matrices are stacked and stepped together; "off" ("auto" elsewhere) steps them one at a time (`base.BATCH_MODES`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from structbench.optim import memory
from structbench.optim.base import BATCH_MODES, StructuredOptimizer, gather, stacks_matrices
from structbench.optim.checks import check_choice
from structbench.optim.hybrid import adamw_state_bytes, build_hybrid
from structbench.optim.partition import matrix_view, route_with_head_switch
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register


def fixed_point(power: Tensor, iterations: int) -> tuple[Tensor, Tensor]:
    """Eq. 16 on P = E[G^2] (..., m, n), q initialised to 1: returns (s (..., n), q (..., m)).

    Each iteration computes s = P^T q / ||q||^2, then q = P s / ||s||^2 (Prop. 3, App. D.3).
    """
    q = torch.ones(power.shape[:-1], dtype=power.dtype, device=power.device)
    s = torch.zeros(power.shape[:-2] + power.shape[-1:], dtype=power.dtype, device=power.device)
    for _ in range(iterations):
        # row-vector products (q^T P, s^T P^T): several times faster than batched matrix-vector on CPU
        s = (q.unsqueeze(-2) @ power).squeeze(-2) / _safe(q.square().sum(-1, keepdim=True))
        q = (s.unsqueeze(-2) @ power.mT).squeeze(-2) / _safe(s.square().sum(-1, keepdim=True))
    return s, q


def _safe(denominator: Tensor) -> Tensor:
    """A squared norm, with 0 replaced by 1 (its numerator is then 0 too: the estimate stays 0)."""
    return torch.where(denominator > 0, denominator, torch.ones_like(denominator))


def scaled_gradient(grad: Tensor, q: Tensor, s: Tensor) -> Tensor:
    """Alg. 1 line 8: G~_ij = G_ij q_i^{-1/2} s_j^{-1/2}, with 0 where q_i s_j = 0."""
    return grad * _rsqrt_or_zero(q).unsqueeze(-1) * _rsqrt_or_zero(s).unsqueeze(-2)


def _rsqrt_or_zero(x: Tensor) -> Tensor:
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, torch.ones_like(x)).rsqrt(), 0.0)


def limiter_factor(norm: Tensor, phi: Tensor, gamma: float) -> Tensor:
    """Alg. 1 line 9: eta = gamma / max(||G~|| / phi, gamma) when phi > 0, else 1 (branch-free)."""
    ratio = norm / torch.where(phi > 0, phi, torch.ones_like(phi))
    limited = gamma / torch.clamp(ratio, min=gamma)
    return torch.where(phi > 0, limited, torch.ones_like(limited))


def _validate_group(group: Mapping[str, Any]) -> None:
    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not is_number(group["lr"]) or group["lr"] < 0:
        raise ValueError(f"lr must be a finite number >= 0; got {group['lr']!r}")
    if not is_number(group["beta"]) or not 0.0 <= group["beta"] < 1.0:
        raise ValueError(f"beta must be in [0, 1); got {group['beta']!r}")
    if not is_number(group["alpha"]) or group["alpha"] <= 0:
        raise ValueError(f"alpha must be a finite number > 0 (it scales the step); got {group['alpha']!r}")
    if not is_number(group["gamma"]) or group["gamma"] < 1.0:
        raise ValueError(f"gamma must be a finite number >= 1; got {group['gamma']!r}")
    iterations = group["iterations"]
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1; got {iterations!r}")
    for key in ("ema", "limiter"):
        if not isinstance(group[key], bool):
            raise ValueError(f"{key} must be a bool; got {group[key]!r}")
    check_choice("batch_matrices", group["batch_matrices"], BATCH_MODES)


class RACS(StructuredOptimizer):
    """RACS (Alg. 1) over matrix parameters; see the module docstring for the algorithm and state."""

    matrices_only = "RACS"

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.02,
        beta: float = 0.9,
        alpha: float = 0.05,
        gamma: float = 1.01,
        iterations: int = 5,
        ema: bool = True,
        limiter: bool = True,
        batch_matrices: str = "auto",
    ) -> None:
        self.solver_failures = 0
        defaults = {
            "lr": lr,
            "beta": beta,
            "alpha": alpha,
            "gamma": gamma,
            "iterations": iterations,
            "ema": ema,
            "limiter": limiter,
            "batch_matrices": batch_matrices,
        }
        super().__init__(params, defaults)

    def check_group(self, group: dict[str, Any]) -> None:
        _validate_group(group)

    def step_group(self, group: dict[str, Any]) -> None:
        live = [p for p in group["params"] if p.grad is not None]
        if any(p.grad.is_sparse for p in live):
            raise RuntimeError("RACS does not support sparse gradients")
        buckets: dict[tuple[Any, ...], list[nn.Parameter]] = defaultdict(list)
        for index, param in enumerate(live):
            rows, cols = matrix_view(param.grad).shape
            alone = None if stacks_matrices(group["batch_matrices"], param.device) else index
            buckets[((rows, cols), rows > cols, param.device, param.dtype, alone)].append(param)
        for (_, transpose, _, _, _), params in buckets.items():
            self._step_bucket(group, params, transpose)

    def _step_bucket(self, group: dict[str, Any], params: list[nn.Parameter], transpose: bool) -> None:
        dtype = torch.promote_types(params[0].dtype, torch.float32)
        grads = gather([matrix_view(p.grad).to(dtype) for p in params])
        if transpose:
            grads = grads.mT
        m, n = grads.shape[-2:]
        states = [self.state[p] for p in params]
        for st in states:
            if "row_scale" not in st:
                st["row_scale"] = torch.zeros(m, dtype=dtype, device=grads.device)
                st["col_scale"] = torch.zeros(n, dtype=dtype, device=grads.device)
                st["phi"] = torch.zeros((), dtype=dtype, device=grads.device)
        s_new, q_new = fixed_point(grads.square(), group["iterations"])
        beta = group["beta"] if group["ema"] else 0.0
        q = torch.stack([st["row_scale"] for st in states]).mul_(beta).add_(q_new, alpha=1.0 - beta)
        s = torch.stack([st["col_scale"] for st in states]).mul_(beta).add_(s_new, alpha=1.0 - beta)
        scaled = scaled_gradient(grads, q, s)
        norms = torch.linalg.matrix_norm(scaled)
        phi = torch.stack([st["phi"] for st in states])
        eta = limiter_factor(norms, phi, group["gamma"]) if group["limiter"] else torch.ones_like(norms)
        new_phi = eta * norms
        updates = scaled * (eta * (-group["lr"] * group["alpha"])).view(-1, 1, 1)
        if transpose:
            updates = updates.mT
        for i, (param, st) in enumerate(zip(params, states, strict=True)):
            st["row_scale"].copy_(q[i])
            st["col_scale"].copy_(s[i])
            st["phi"].copy_(new_phi[i])
            param.add_(updates[i].reshape(param.shape).to(param.dtype))


RACS_DEFAULTS: dict[str, Any] = {
    "lr": 0.02,
    "beta": 0.9,
    "alpha": 0.05,
    "gamma": 1.01,
    "iterations": 5,
    "ema": True,
    "limiter": True,
    "batch_matrices": "auto",
    "head_to_fallback": True,
}

PAPER_ADAM_FALLBACK: dict[str, Any] = {
    "adamw_lr": 0.001,
    "adamw_beta1": 0.9,
    "adamw_beta2": 0.999,
    "adamw_eps": 1e-8,
    "adamw_weight_decay": 0.0,
}
"""The paper's Adam (Table 8, 60M: lr 1e-3, betas (0.9, 0.999), bias correction, no weight decay) for the
parameters RACS/Alice leave to Adam. The lr of those groups inside an RACS/Alice run is not stated (paper
silent); eps is torch's default (paper silent)."""


def make_racs(params: list[nn.Parameter], hp: Mapping[str, Any]) -> RACS:
    return RACS(
        params,
        lr=hp["lr"],
        beta=hp["beta"],
        alpha=hp["alpha"],
        gamma=hp["gamma"],
        iterations=hp["iterations"],
        ema=hp["ema"],
        limiter=hp["limiter"],
        batch_matrices=hp["batch_matrices"],
    )


def _build(named: NamedParams, routing: Routing, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return build_hybrid(named, routing, hp, make_racs)


def racs_state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """float32 s, q and phi per matrix (the paper's m + n + 1) + the AdamW fallback."""
    elements = memory.structured_state_elements("racs", structured, hp)
    return memory.FLOAT32_BYTES * elements + adamw_state_bytes(fallback)


RACS_ENTRY = register(
    OptimizerEntry(
        name="racs",
        summary="RACS: SGD with row and column scalings from the S (x) Q Fisher fixed point, EMA'd, norm-limited",
        reference=(
            "Gong, Scetbon, Ma & Meeds, Towards Efficient Optimizer Design for LLM via Structured Fisher "
            "Approximation with a Low-Rank Extension: Sec. 4, Prop. 3 (Eq. 16), Algorithm 1"
        ),
        defaults={**RACS_DEFAULTS, **PAPER_ADAM_FALLBACK},
        build=_build,
        route=route_with_head_switch,
        notes=(
            "lr 0.02, beta 0.9, alpha 0.05 (Table 9, 60M-350M; 1.3B uses alpha 0.02), gamma 1.01 (F.2), "
            "iterations 5 with q initialised to 1 and a 1-sample estimate (Sec. 4). Order inside an iteration: s "
            "from q, then q from s (inference from 'initialize q = 1'). EMA of s and q with zero init, no bias "
            "correction (Alg. 1). No epsilon (paper): zero scalings give a zero entry instead of 0/0. Limiter norm: "
            "Frobenius per matrix (paper silent; Fira's code); 't > 1' read as phi > 0. Switches: ema (False = "
            "Fig. 5(e) ablation), iterations, limiter. Orientation: m <= n (a tall matrix is transposed). "
            "Routing (Sec. 7.1 / F.2): attention and MLP matrices to RACS; embeddings, norms and 1-D parameters to "
            "Adam; head_to_fallback True = the LM head on Adam, as in every RACS result of the paper. Fallback: "
            "torch AdamW with the paper's Adam (Table 8 60M: lr 1e-3, betas (0.9, 0.999), no wd, bias correction); "
            "the lr of the Adam groups in RACS runs and eps are not stated (paper silent). Conv filters are "
            "(out, in*kh*kw) matrices (the paper has no conv layers). State: float32 s (n), q (m), phi. "
            "batch_matrices 'auto' stacks same-shape matrices on CUDA only (a harness choice; same algorithm)."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=racs_state_bytes,
        compile_supported=True,
        check_hparams={},
    )
)
