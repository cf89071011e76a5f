"""Muon and its AdamW fallback stepped side by side with a float64 transcription of the authors' code.

The reference is KellerJordan/Muon `muon.py` at commit 857d1adc159e098212f828d927460782d3da59e9, transcribed in
tests/support/muon_reference.py (`zeropower_via_newtonschulz5` lines 5-31, `muon_update` 34-41, `SingleDeviceMuon.step`
115-125, `adam_update` 130-135 and `SingleDeviceMuonWithAuxAdam`'s Adam branch 271-284). Parameters and gradients are
float64, so the momentum buffers (and Adam's moments) of both sides hold the same numbers and every difference comes
from the orthogonalization's arithmetic. What tests/optim/test_muon.py already covers is not repeated here: two steps
against the formula with float32 roundings modelled, and parity with torch.optim.Muon and pytorch_optimizer.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from structbench.optim import registry
from structbench.optim.muon import Muon, update_scale
from tests.support.muon_reference import QUINTIC, AdamState, jordan_adam_step, jordan_muon_step
from tests.support.newton_schulz import U32, gamma, ns_bound
from tests.support.steps import random_grads

F64 = torch.float64
U64 = 2.0**-53
STEPS = 8
LR, MOMENTUM = 0.02, 0.95
SHAPES = [(16, 40), (40, 16), (24, 24), (8, 4, 3, 3)]
"""Wide, tall, square and a conv filter whose (out, in*kh*kw) view is wide: both scales are 1 (see the kh/kw test)."""
BF16_UNIT = 2.0**-8
PERTURBATION_SEEDS = 4


def _start(shapes: list[tuple[int, ...]]) -> list[Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(*s, generator=gen, dtype=F64) for s in shapes]


def _float64_grads(shapes: list[tuple[int, ...]], seed: int = 3) -> list[list[Tensor]]:
    return [[g.to(F64) for g in gs] for gs in random_grads(shapes, STEPS, seed=seed)]


def _ours(start: list[Tensor], grads: list[list[Tensor]], ns_dtype: str, weight_decay: float) -> list[list[Tensor]]:
    """Our Muon on float64 copies of `start`: the parameters after each step."""
    params = [nn.Parameter(w.clone()) for w in start]
    opt = Muon(params, lr=LR, momentum=MOMENTUM, weight_decay=weight_decay, ns_dtype=ns_dtype, batch_matrices="off")
    history = []
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
        history.append([p.detach().clone() for p in params])
    return history


def _reference(
    start: list[Tensor], grads: list[list[Tensor]], ns_dtype: torch.dtype, weight_decay: float
) -> list[list[Tensor]]:
    """The transcribed SingleDeviceMuon on copies of `start`: the parameters after each step."""
    weights, buffers = [w.clone() for w in start], [torch.zeros_like(w) for w in start]
    history = []
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            weights[i], buffers[i] = jordan_muon_step(weights[i], g, buffers[i], LR, weight_decay, MOMENTUM, ns_dtype)
        history.append([w.clone() for w in weights])
    return history


def _perturbed(grads: list[list[Tensor]], unit: float, seed: int) -> list[list[Tensor]]:
    """Each gradient entry moved by `unit`, relative, with a random sign."""
    gen = torch.Generator().manual_seed(seed)
    signs = [[torch.randint(0, 2, g.shape, generator=gen, dtype=F64) * 2 - 1 for g in gs] for gs in grads]
    return [[g * (1 + unit * s) for g, s in zip(gs, ss, strict=True)] for gs, ss in zip(grads, signs, strict=True)]


def _max_gaps(a: list[list[Tensor]], b: list[list[Tensor]]) -> list[list[float]]:
    """Per step and parameter, max |a - b|."""
    return [[float((x - y).abs().max()) for x, y in zip(xs, ys, strict=True)] for xs, ys in zip(a, b, strict=True)]


def _bfloat16_noise_floor(start: list[Tensor], grads: list[list[Tensor]], weight_decay: float) -> list[list[float]]:
    """The bfloat16 reference against itself: per step and parameter, the largest max |W - W'| over runs whose
    gradients are perturbed by one bfloat16 unit roundoff."""
    base = _reference(start, grads, torch.bfloat16, weight_decay)
    runs = [
        _max_gaps(base, _reference(start, _perturbed(grads, BF16_UNIT, seed), torch.bfloat16, weight_decay))
        for seed in range(PERTURBATION_SEEDS)
    ]
    return [[max(run[t][i] for run in runs) for i in range(len(start))] for t in range(len(grads))]


def test_bfloat16_muon_follows_keller_jordans_code_through_eight_steps() -> None:
    """Ours with ns_dtype="bfloat16" against muon.py as released (line 17 casts to bfloat16), lr 0.02, momentum 0.95,
    Nesterov, weight decay 0.1, on wide, tall, square and conv parameters, 8 steps.

    Tolerance: the two differ only in NS's rounding order (we fuse b A + c A A and a X + B X into one addmm each, as
    torch.optim.Muon; muon.py rounds every product and sum, lines 26-27) and in where the shape scale is multiplied
    (line 40 in bfloat16; we fold it into lr). A bfloat16 matmul accumulates in float32 and rounds once, so each of
    the 5 iterations injects about one bfloat16 unit roundoff into its iterate, which then passes through at most the
    remaining iterations: the difference is at most 5 times the effect of one-unit-roundoff noise entering at the
    start, measured as the reference against itself with its gradients perturbed by one bfloat16 unit roundoff
    (largest over 4 sign draws), per step and parameter."""
    start, grads = _start(SHAPES), _float64_grads(SHAPES)
    ours = _ours(start, grads, "bfloat16", weight_decay=0.1)
    reference = _reference(start, grads, torch.bfloat16, weight_decay=0.1)
    floor = _bfloat16_noise_floor(start, grads, weight_decay=0.1)
    for step, (gaps, floors) in enumerate(zip(_max_gaps(ours, reference), floor, strict=True)):
        for shape, gap, noise in zip(SHAPES, gaps, floors, strict=True):
            assert gap <= 5 * noise, f"step {step}, {shape}: |ours - muon.py| {gap:.3g} > 5 x {noise:.3g}"


def _ns_rounding(update: Tensor, u: float) -> float:
    """Frobenius bound on NS5 of `update` (viewed as a matrix) computed in precision u against the exact iteration:
    tests/support/newton_schulz.ns_bound from the singular values of X0 = U / ||U||_F, with X0's own error (the cast,
    the mn-term norm and the division) as input error."""
    matrix = update.reshape(len(update), -1)
    rows, cols = matrix.shape
    singular = torch.linalg.svdvals(matrix / torch.linalg.matrix_norm(matrix)).tolist()
    return ns_bound(singular, rows, cols, QUINTIC, 5, gamma(rows * cols + 3, u), u)


def test_float32_muon_follows_keller_jordans_code_in_float64_through_eight_steps() -> None:
    """Ours with ns_dtype="float32" against muon.py computed in float64 (the line-17 cast switched to float64): the
    same settings and shapes as the bfloat16 test. The momentum buffers hold the same float64 numbers on both sides,
    so W_t differs by sum_k lr s (O_k - O_k^exact) (the decay only shrinks it): the bound accumulates, per step,
    lr s ns_bound(U_k, float32) (ns_bound: first-order rounding of the iteration) for ours and the same in float64 for
    the transcription, plus float64 rounding of the decay and the update (4 u ||W||_F). The bound is first order and
    worst case (NS5's gain, ~1e3): 4e-4 to 3.5e-3 after 8 steps, about 1e3 times the gap seen; a wrong scale, momentum
    or decay moves W by lr ||O|| ~ 0.08 a step."""
    start, grads = _start(SHAPES), _float64_grads(SHAPES)
    ours = _ours(start, grads, "float32", weight_decay=0.1)
    reference = _reference(start, grads, torch.float64, weight_decay=0.1)
    buffers = [torch.zeros_like(w) for w in start]
    bounds = [0.0] * len(SHAPES)
    for step, step_grads in enumerate(grads):
        for i, (g, shape) in enumerate(zip(step_grads, SHAPES, strict=True)):
            buffers[i] = buffers[i].lerp(g, 1 - MOMENTUM)
            update = g.lerp(buffers[i], MOMENTUM)
            scale = update_scale(shape[0], math.prod(shape[1:]), "shape")
            rounding = _ns_rounding(update, U32) + _ns_rounding(update, U64)
            bounds[i] += LR * scale * rounding + 4 * U64 * float(torch.linalg.vector_norm(reference[step][i]))
            gap = float(torch.linalg.vector_norm(ours[step][i] - reference[step][i]))
            assert gap <= bounds[i], f"step {step}, {shape}: ||ours - muon.py|| {gap:.3g} > {bounds[i]:.3g}"


def test_conv_filters_differ_from_the_code_by_the_documented_scale() -> None:
    """muon.py line 40 scales by max(1, kh/kw)^0.5 (the original tensor's last two dims), ours by the
    (out, in*kh*kw) view's max(1, out / (in kh kw))^0.5, as structbench/optim/muon.py's docstring states. Without
    weight decay W_t - W_0 = -lr s sum_k O_k, so ours is the code's times sqrt(64/27) for a (64, 3, 3, 3) filter and
    equal to it for (8, 4, 3, 3). Float32 NS ours, float64 the code's; bound as in the float32 test, at our scale."""
    shapes = [(64, 3, 3, 3), (8, 4, 3, 3)]
    ratios = [math.sqrt(64 / 27), 1.0]
    start, grads = _start(shapes), _float64_grads(shapes, seed=4)
    ours = _ours(start, grads, "float32", weight_decay=0.0)
    reference = _reference(start, grads, torch.float64, weight_decay=0.0)
    buffers = [torch.zeros_like(w) for w in start]
    bounds = [0.0] * len(shapes)
    for step, step_grads in enumerate(grads):
        for i, (g, w0, ratio) in enumerate(zip(step_grads, start, ratios, strict=True)):
            buffers[i] = buffers[i].lerp(g, 1 - MOMENTUM)
            update = g.lerp(buffers[i], MOMENTUM)
            scale = update_scale(shapes[i][0], math.prod(shapes[i][1:]), "shape")
            bounds[i] += LR * scale * (_ns_rounding(update, U32) + _ns_rounding(update, U64))
            bounds[i] += 4 * U64 * float(torch.linalg.vector_norm(ours[step][i]))
            expected = w0 + ratio * (reference[step][i] - w0)
            assert float(torch.linalg.vector_norm(ours[step][i] - expected)) <= bounds[i], (step, shapes[i])


class _Net(nn.Module):
    """A hidden matrix for Muon; an embedding, biases, a norm and the head for the AdamW fallback."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 6)
        self.hidden = nn.Linear(6, 10)
        self.norm = nn.LayerNorm(10)
        self.head = nn.Linear(10, 3)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_fallback_is_the_codes_auxiliary_adam(weight_decay: float) -> None:
    """The 'muon' entry's fallback (torch.optim.AdamW with the AUX_ADAM defaults: lr 3e-4, betas (0.9, 0.95),
    eps 1e-10) against muon.py's adam_update (lines 130-135: lerp moments, bias-corrected, eps added to the corrected
    sqrt(v)) and its decay-then-update (lines 282-284), over 8 steps on float64 parameters, with eps 1e-3 so that its
    placement shows (eps added to sqrt(v) before the correction would change each update by ~10%).

    Tolerance, entrywise: each update is computed in float64 in a different order on each side (torch divides sqrt(v)
    by sqrt(bias correction 2) and folds 1/bias correction 1 into the step), at most 12 roundings each, so the two
    updates agree to 24 u |update|; the parameters add their own rounding, u |W|, per step on each side."""
    torch.manual_seed(0)
    model = _Net().to(F64)
    hparams = {"adamw_eps": 1e-3, "adamw_weight_decay": weight_decay}
    optimizer, routing = registry.build_with_routing("muon", model, hparams)
    named = dict(model.named_parameters())
    fallback = [named[name] for name in routing.fallback]
    assert {"embed.weight", "hidden.bias", "norm.weight", "head.weight"} <= set(routing.fallback)
    entry = registry.get("muon").defaults
    betas = (entry["adamw_beta1"], entry["adamw_beta2"])
    assert (entry["adamw_lr"], betas) == (3e-4, (0.9, 0.95))  # muon.py lines 243-244
    weights = [p.detach().clone() for p in fallback]
    states = [AdamState.zeros_like(w) for w in weights]
    bound = [torch.zeros_like(w) for w in weights]
    gen = torch.Generator().manual_seed(5)
    for _ in range(STEPS):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen, dtype=F64) * 1e-3
        previous = [w.clone() for w in weights]
        optimizer.step()
        for i, p in enumerate(fallback):
            weights[i] = jordan_adam_step(weights[i], p.grad, states[i], entry["adamw_lr"], betas, 1e-3, weight_decay)
            update = (weights[i] - previous[i] * (1 - entry["adamw_lr"] * weight_decay)).abs()
            bound[i] += 24 * U64 * update + 2 * U64 * weights[i].abs()
    for name, p, w, allowed in zip(routing.fallback, fallback, weights, bound, strict=True):
        assert bool(((p.detach() - w).abs() <= allowed).all()), name
