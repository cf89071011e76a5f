"""The parts of SUMO that name released code, stepped beside float64 transcriptions of that code.

SUMO itself has no released code (structbench/optim/sumo.py); two of its parts name code:
- `orth="ns_quintic"` (the 'sumo-ns5' entry) and `ns_normalize="frobenius"` name KellerJordan/Muon `muon.py`,
  commit 857d1adc159e098212f828d927460782d3da59e9, `zeropower_via_newtonschulz5` (lines 5-31), transcribed in
  tests/support/muon_reference.py. SUMO runs NS in its state dtype, float64 for float64 parameters, so the
  transcription runs in float64 too.
- The fallback's defaults name jiaweizzhao/GaLore `galore_torch/adamw.py`, commit
  2cc66f88cce189e505affbb91042a8e77f5bf4e9, `AdamW.step` (lines 105-146); the fallback itself is torch.optim.AdamW by
  default (`adamw_form="torch"`), which places eps differently (the second test measures that), and GaLore's code's
  AdamW with `adamw_form="hf"` (the third test steps it beside the transcription).
The basis refresh and the moment are SUMO's own (tests/optim/test_sumo*.py); here they are read from the state.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from structbench.optim import registry
from structbench.optim.partition import matrix_shape
from structbench.optim.sumo import Sumo, projects_left
from tests.support.muon_reference import QUINTIC, AdamState, galore_adamw_step, jordan_zeropower
from tests.support.newton_schulz import gamma, ns_bound

F64 = torch.float64
U64 = 2.0**-53
LR = 0.01
SHAPES = [(12, 30), (30, 12), (20, 20), (6, 4, 3, 3)]
"""Wide (projected from the right), tall (left), square and a conv filter (its (6, 36) view, right)."""


def _reference_change(basis: Tensor, moment: Tensor, left: bool) -> Tensor:
    """-lr Q NS5(M) in the oriented frame, transposed back to W's frame for a right-side projection."""
    change = -LR * basis @ jordan_zeropower(moment, 5)
    return change if left else change.mT


def _ns_rounding(moment: Tensor) -> float:
    """Frobenius bound on NS5 of the moment in float64 against the exact iteration (tests/support/newton_schulz
    .ns_bound from X0 = M / ||M||_F's singular values; X0's own error, the rn-term norm and the division, as input)."""
    rows, cols = moment.shape
    singular = torch.linalg.svdvals(moment / torch.linalg.matrix_norm(moment)).tolist()
    return ns_bound(singular, rows, cols, QUINTIC, 5, gamma(rows * cols + 2, U64), U64)


@pytest.mark.parametrize("momentum_form", ["sum", "ema"])
def test_sumo_ns5_orthogonalizes_as_keller_jordans_code(momentum_form: str) -> None:
    """Six steps, refresh every 2 steps (3 refreshes), rank 3, exact subspace, no limiter, alpha 1, no shape scale:
    each step's W_t - W_{t-1} against -lr Q_t zeropower_via_newtonschulz5(M_t), Q_t and M_t read from the state.

    Bound (Frobenius, per step): both NS5s are within ns_bound of the exact iteration, ours (fused products) once,
    muon.py's twice (it rounds b A, c A, (c A) A and their sum apart: gamma_{r+3} <= 2 gamma_{r+2}); ||Q||_2 = 1 up
    to float64 rounding, times lr; the product Q O (r + 2 roundings a side, gamma_{r+2} ||Q||_F ||O||_F each) and W's
    own rounding (u ||W||_F): 1e-12 to 4e-12 lr here. A missing NS step, a spectral normalisation or the cubic moves
    the update by >= 1e-2 lr."""
    gen = torch.Generator().manual_seed(0)
    params = [nn.Parameter(torch.randn(*s, generator=gen, dtype=F64)) for s in SHAPES]
    opt = Sumo(
        params,
        lr=LR,
        rank=3,
        update_freq=2,
        alpha=1.0,
        orth="ns_quintic",
        norm_limiter=False,
        shape_scale="none",
        subspace="exact",
        momentum_form=momentum_form,
    )
    for _ in range(6):
        before = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=F64)
        opt.step()
        for p, w in zip(params, before, strict=True):
            state, shape = opt.state[p], matrix_shape(p.shape)
            basis, moment = state["basis"], state["moment"]
            expected = _reference_change(basis, moment, projects_left(shape, "paper"))
            ortho = float(torch.linalg.matrix_norm(jordan_zeropower(moment, 5)))
            product = 2 * gamma(3 + 2, U64) * float(torch.linalg.matrix_norm(basis)) * ortho
            allowed = LR * (3 * _ns_rounding(moment) + product) + U64 * float(torch.linalg.vector_norm(p.detach()))
            gap = float(torch.linalg.vector_norm((p.detach() - w).reshape(shape) - expected))
            assert gap <= allowed, (tuple(p.shape), gap, allowed)


