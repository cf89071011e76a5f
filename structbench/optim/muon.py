"""Muon: MomentUm Orthogonalized by Newton–Schulz (Jordan et al. 2024).

Paper: K. Jordan, Y. Jin, V. Boza, J. You, F. Cesista, L. Newhouse, J. Bernstein, "Muon: An optimizer for
hidden layers in neural networks" (2024, kellerjordan.github.io/posts/muon), Algorithm 1; reference code
KellerJordan/Muon `muon.py` (`muon_update`, `SingleDeviceMuon`; commit 857d1ad) and `torch.optim.Muon`
(both read for their semantics; tests/optim/test_muon_authors_code.py steps beside a transcription of the former).
For each matrix W (a conv filter viewed as (out, in*kh*kw)) with
gradient G_t, this module implements the reference code's form of Algorithm 1:

    B_t = B_{t-1}.lerp(G_t, 1 - mu)             EMA momentum (`momentum_form="sum"`: B_t = mu B_{t-1} + G_t)
    U_t = G_t.lerp(B_t, mu) if nesterov else B_t (`"sum"`: U_t = G_t + mu B_t)
    O_t = NS_k(U_t)                             k quintic Newton–Schulz steps (`polar="svd"`: exact U V^T)
    W_t = (1 - lr wd) W_{t-1} - lr s(m, n) O_t  decoupled weight decay, then the scaled update

with s = max(1, m/n)^0.5 (`scale="shape"`, the reference code), 0.2 sqrt(max(m, n)) (`"rms"`, Moonlight's
AdamW RMS matching, torch's adjust_lr_fn="match_rms_adamw") or 1 (`"none"`, Algorithm 1 as written).
Because NS and the SVD polar factor are invariant to the scale of U_t (up to the normalisation eps), the
"ema" and "sum" momentum forms give the same update; they differ only in the stored buffer.
m and n are the rows and columns of the matrix view. The reference code instead takes the ratio from the
original tensor's last two dims, which for a 4-D conv filter is kh/kw (`muon_update`'s grad.size(-2) / grad.size(-1));
here a conv filter is scaled like the (out, in*kh*kw) matrix it is orthogonalized as.

`batch_matrices` picks how matrices are orthogonalized. "off": each on its own with 2-D matmuls, op for op
as in torch.optim.Muon (its bfloat16 NS output is matched bit for bit). "on": the same-shape matrices of a
param group are stacked and orthogonalized by one batched Newton–Schulz call (batched matmuls), which saves a
kernel launch chain per matrix on a GPU. "auto" (default) is "on" on CUDA and "off" elsewhere
(`base.BATCH_MODES`: on CPU, stacking measured up to 1.5x slower at GPT-2 sizes). The caller's `p.grad` is
never modified (the reference code's Nesterov path overwrites it). The momentum buffer has the parameter's
dtype; the Newton–Schulz iteration runs in `ns_dtype` ("auto": bfloat16 on CUDA, float32 elsewhere).
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
from structbench.optim.base import BATCH_MATRICES, StructuredOptimizer, stacks_matrices
from structbench.optim.distributed import DISTRIBUTED
from structbench.optim.hparams import Declaration, code, decade_around, flag, integer, lin, option, ours, real
from structbench.optim.hybrid import ADAMW_FALLBACK, adamw_state_bytes, hybrid_builder
from structbench.optim.linalg import NS_CUBIC, NS_QUINTIC, newton_schulz, polar_svd
from structbench.optim.partition import matrix_shape, matrix_view, split
from structbench.optim.registry import NamedParams, OptimizerEntry, Routing, register

NS_COEFFICIENTS: dict[str, tuple[float, float, float]] = {"quintic": NS_QUINTIC, "cubic": NS_CUBIC}
NS_DTYPES: dict[str, torch.dtype | None] = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}
MOMENTUM_FORMS = ("ema", "sum")
POLAR_METHODS = ("ns", "svd")
SCALES = ("shape", "rms", "none")
REFERENCE = "KellerJordan/Muon muon.py"

ORTHOGONALIZATION = Declaration(
    option("polar", "ns", POLAR_METHODS, code(f"{REFERENCE}: Newton-Schulz; 'svd' is the exact U V^T")),
    integer("ns_steps", 5, code(f"{REFERENCE}, zeropower_via_newtonschulz5"), "[1, inf)"),
    option("ns_coefficients", "quintic", NS_COEFFICIENTS, code(f"{REFERENCE}: (3.4445, -4.7750, 2.0315)")),
    real("ns_eps", 1e-7, code(f"{REFERENCE}: X0 = G / (||G||_F + 1e-7)"), "[0, inf)"),
    option("ns_dtype", "auto", NS_DTYPES, ours("bfloat16 on CUDA as the reference code, float32 on CPU")),
)
"""How a momentum is orthogonalized: Muon's, and FISMO's polar step."""
RMS_MATCH = 0.2
"""Moonlight's target update RMS (AdamW's typical RMS): s = 0.2 sqrt(max(m, n))."""
STREAK = "consecutive_solver_failures"
"""A parameter's state entry counting its exact-SVD failures in a row, present only while a streak runs."""


