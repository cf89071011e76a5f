"""The cost profile counts what a step costs on a GPU (structbench/optim/cost_profile.py), checked against counts
derived by hand; and every registered optimizer's step keeps within the budgets that make it fast on a GPU: no host
read and no decomposition in the steady state, and at most 3x Muon's kernel launches per matrix amortised over its
refresh interval. The optimizers known to be over a budget are named with what is over; the test fails when one of
them comes within it (so that the exception goes) as when any other optimizer goes over."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from structbench import optim
from structbench.optim import cost_profile
from structbench.optim.cost_profile import count

WIDTH = 96
SHAPES = [(WIDTH, WIDTH), (WIDTH, WIDTH), (4 * WIDTH, WIDTH), (WIDTH, 4 * WIDTH)]
"""One GPT-2-small layer (attention in/out, MLP up/down) at an eighth of its width, for the counting tests."""
GPT2_SMALL = [(64, 64), (64, 64), (256, 64), (64, 256)] * 12
"""GPT-2-small's 48 weight matrices (12 layers) at a twelfth of their widths, for the budgets: launches per matrix
grow with the number of matrices where an optimizer loops over them and stay flat where it stacks them, so the
budget is taken at the model's own count; every optimizer's structured path runs, its size thresholds included
(4-bit Shampoo quantizes blocks of 4096 elements and more)."""
LAUNCHES_OVER_MUON = 3.0


def test_a_matmul_is_one_launch_of_2mkn_flops_in_its_dtype_and_one_new_tensor():
    a, b = torch.ones(3, 5), torch.ones(5, 7)
    cost = count(lambda: a @ b)
    assert cost.launches == 1 and dict(cost.flops) == {"float32": 2 * 3 * 5 * 7}
    assert cost.bytes_allocated == 3 * 7 * 4
    stacked = torch.ones(4, 3, 5, dtype=torch.bfloat16), torch.ones(4, 5, 2, dtype=torch.bfloat16)
    assert dict(count(lambda: torch.bmm(*stacked)).flops) == {"bfloat16": 2 * 4 * 3 * 5 * 2}
    into = torch.zeros(3, 7)
    assert dict(count(lambda: into.addmm_(a, b)).flops) == {"float32": 2 * 3 * 5 * 7}  # in place: counted too
    batched_into = torch.zeros(4, 3, 2, dtype=torch.bfloat16)
    assert dict(count(lambda: batched_into.baddbmm_(*stacked)).flops) == {"bfloat16": 2 * 4 * 3 * 5 * 2}


def test_views_launch_nothing_and_in_place_updates_allocate_nothing():
    x, y = torch.ones(4, 6), torch.ones(6, 4)
    assert count(lambda: (x.t(), x.view(6, 4), x[1:], x.unsqueeze(0))).launches == 0
    cost = count(lambda: x.add_(y.t()))
    assert cost.launches == 1 and cost.bytes_allocated == 0


def test_each_way_of_reading_a_value_on_the_host_is_counted_once():
    x = torch.arange(6.0)

    def reads() -> None:
        x.sum().item()
        x.tolist()
        bool(x[0] > 0)
        float(x.max())
        x[x > 2]  # a boolean mask: the result's size depends on the values

    cost = count(reads)
    assert dict(cost.host_reads) == {"item": 1, "tolist": 1, "bool": 1, "float": 1, "index": 1}
    assert cost.counter_reads == 0


def test_a_decomposition_is_counted_with_its_input_shape():
    a = torch.eye(4).expand(3, 4, 4).contiguous()
    cost = count(lambda: torch.linalg.eigh(a))
    ((name, number),) = cost.decompositions.items()
    assert number == 1 and "eigh" in name and name.endswith("(3, 4, 4)")


def test_reads_of_the_step_counter_torch_keeps_on_the_cpu_are_counted_apart():
    weight = torch.nn.Parameter(torch.ones(3))
    weight.grad = torch.ones(3)
    adam = torch.optim.Adam([weight], foreach=False)
    adam.step()
    cost = count(adam.step, adam)
    assert cost.reads == 0 and cost.counter_reads >= 1  # torch reads `step` (a CPU tensor) for the bias correction


def test_the_amortised_cost_spreads_each_refresh_over_the_default_interval():
    """SOAP refreshes its bases every `precondition_frequency` steps (default 10): the window holds whole refresh
    cycles of the shortened interval, and per step over the default interval the decompositions are the refresh's
    divided by 10."""
    profile = cost_profile.profile("soap", SHAPES)
    assert profile.interval == optim.get("soap").defaults["precondition_frequency"] == 10
    decompositions = [sum(cost.decompositions.values()) for cost in profile.window]
    assert sum(1 for d in decompositions if d) == cost_profile.WINDOW_CYCLES
    per_refresh = max(decompositions)
    assert profile.amortised(lambda cost: sum(cost.decompositions.values())) == pytest.approx(per_refresh / 10)
    assert sum(profile.steady.decompositions.values()) == 0


KNOWN_OVER: dict[str, dict[str, str]] = {}
"""The optimizers whose GPU-fast form is still to come, and what each is over: the budget's named exceptions."""


@pytest.fixture(scope="module")
def profiles() -> dict[str, Any]:
    return {name: cost_profile.profile(name, GPT2_SMALL) for name in optim.names()}


def over_budget(name: str, profiles: dict[str, Any]) -> dict[str, str]:
    profile = profiles[name]
    muon = profiles["muon"].amortised(lambda cost: cost.launches)
    launches = profile.amortised(lambda cost: cost.launches)
    over = {}
    if profile.steady.reads:
        over["host reads"] = f"{dict(profile.steady.host_reads)} per steady step"
    if profile.steady.decompositions:
        over["decompositions"] = f"{dict(profile.steady.decompositions)} per steady step"
    if launches > LAUNCHES_OVER_MUON * muon:
        over["launches"] = f"{launches:.0f} launches per step, Muon's {muon:.0f}"
    return over


@pytest.mark.parametrize("name", optim.names())
def test_every_optimizer_keeps_within_the_gpu_budgets_or_is_named_with_what_is_over(name, profiles):
    over = over_budget(name, profiles)
    assert set(over) == set(KNOWN_OVER.get(name, {})), over