def _fallback_run(
    eps: float, steps: int, form: str = "torch", weight_decay: float = 0.0
) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
    """The 'sumo' entry's fallback parameters (the biases and the head) after `steps` steps on float64 gradients of
    size ~1e-4 (a fine-tuning scale), with `adamw_form` `form`; GaLore's AdamW transcribed beside them; the float64
    rounding allowed between the two (per step, 24 u |change| for two orders of about 12 roundings each, plus u |W|
    each side); the last gradients."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.ReLU(), nn.Linear(12, 3)).to(F64)
    overrides = {"adamw_lr": LR, "adamw_eps": eps, "adamw_form": form, "adamw_weight_decay": weight_decay}
    optimizer, routing = registry.build_with_routing("sumo", model, overrides)
    named = dict(model.named_parameters())
    fallback = [named[name] for name in routing.fallback]
    defaults = registry.get("sumo").defaults
    betas = (defaults["adamw_beta1"], defaults["adamw_beta2"])
    assert (betas, defaults["adamw_eps"], defaults["adamw_weight_decay"]) == ((0.9, 0.999), 1e-6, 0.0)  # adamw.py 41-44
    assert defaults["adamw_form"] == "torch"
    galore = [p.detach().clone() for p in fallback]
    states = [AdamState.zeros_like(w) for w in galore]
    bounds = [torch.zeros_like(w) for w in galore]
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen, dtype=F64) * 1e-4
        optimizer.step()
        for i, p in enumerate(fallback):
            previous = galore[i]
            galore[i] = galore_adamw_step(previous, p.grad, states[i], LR, betas, eps, weight_decay)
            bounds[i] += 24 * U64 * (galore[i] - previous).abs() + 2 * U64 * galore[i].abs()
    return [p.detach() for p in fallback], galore, bounds, [p.grad for p in fallback]


def test_sumo_fallback_is_galores_adamw_at_eps_zero() -> None:
    """At eps 0 our fallback (torch.optim.AdamW) and GaLore's AdamW are one algorithm (moments, bias corrections,
    no weight decay): 8 steps agree to float64 rounding."""
    ours, galore, bounds, _ = _fallback_run(eps=0.0, steps=8)
    for mine, theirs, allowed in zip(ours, galore, bounds, strict=True):
        assert bool(((mine - theirs).abs() <= allowed).all())


def test_sumo_fallback_places_eps_as_torch_not_as_galores_code() -> None:
    """The documented deviation, at the default eps 1e-6. GaLore's code adds eps to the uncorrected sqrt(v) and folds
    sqrt(1 - beta2^t) into the step (adamw.py lines 120-126): in the corrected form that is eps / sqrt(1 - beta2^t),
    32 eps at step 1. torch.optim.AdamW adds eps to the corrected sqrt(v). After one step (m_hat = g, v_hat = g^2)
    ours - GaLore's = lr g (1 / (|g| + eps / sqrt(1 - beta2)) - 1 / (|g| + eps)) exactly; with |g| ~ 1e-4 that is
    up to ~30% of an update. Tolerance: the rounding of both sides as above, plus the formula's own (u per op)."""
    ours, galore, bounds, (grads) = _fallback_run(eps=1e-6, steps=1)
    for mine, theirs, allowed, g in zip(ours, galore, bounds, grads, strict=True):
        predicted = LR * g * (1 / (g.abs() + 1e-6 / (1 - 0.999) ** 0.5) - 1 / (g.abs() + 1e-6))
        slack = allowed + 8 * U64 * LR
        assert bool(((mine - theirs - predicted).abs() <= slack).all())
        assert float(predicted.abs().max()) > 0.1 * LR


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_sumo_fallback_hf_form_is_galores_adamw(weight_decay: float) -> None:
    """`adamw_form="hf"`: at GaLore's default eps 1e-6, where torch's placement differs by a large part of an update
    (the test above), and with a weight decay (decay of the updated weights), 8 steps of the fallback parameters
    agree with the transcription of galore_torch/adamw.py lines 111-146 to float64 rounding."""
    ours, galore, bounds, _ = _fallback_run(eps=1e-6, steps=8, form="hf", weight_decay=weight_decay)
    for mine, theirs, allowed in zip(ours, galore, bounds, strict=True):
        assert bool(((mine - theirs).abs() <= allowed).all())