def update_scale(rows: int, cols: int, scale: str) -> float:
    """The factor s(m, n) that multiplies the orthogonalized update of an m x n matrix."""
    if scale == "shape":
        return math.sqrt(max(1.0, rows / cols))
    if scale == "rms":
        return RMS_MATCH * math.sqrt(max(rows, cols))
    if scale == "none":
        return 1.0
    raise ValueError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")


class Muon(StructuredOptimizer):
    """Muon over matrix parameters (2-D, or conv filters through their (out, in*kh*kw) view).

    `solver_failures` counts exact-SVD failures (`polar="svd"` only): that step falls back to Newton–Schulz
    for the affected matrices, and SolverError is raised after 3 consecutive failures of one parameter.
    """

    matrices_only = "Muon"

    hparams = (
        Declaration(
            real("lr", 0.02, code(REFERENCE), "(0, inf)", decade_around()),
            real("momentum", 0.95, code(REFERENCE), "[0, 1)", lin(0.91, 0.99)),
            flag("nesterov", True, code(REFERENCE)),
            option("momentum_form", "ema", MOMENTUM_FORMS, code(f"{REFERENCE}: lerp; 'sum' is Algorithm 1's form")),
            option("scale", "shape", SCALES, code(f"{REFERENCE}: max(1, m/n)^0.5; 'rms' is Moonlight's")),
            real("weight_decay", 0.0, code(REFERENCE), "[0, inf)"),
        )
        + ORTHOGONALIZATION
        + BATCH_MATRICES
    )
    hparams = hparams + DISTRIBUTED

    def step_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        for p in params:
            if p.grad.is_sparse or p.grad.is_complex():
                raise RuntimeError("Muon supports dense real gradients only")
        if not params:
            return
        if stacks_matrices(group["batch_matrices"], params[0].device):
            self._step_stacked(params, group)
        else:
            for p in params:
                ortho = self._orthogonalize(matrix_view(self._momentum_update(p, group)), [p], group)
                self._apply(p, ortho, group)

    def _step_stacked(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """Orthogonalize the same-shape (and dtype, device) matrices of `params` as one (k, m, n) batch."""
        buckets: dict[tuple[tuple[int, int], torch.dtype, torch.device], list[Tensor]] = defaultdict(list)
        for p in params:
            buckets[(matrix_shape(p.shape), p.dtype, p.device)].append(p)
        for owned in buckets.values():
            updates = [matrix_view(self._momentum_update(p, group)) for p in owned]
            if len(owned) == 1:
                orthos = [self._orthogonalize(updates[0], owned, group)]
            else:
                orthos = self._orthogonalize(torch.stack(updates), owned, group).unbind(0)
            for p, ortho in zip(owned, orthos, strict=True):
                self._apply(p, ortho, group)

    @staticmethod
    def _apply(p: Tensor, ortho: Tensor, group: Mapping[str, Any]) -> None:
        """W_t = (1 - lr wd) W_{t-1} - lr s(m, n) O_t, with O_t the (m, n) orthogonalized update of p."""
        lr, decay = group["lr"], 1.0 - group["lr"] * group["weight_decay"]
        if decay != 1.0:
            p.mul_(decay)
        p.add_(ortho.view_as(p), alpha=-lr * update_scale(*ortho.shape, group["scale"]))

    def _momentum_update(self, p: Tensor, group: Mapping[str, Any]) -> Tensor:
        """B_t, stored in p's momentum buffer, and the U_t that is orthogonalized."""
        grad, buf, beta = p.grad, self._momentum_buffer(p), group["momentum"]
        if group["momentum_form"] == "ema":
            buf.lerp_(grad, 1.0 - beta)
            return grad.lerp(buf, beta) if group["nesterov"] else buf
        buf.mul_(beta).add_(grad)
        return grad.add(buf, alpha=beta) if group["nesterov"] else buf

    def _momentum_buffer(self, p: Tensor) -> Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state["momentum_buffer"]

    def _orthogonalize(self, update: Tensor, owned: list[Tensor], group: Mapping[str, Any]) -> Tensor:
        """The polar factor (or its NS approximation) of the (m, n) update, or of each matrix of a (k, m, n)
        stack of the updates of the `owned` parameters."""
        if group["polar"] == "svd":
            try:
                ortho = polar_svd(update)
            except SolverError:
                self._count_failure(owned)
            else:
                for p in owned:
                    self.solver_ok(self.state[p], STREAK, forget=True)
                return ortho
        return newton_schulz(
            update,
            steps=group["ns_steps"],
            coefficients=NS_COEFFICIENTS[group["ns_coefficients"]],
            eps=group["ns_eps"],
            dtype=NS_DTYPES[group["ns_dtype"]],
            cast_back=False,  # p.add_ takes the NS dtype, as in torch.optim.Muon
        )

    def _count_failure(self, owned: list[Tensor]) -> None:
        """One failed SVD of a stack counts once in `solver_failures` and once in each owned parameter's streak."""
        self.solver_failures += 1
        for p in owned:
            self.solver_failed(self.state[p], STREAK, partial(_svd_failure, p), failures=0)


def _svd_failure(p: Tensor, streak: int) -> str:
    return f"Muon: the SVD polar factor of a {tuple(p.shape)} parameter failed {streak} steps in a row"


def _route(model: torch.nn.Module | None, named: NamedParams, hp: Mapping[str, Any]) -> Routing:
    return split(model, named, fallback_name="adamw", head_to_fallback=True)


def _state_bytes(structured: list[tuple[int, ...]], fallback: list[tuple[int, ...]], hp: Mapping[str, Any]) -> int:
    """One float32 momentum buffer per owned matrix, plus torch AdamW's state for the fallback."""
    return sum(4 * math.prod(shape) for shape in structured) + adamw_state_bytes(fallback)


MUON = register(
    OptimizerEntry(
        name="muon",
        summary="Muon: EMA/Nesterov momentum orthogonalized by quintic Newton–Schulz; AdamW for the rest",
        reference=(
            "Jordan et al. 2024, 'Muon: An optimizer for hidden layers in neural networks', Algorithm 1; "
            "KellerJordan/Muon muon.py; torch.optim.Muon"
        ),
        hparams=Muon.hparams + ADAMW_FALLBACK,
        build=hybrid_builder(Muon),
        route=_route,
        notes=(
            "The blog's Algorithm 1 box is the form momentum_form='sum', nesterov=False, scale='none'. "
            "scale='rms' is Moonlight's 0.2 sqrt(max(m, n)); polar='svd' is the exact U V^T (ASGO Prop. 1, FISMO's "
            "ideal Muon). Conv filters are scaled by their (out, in*kh*kw) view; the reference uses kh/kw. "
            "Fallback: AdamW with the reference's aux-Adam settings for 1-D params, embeddings and the head."
        ),
        lr_keys=("lr", "adamw_lr"),
        state_bytes=_state_bytes,
    )
)
