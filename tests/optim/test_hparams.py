"""Each optimizer's hyperparameters are declared once (`structbench.optim.hparams`), and everything follows from that
declaration: the constructor's keywords and checks, the registry's defaults and usage errors, `structbench list
optims`, the routing switches and the sweep spaces."""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import pytest
import torch
from torch import nn

from structbench import optim
from structbench.errors import UsageError
from structbench.optim import registry
from structbench.optim.base import StructuredOptimizer
from structbench.optim.hparams import Hyperparameter, Interval
from structbench.optim.hybrid import ADAMW_FALLBACK, HybridOptimizer
from structbench.plan import sweep

NAMES = optim.names()
ROUTING = {"head_to_fallback", "one_d", "embeddings", "precondition_head_embeddings"}
"""The hyperparameters that only route parameters between the structured method and its fallback."""
FIELDS = [(name, field) for name in NAMES for field in optim.get(name).hparams]


def structured_part(name: str) -> torch.optim.Optimizer:
    """The optimizer the registry builds for `name`'s structured parameters (the whole optimizer for a baseline)."""
    optimizer, _ = registry.build_with_routing(name, registry.probe_model(), {})
    return optimizer.parts["structured"] if isinstance(optimizer, HybridOptimizer) else optimizer


def own_names(name: str) -> tuple[str, ...]:
    """The hyperparameters `name`'s optimizer class takes itself (the rest belong to the fallback or the routing)."""
    part = structured_part(name)
    if isinstance(part, StructuredOptimizer):
        return type(part).hparams.names()
    return optim.get(name).hparams.names()


