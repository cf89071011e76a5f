"""The transformers-style AdamW that GaLore's and SOAP's released code run on the parameters they do not project.

Both files carry the same Adam, a modification of the HuggingFace transformers AdamW:
- jiaweizzhao/GaLore `galore_torch/adamw.py`, commit 2cc66f88cce189e505affbb91042a8e77f5bf4e9, `AdamW.step` lines
  105-146 with no projector: m <- b1 m + (1-b1) g (line 118), v <- b2 v + (1-b2) g^2 (119), eps added to the
  *uncorrected* sqrt(v) (120), the bias corrections folded into the step size lr sqrt(1-b2^t) / (1-b1^t) (122-126),
  W <- W - step_size m / (sqrt(v) + eps) (135), then W <- W - lr wd W on the *updated* W with the raw lr (145-146).
- nikhilvyas/SOAP `soap.py`, commit a1e553530fde97d0e6b307d7c82ac6d38b072340, `SOAP.step` lines 121-210 for a 1-D
  parameter (`precondition_1d=False`, its default: no statistic, `project` and `project_back` leave the tensor as it
  is, lines 221-223, 250-259, 318-327): the same arithmetic (lines 163-204), except that a parameter's first step
  only creates its state and leaves W unchanged (lines 139-153), so t counts the steps after it.

Against torch.optim.AdamW: eps enters as eps / sqrt(1 - b2^t) in the bias-corrected form (32 eps at t = 1 with b2 =
0.999), and weight decay comes after the update instead of before it. `skip_first_step` gives SOAP's first step.

State per parameter, as in the code: `exp_avg` and `exp_avg_sq` in the parameter's dtype (the arithmetic too) and
`step`, a Python int (no tensor bytes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


class HFAdamW(torch.optim.Optimizer):
    """GaLore's / SOAP's code AdamW (module doc): eps on the uncorrected sqrt(v), decay after the update."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        skip_first_step: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "skip_first_step": skip_first_step,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One step for every parameter with a gradient: the parameters of a group at the same step count, dtype and
        device take it together (`_adam_steps`, one foreach call per operation)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            due: dict[tuple[int, torch.dtype, torch.device], list[Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("HFAdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    _init_state(state, p)
                    if group["skip_first_step"]:
                        continue
                state["step"] += 1
                due[(state["step"], p.dtype, p.device)].append(p)
            for (t, _, _), params in due.items():
                _adam_steps(params, [self.state[p] for p in params], group, t)
        return loss


def _init_state(state: dict[str, Any], p: Tensor) -> None:
    """Zero moments like the parameter, step 0 (galore_torch/adamw.py lines 105-109, soap.py lines 129-137)."""
    state["step"] = 0
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def advance_moments(
    exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], grads: list[Tensor], beta1: float, beta2: float, eps: float
) -> list[Tensor]:
    """m <- b1 m + (1 - b1) g and v <- b2 v + (1 - b2) g^2 in place (one foreach call per operation), and the
    denominators sqrt(v) + eps with eps on the uncorrected sqrt(v) (galore_torch/adamw.py lines 118-120; also the
    projected Adam of structbench.optim.galore)."""
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denoms, eps)
    return denoms


def _adam_steps(params: list[Tensor], states: list[dict[str, Any]], group: dict[str, Any], t: int) -> None:
    """Step t of galore_torch/adamw.py lines 111-146 (= soap.py lines 160-204 for a 1-D parameter) for `params`, in
    their dtype: each operation one foreach call over the list, elementwise the code's own operation."""
    beta1, beta2 = group["betas"]
    exp_avgs = [state["exp_avg"] for state in states]
    exp_avg_sqs = [state["exp_avg_sq"] for state in states]
    denoms = advance_moments(exp_avgs, exp_avg_sqs, [p.grad for p in params], beta1, beta2, group["eps"])
    step_size = group["lr"] * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
    torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-step_size)
    if group["weight_decay"] > 0.0:
        torch._foreach_add_(params, params, alpha=-group["lr"] * group["weight_decay"])


def hf_adamw_state_bytes(shapes: list[tuple[int, ...]]) -> int:
    """`HFAdamW`'s state for float32 parameters: exp_avg and exp_avg_sq, 4 bytes per element each (as
    `hybrid.adamw_state_bytes`, less torch AdamW's float32 step scalar)."""
    return sum(2 * 4 * math.prod(shape) for shape in shapes)
