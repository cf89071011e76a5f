"""The 'sgd' and 'adamw' entries (thin wrappers over torch.optim) against float64 transcriptions of the code they name.

pytorch 2.13.0 (the installed release), read for its computation: torch/optim/sgd.py `_single_tensor_sgd` (lines
346-376: L2 weight decay into the gradient, a first buffer that is the gradient itself, then buf = mu buf + g,
Nesterov g + mu buf) and torch/optim/adam.py `_single_tensor_adam` with decoupled_weight_decay=True, which
torch/optim/adamw.py's AdamW sets (lines 413-540: decay p by 1 - lr wd, lerp/mul-add moments, eps added to the
bias-corrected sqrt(v), step lr / (1 - beta1^t)). The declarations marked "code: pytorch ... default" are checked
against the defaults torch's signatures hold. Float64 parameters, so the transcription and torch differ by float64
rounding only.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import Tensor, nn

from structbench.optim import registry
from tests.support.muon_reference import AdamState

F64 = torch.float64
U64 = 2.0**-53
STEPS = 10
SHAPES = [(6, 15), (15, 6), (9, 9), (4, 3, 3, 3), (7,)]
"""Wide, tall, square, a conv filter and a vector: a first-order method treats every one entrywise."""


def _run(name: str, hparams: dict[str, float | bool]) -> tuple[list[Tensor], list[list[Tensor]], list[Tensor]]:
    """The entry `name` over STEPS float64 steps: its start, the gradients and its final parameters."""
    gen = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.randn(*s, generator=gen, dtype=F64)) for s in SHAPES]
    start = [p.detach().clone() for p in params]
    optimizer = registry.make_optimizer(name, list(zip("abcde", params, strict=True)), **hparams)
    grads = [[torch.randn(*s, generator=gen, dtype=F64) for s in SHAPES] for _ in range(STEPS)]
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
    return start, grads, [p.detach() for p in params]


def _sgd_reference(w: Tensor, grads: list[Tensor], lr: float, mu: float, wd: float, nesterov: bool) -> tuple:
    """sgd.py lines 346-376 in float64; returns (W, the entrywise rounding allowed against torch): per step, the
    decayed gradient, the buffer and the Nesterov mix each 2 roundings on either side, relative to the terms'
    magnitudes, times lr, plus W's own rounding."""
    buffer, allowed = None, torch.zeros_like(w)
    for g in grads:
        g = g + wd * w
        buffer = g.clone() if buffer is None else mu * buffer + g
        direction = g + mu * buffer if nesterov else buffer
        w = w - lr * direction
        allowed += 12 * U64 * lr * (g.abs() + mu * buffer.abs() + wd * w.abs()) + 2 * U64 * w.abs()
    return w, allowed


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_entry_steps_as_torch_sgds_code(nesterov: bool) -> None:
    """Ten steps, momentum 0.9, weight decay 0.1 (L2, into the gradient: a decoupled decay differs by lr wd |W| ~
    1e-3 a step), on every shape."""
    settings = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1, "nesterov": nesterov}
    start, grads, ours = _run("sgd", settings)
    for i, (w0, mine) in enumerate(zip(start, ours, strict=True)):
        expected, allowed = _sgd_reference(w0, [gs[i] for gs in grads], 0.05, 0.9, 0.1, nesterov)
        assert bool(((mine - expected).abs() <= allowed).all()), SHAPES[i]


def _adamw_reference(w: Tensor, grads: list[Tensor], lr: float, betas: tuple, eps: float, wd: float) -> tuple:
    """adam.py lines 413-540 (decoupled decay) in float64; returns (W, the entrywise rounding allowed against torch):
    per step 24 u of the update (two orders of about 12 roundings each) plus W's own rounding."""
    state, allowed = AdamState.zeros_like(w), torch.zeros_like(w)
    for g in grads:
        state.step += 1
        state.exp_avg = state.exp_avg + (1 - betas[0]) * (g - state.exp_avg)
        state.exp_avg_sq = betas[1] * state.exp_avg_sq + (1 - betas[1]) * g * g
        denom = (state.exp_avg_sq / (1 - betas[1] ** state.step)).sqrt() + eps
        update = lr * state.exp_avg / (1 - betas[0] ** state.step) / denom
        w = w * (1 - lr * wd) - update
        allowed += 24 * U64 * update.abs() + 2 * U64 * w.abs()
    return w, allowed


def test_adamw_entry_steps_as_torch_adamws_code() -> None:
    """Ten steps with weight decay 0.1 and eps 1e-3 (so that eps's place shows: before the correction it would move
    each update by ~10%), on every shape."""
    settings = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-3, "weight_decay": 0.1}
    start, grads, ours = _run("adamw", settings)
    for i, (w0, mine) in enumerate(zip(start, ours, strict=True)):
        expected, allowed = _adamw_reference(w0, [gs[i] for gs in grads], 0.01, (0.9, 0.999), 1e-3, 0.1)
        assert bool(((mine - expected).abs() <= allowed).all()), SHAPES[i]


def _torch_default(cls: type, keyword: str) -> object:
    return inspect.signature(cls.__init__).parameters[keyword].default


def test_declared_torch_defaults_are_torchs() -> None:
    """Every default declared as "code: pytorch torch/optim/... default" is the one torch's signature holds."""
    sgd, adamw = registry.get("sgd").defaults, registry.get("adamw").defaults
    assert sgd["nesterov"] is _torch_default(torch.optim.SGD, "nesterov")
    assert sgd["weight_decay"] == _torch_default(torch.optim.SGD, "weight_decay")
    assert adamw["lr"] == _torch_default(torch.optim.AdamW, "lr")
    assert (adamw["beta1"], adamw["beta2"]) == _torch_default(torch.optim.AdamW, "betas")
    assert adamw["eps"] == _torch_default(torch.optim.AdamW, "eps")
    assert adamw["weight_decay"] == _torch_default(torch.optim.AdamW, "weight_decay")
    assert registry.get("racs").defaults["adamw_eps"] == _torch_default(torch.optim.AdamW, "eps")