def listed_names(output: str, name: str) -> list[str]:
    """The first column of the `<name>: hyperparameters` table of `structbench list optims` output."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if f"{name}: hyperparameters" in line)
    body = next(i for i in range(start, len(lines)) if lines[i].startswith("┡"))
    rows = []
    for line in lines[body + 1 :]:
        if not line.startswith("│"):
            break
        first = line.split("│")[1].strip()
        if first:
            rows.append(first)
    return rows


@pytest.mark.parametrize("name", NAMES)
def test_constructor_registry_and_listing_take_the_same_hyperparameters(name: str, cli: Any) -> None:
    entry = optim.get(name)
    declared = entry.hparams.names()
    assert tuple(entry.defaults) == declared
    listing = cli("list", "optims", "--optim", name)
    assert listing.exit_code == 0, listing.output
    assert listed_names(listing.stdout, name) == list(declared)

    part = structured_part(name)
    own = own_names(name)
    if isinstance(part, StructuredOptimizer):
        # the constructor stored every keyword it declares, with the entry's values, in every group
        assert all({k: group[k] for k in own} == {k: entry.defaults[k] for k in own} for group in part.param_groups)
        # it takes each of them by name, and no other keyword
        cls = type(part)
        cls([nn.Parameter(torch.zeros(4, 4))], **{k: entry.defaults[k] for k in own})
        with pytest.raises(TypeError, match="unexpected hyperparameter"):
            cls([nn.Parameter(torch.zeros(4, 4))], not_a_hyperparameter=1)
    else:  # torch.optim.SGD and AdamW: the registry's names are torch's keywords (AdamW's betas split in two)
        torch_names = {"betas" if k in ("beta1", "beta2") else k for k in own}
        assert torch_names <= set(inspect.signature(type(part)).parameters)
    fallback = set(ADAMW_FALLBACK.names()) if "adamw_lr" in entry.lr_keys else set()
    rest = set(declared) - set(own)
    assert rest - fallback - {"adamw_form"} <= ROUTING and fallback <= rest  # the fallback's arithmetic: hybrid.py


def test_list_optims_shows_each_hyperparameters_default_range_and_source(cli: Any) -> None:
    listing = cli("list", "optims", "--optim", "muon")
    assert listing.exit_code == 0
    out = listing.stdout
    for column in ("name", "default", "range", "tuning", "source"):
        assert column in out
    lr_row = next(line for line in out.splitlines() if line.startswith("│ lr "))
    assert "0.02" in lr_row and "real in (0, inf)" in lr_row and "log(0.002, 0.2, 5)" in lr_row
    assert "code: KellerJordan/Muon muon.py" in lr_row
    polar_row = next(line for line in out.splitlines() if line.startswith("│ polar "))
    assert "ns | svd" in polar_row
    assert "Moonlight" in out  # the entry's notes
    assert "soap: hyperparameters" not in out
    everything = cli("list", "optims")
    assert all(f"{name}: hyperparameters" in everything.stdout for name in NAMES)
    assert cli("list", "suites", "--optim", "muon").exit_code == 2


@pytest.mark.parametrize(("name", "field"), FIELDS, ids=[f"{n}-{f.name}" for n, f in FIELDS])
def test_every_default_is_valid_and_every_tuning_range_lies_inside_the_valid_one(
    name: str, field: Hyperparameter
) -> None:
    assert type(field.default) is field.kind
    assert field.problem(field.default) is None
    assert field.source.kind in ("paper", "code", "structbench") and field.source.where.strip()
    if field.tune is None:
        return
    assert field.kind in (int, float)
    low, high = field.tune.bounds(field.default)
    assert field.tune.scale in ("log", "lin") and field.tune.points >= 2
    assert low < high and (field.tune.scale == "lin" or low > 0)
    assert field.problem(low) is None and field.problem(high) is None
    assert low <= field.default <= high


def out_of_range(field: Hyperparameter) -> Any:
    """A value the declaration of `field` rules out: just past a bound, an unknown choice, or the wrong type."""
    if field.kind is bool:
        return 1
    if isinstance(field.valid, tuple):
        return "not-a-choice" if field.kind is str else max(field.valid) + 1
    if field.valid is None or (math.isinf(field.valid.low) and math.isinf(field.valid.high)):
        return 2**63 if field.kind is int else math.nan
    valid = field.valid
    if math.isfinite(valid.low):
        value = valid.low - 1 if valid.low_closed else valid.low
    else:
        value = valid.high + 1 if valid.high_closed else valid.high
    return field.kind(value)


@pytest.mark.parametrize(("name", "field"), FIELDS, ids=[f"{n}-{f.name}" for n, f in FIELDS])
def test_the_shared_validator_refuses_a_value_outside_every_declared_range(name: str, field: Hyperparameter) -> None:
    bad = out_of_range(field)
    assert field.problem(bad) is not None
    with pytest.raises(UsageError, match=rf"optimizer '{name}' rejects {field.name}="):
        registry.resolve_hparams(name, {field.name: bad})
    part = structured_part(name)
    if isinstance(part, StructuredOptimizer) and field.name in type(part).hparams:
        with pytest.raises(ValueError, match=field.name):
            type(part)([nn.Parameter(torch.zeros(4, 4))], **{field.name: bad})


@pytest.mark.parametrize("name", NAMES)
def test_every_step_size_is_declared_positive_and_tunable(name: str) -> None:
    entry = optim.get(name)
    for key in entry.lr_keys:
        assert entry.hparams[key].valid == Interval.parse("(0, inf)")
        assert entry.hparams[key].tune is not None


@pytest.mark.parametrize("name", [n for n in NAMES if "adamw_lr" in optim.get(n).lr_keys])
def test_the_adamw_fallback_is_declared_once_for_every_hybrid(name: str) -> None:
    """Hybrids differ only in the fallback's defaults and their sources, never in its ranges or tuning."""
    entry = optim.get(name)
    for shared in ADAMW_FALLBACK:
        mine = entry.hparams[shared.name]
        assert dataclasses.replace(mine, default=shared.default, source=shared.source) == shared


def routing_model() -> nn.Module:
    """An embedding table, a hidden matrix, a norm's 1-D parameters and a head: what every routing switch moves."""
    return nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 10))


@pytest.mark.parametrize("name", [n for n in NAMES if ROUTING & set(optim.get(n).hparams.names())])
def test_every_routing_switch_routes(name: str) -> None:
    entry = optim.get(name)
    model = routing_model()
    named = list(model.named_parameters())
    by_default = entry.route(model, named, entry.defaults)
    for key in ROUTING & set(entry.hparams.names()):
        field = entry.hparams[key]
        others = [not field.default] if field.kind is bool else [v for v in field.valid if v != field.default]
        for value in others:
            assert entry.route(model, named, {**entry.defaults, key: value}) != by_default, (key, value)


@pytest.mark.parametrize("name", NAMES)
def test_declared_sweeps_tune_the_step_size_and_every_point_is_valid(name: str) -> None:
    entry = optim.get(name)
    swept = sweep.declared_sweep(name, entry.hparams)
    assert f"hparams.{name}.lr" in [one.key for one in swept]
    for one in swept:
        key = one.key.rsplit(".", 1)[1]
        for value in one.grid():
            optim.validate(name, {key: value})
