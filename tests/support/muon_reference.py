"""Float64 transcriptions of the authors' code that Muon, the hybrids' fallback and SUMO name, for side-by-side tests.

Read for their computation, written here in the tests' style (nothing of theirs is copied):
- KellerJordan/Muon `muon.py` at commit 857d1adc159e098212f828d927460782d3da59e9: `zeropower_via_newtonschulz5`
  (lines 5-31), `muon_update` (34-41), `SingleDeviceMuon.step` (115-125), `adam_update` (130-135) and
  `SingleDeviceMuonWithAuxAdam.step`'s Adam branch (271-284).
- jiaweizzhao/GaLore `galore_torch/adamw.py` at commit 2cc66f88cce189e505affbb91042a8e77f5bf4e9: `AdamW.step` without
  a projector (lines 105-146), the transformers-style AdamW.
Each function works on float64 tensors unless told to round (`ns_dtype`), and returns new tensors (the authors' code
works in place; in particular `muon_update`'s Nesterov `grad.lerp_` overwrites the caller's gradient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

JORDAN_COMMIT = "857d1adc159e098212f828d927460782d3da59e9"
GALORE_COMMIT = "2cc66f88cce189e505affbb91042a8e77f5bf4e9"
QUINTIC = (3.4445, -4.7750, 2.0315)
"""muon.py line 16."""


def jordan_zeropower(g: Tensor, steps: int, ns_dtype: torch.dtype = torch.float64) -> Tensor:
    """muon.py lines 16-31: X = G in `ns_dtype` (line 17 casts to bfloat16: pass torch.bfloat16 for the code as
    released), transposed when tall, X / (||X||_F + 1e-7), then `steps` times A = X X^T, B = b A + c A A,
    X = a X + B X, each operation rounded to `ns_dtype` as written there; transposed back. Returns `ns_dtype`."""
    a, b, c = QUINTIC
    x = g.to(ns_dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        poly = b * gram + c * gram @ gram
        x = a * x + poly @ x
    return x.mT if tall else x


def jordan_muon_update(
    grad: Tensor, momentum: Tensor, beta: float, ns_steps: int, nesterov: bool, ns_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """muon.py lines 34-41: (the scaled orthogonalized update, the new momentum buffer).

    The momentum lerp (line 35) and the Nesterov mix (36) run in the gradient's dtype; a 4-D conv filter is viewed as
    (out, in*kh*kw) for NS (37-38); the scale (line 40) is max(1, grad.size(-2) / grad.size(-1))^0.5 of the original
    tensor, kh/kw for a conv filter, multiplied into the NS output in its dtype."""
    buffer = momentum.lerp(grad, 1 - beta)
    update = grad.lerp(buffer, beta) if nesterov else buffer
    if update.ndim == 4:
        update = update.view(len(update), -1)
    ortho = jordan_zeropower(update, ns_steps, ns_dtype)
    return ortho * max(1, grad.size(-2) / grad.size(-1)) ** 0.5, buffer


def jordan_muon_step(
    p: Tensor, grad: Tensor, momentum: Tensor, lr: float, weight_decay: float, beta: float, ns_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """muon.py lines 123-125 (SingleDeviceMuon: `muon_update`'s defaults nesterov=True and 5 NS steps): decay p, then
    add the update reshaped to p's shape (line 125's `p.add_` rounds it into p's dtype). Returns (new p, momentum)."""
    update, buffer = jordan_muon_update(grad, momentum, beta, ns_steps=5, nesterov=True, ns_dtype=ns_dtype)
    decayed = p * (1 - lr * weight_decay)
    return decayed - lr * update.reshape(p.shape).to(p.dtype), buffer


@dataclass
class AdamState:
    """The state `SingleDeviceMuonWithAuxAdam` and GaLore's AdamW keep per parameter."""

    exp_avg: Tensor
    exp_avg_sq: Tensor
    step: int = 0

    @classmethod
    def zeros_like(cls, p: Tensor) -> AdamState:
        return cls(torch.zeros_like(p), torch.zeros_like(p))


def jordan_adam_step(
    p: Tensor, grad: Tensor, state: AdamState, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> Tensor:
    """muon.py lines 130-135 and 279-284: both moments by lerp, bias-corrected, eps added to the corrected
    sqrt(v); decay p, then subtract lr times the update. Updates `state`; returns the new p."""
    state.step += 1
    state.exp_avg = state.exp_avg.lerp(grad, 1 - betas[0])
    state.exp_avg_sq = state.exp_avg_sq.lerp(grad.square(), 1 - betas[1])
    corrected_avg = state.exp_avg / (1 - betas[0] ** state.step)
    corrected_sq = state.exp_avg_sq / (1 - betas[1] ** state.step)
    update = corrected_avg / (corrected_sq.sqrt() + eps)
    return p * (1 - lr * weight_decay) - lr * update


def galore_adamw_step(
    p: Tensor, grad: Tensor, state: AdamState, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> Tensor:
    """galore_torch/adamw.py lines 111-146 (correct_bias=True, no projector): moments by mul/add, eps added to the
    *uncorrected* sqrt(v) (line 120), the bias corrections folded into the step size (122-126), the update applied,
    then weight decay of the *updated* p (145-146). Updates `state`; returns the new p."""
    state.step += 1
    state.exp_avg = state.exp_avg * betas[0] + (1 - betas[0]) * grad
    state.exp_avg_sq = state.exp_avg_sq * betas[1] + (1 - betas[1]) * grad * grad
    denom = state.exp_avg_sq.sqrt() + eps
    step_size = lr * math.sqrt(1 - betas[1] ** state.step) / (1 - betas[0] ** state.step)
    stepped = p - step_size * (state.exp_avg / denom)
    return stepped - lr * weight_decay * stepped if weight_decay > 0 else stepped
