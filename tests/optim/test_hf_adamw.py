"""HFAdamW, the fallback of `adamw_form` "hf" / "hf-skip-first": resume, state bytes, the declared switch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from structbench import measure
from structbench.errors import UsageError
from structbench.optim import registry
from structbench.optim.cost_profile import count as count_cost
from structbench.optim.hf_adamw import HFAdamW


def _params(seed: int) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(shape, generator=gen)) for shape in ((7,), (3, 5))]


def _feed(optimizer: HFAdamW, params: list[nn.Parameter], grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        optimizer.step()


@pytest.mark.parametrize("skip_first_step", [False, True])
def test_resume_after_any_step_is_bit_identical(skip_first_step: bool) -> None:
    """A run saved after 1 step (the skipped one, where on) and after 3, reloaded into a fresh optimizer, continues
    exactly as the unbroken run: the skip happens once, the step counter and moments survive the state dict."""
    gen = torch.Generator().manual_seed(1)
    grads = [[torch.randn(p.shape, generator=gen) for p in _params(0)] for _ in range(6)]
    for cut in (1, 3):
        params = _params(0)
        optimizer = HFAdamW(params, lr=1e-2, weight_decay=0.1, skip_first_step=skip_first_step)
        _feed(optimizer, params, grads[:cut])
        saved = copy.deepcopy(optimizer.state_dict())
        resumed = [nn.Parameter(p.detach().clone()) for p in params]
        _feed(optimizer, params, grads[cut:])
        again = HFAdamW(resumed, lr=1e-2, weight_decay=0.1, skip_first_step=skip_first_step)
        again.load_state_dict(saved)
        _feed(again, resumed, grads[cut:])
        assert all(torch.equal(a, b) for a, b in zip(params, resumed, strict=True)), cut
        assert again.state[resumed[0]]["step"] == 6 - skip_first_step


def test_skipped_first_step_leaves_the_weights_and_counts_nothing() -> None:
    params = _params(2)
    before = [p.detach().clone() for p in params]
    optimizer = HFAdamW(params, lr=1e-2, weight_decay=0.5, skip_first_step=True)
    _feed(optimizer, params, [[torch.ones(p.shape) for p in params]])
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before, strict=True))
    assert all(optimizer.state[p]["step"] == 0 and not optimizer.state[p]["exp_avg"].any() for p in params)


@pytest.mark.parametrize(("name", "form"), [("sumo", "hf"), ("soap", "hf-skip-first"), ("sumo-ns5", "torch")])
def test_measured_state_bytes_equal_the_formula_for_each_form(name: str, form: str) -> None:
    """After 3 steps (two with moments where the first is skipped), the measured bytes equal the entry's formula."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 12), nn.LayerNorm(12), nn.Linear(12, 10), nn.Linear(10, 3))
    optimizer, routing = registry.build_with_routing(name, model, {"adamw_form": form})
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
    named = dict(model.named_parameters())
    hp = registry.resolve_hparams(name, {"adamw_form": form})
    shapes = [[tuple(named[n].shape) for n in names] for names in (routing.structured, routing.fallback)]
    fallback_numel = sum(named[n].numel() for n in routing.fallback)
    steps = 0 if form != "torch" else 4 * len(routing.fallback)
    fallback_bytes = measure.state_bytes(optimizer.parts["fallback"])
    assert fallback_bytes == 8 * fallback_numel + steps
    assert measure.state_bytes(optimizer) == registry.get(name).state_bytes(*shapes, hp)


def test_an_unknown_form_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="adamw_form"):
        registry.resolve_hparams("sumo", {"adamw_form": "adam"})


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_a_step_launches_as_many_kernels_for_thirty_vectors_as_for_three(weight_decay: float) -> None:
    """The parameters at one step count go through one foreach call per operation: a GPU launches the same few
    kernels however many vectors (LayerNorm weights, biases) a model has, as torch AdamW's foreach path does: the
    code's seven operations (two EMAs of two operations each, sqrt, + eps, addcdiv), one more for weight decay, and
    the two profiler records torch.optim.Optimizer.step wraps every step in (counted as operators)."""

    def launches(count: int) -> int:
        gen = torch.Generator().manual_seed(0)
        params = [nn.Parameter(torch.randn(5 + i, generator=gen)) for i in range(count)]
        optimizer = HFAdamW(params, weight_decay=weight_decay)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            if _ == 0:
                optimizer.step()
        return count_cost(optimizer.step, optimizer).launches

    assert launches(30) == launches(3) == 7 + (weight_decay > 0) + 2
