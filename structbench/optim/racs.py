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

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from structbench.optim import memory
from structbench.optim.base import BATCH_MATRICES, StructuredOptimizer, gather, stacks_matrices
from structbench.optim.distributed import DISTRIBUTED
from structbench.optim.hparams import Declaration, code, decade_around, flag, integer, lin, paper, real
from structbench.optim.hybrid import ADAMW_FALLBACK, adamw_state_bytes, hybrid_builder
from structbench.optim.partition import head_switch, matrix_view, route_with_head_switch
from structbench.optim.registry import OptimizerEntry, register

PAPER = "Gong et al. (arXiv 2502.07752)"
"""The RACS/Alice paper, which also runs GaLore, Fira and APOLLO as baselines."""

LIMITER_GAMMA = real("gamma", 1.01, paper(f"{PAPER} App. F.2, every norm-growth limiter"), "[1, inf)")
"""The norm-growth limiter's threshold: the update norm grows by at most gamma per step (RACS, Alice, Fira, APOLLO)."""

PAPER_ADAM = ADAMW_FALLBACK.with_defaults(
    adamw_lr=(1e-3, paper(f"{PAPER} Table 8, Adam at 60M; its lr inside RACS/Alice runs is not stated")),
    adamw_beta1=(0.9, paper(f"{PAPER} Table 8, Adam")),
    adamw_beta2=(0.999, paper(f"{PAPER} Table 8, Adam")),
    adamw_eps=(1e-8, code("pytorch torch/optim/adamw.py default; the paper states none")),
    adamw_weight_decay=(0.0, paper(f"{PAPER} Table 8, Adam without weight decay")),
)
"""The paper's Adam for the parameters RACS and Alice leave to it."""


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


class RACS(StructuredOptimizer):
    """RACS (Alg. 1) over matrix parameters; see the module docstring for the algorithm and state."""

    matrices_only = "RACS"

    hparams = (
        Declaration(
            real("lr", 0.02, paper(f"{PAPER} Table 9, 60M-350M"), "(0, inf)", decade_around()),
            real("beta", 0.9, paper(f"{PAPER} Table 9"), "[0, 1)", lin(0.85, 0.95)),
            real("alpha", 0.05, paper(f"{PAPER} Table 9, 60M-350M (1.3B: 0.02)"), "(0, inf)"),
            LIMITER_GAMMA,
            integer("iterations", 5, paper(f"{PAPER} Sec. 4, the fixed point of Eq. 16 from q = 1"), "[1, inf)"),
            flag("ema", True, paper(f"{PAPER} Alg. 1 lines 6-7; false is the Fig. 5(e) ablation")),
            flag("limiter", True, paper(f"{PAPER} Alg. 1 line 9")),
        )
        + BATCH_MATRICES
    )
    hparams = hparams + DISTRIBUTED

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
        hparams=(
            RACS.hparams
            + head_switch(True, paper(f"{PAPER} Sec. 7.1, F.2: every RACS result trains the LM head with Adam"))
            + PAPER_ADAM
        ),
        build=hybrid_builder(RACS),
        route=route_with_head_switch,
        notes=(
            "A 1-sample estimate of E[G^2] (Sec. 4). Order inside an iteration: s from q, then q from s (inference "
            "from 'initialize q = 1'). EMA of s and q with zero init, no bias correction (Alg. 1). No epsilon "
            "(paper): zero scalings give a zero entry instead of 0/0. Limiter norm: Frobenius per matrix (paper "
            "silent; Fira's code); 't > 1' read as phi > 0. Orientation: m <= n (a tall matrix is transposed). "
            "Routing (Sec. 7.1 / F.2): attention and MLP matrices to RACS; embeddings, norms and 1-D parameters to "
            "Adam (torch AdamW, bias correction); head_to_fallback True = the LM head on Adam too. Conv filters are "
            "(out, in*kh*kw) matrices (the paper has no conv layers). State: float32 s (n), q (m), phi."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=racs_state_bytes,
        compile_supported=True,
        check_hparams={},
    )
)
