"""Each optimizer class's signature (`inspect.signature`, `help`) shows the keywords its constructor takes: the
parameters, then every hyperparameter its `hparams` Declaration states, with the declared type and default.

What each test checks against: the class's Declaration (`structbench.optim.hparams`), read field by field, for the
class the registry builds for each registered optimizer's structured parameters."""

from __future__ import annotations

import inspect
import pydoc

import pytest
import torch
from torch import nn

from structbench import optim
from structbench.optim.base import StructuredOptimizer
from structbench.optim.hybrid import HybridOptimizer


def structured_class(name: str) -> type[torch.optim.Optimizer]:
    """The class of the optimizer the registry builds for `name`'s structured parameters (the whole optimizer for a
    baseline)."""
    optimizer, _ = optim.build_with_routing(name, optim.registry.probe_model(), {})
    part = optimizer.parts["structured"] if isinstance(optimizer, HybridOptimizer) else optimizer
    return type(part)


CLASSES = {cls.__name__: cls for cls in map(structured_class, optim.names()) if issubclass(cls, StructuredOptimizer)}


def test_every_structured_optimizer_is_covered() -> None:
    assert len(CLASSES) == 16 and {"Muon", "Shampoo", "Fismo", "ASGO", "DASGO", "Sumo"} <= set(CLASSES)


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_the_signature_lists_the_declared_keywords_with_their_defaults(cls: type[StructuredOptimizer]) -> None:
    declared = [(field.name, field.default, field.kind) for field in cls.hparams]
    parameters = list(inspect.signature(cls).parameters.values())
    keywords = parameters[len(parameters) - len(declared) :]
    assert [(p.name, p.default, p.annotation) for p in keywords] == declared
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords)
    own = parameters[: len(parameters) - len(declared)]
    assert own[0].name == "params" and own[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    # any other argument is one the constructor names itself (Shampoo's `precondition`), never a `**` catch-all
    named_by_init = set(inspect.signature(cls.__init__).parameters) - {"self", "hparams"}
    assert {p.name for p in own} <= named_by_init | {"params"}
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@pytest.mark.parametrize("cls", CLASSES.values(), ids=CLASSES.keys())
def test_the_constructor_takes_what_the_signature_binds(cls: type[StructuredOptimizer]) -> None:
    params = [nn.Parameter(torch.zeros(4, 4))]
    bound = inspect.signature(cls).bind(params, **{field.name: field.default for field in cls.hparams})
    bound.apply_defaults()
    optimizer = cls(*bound.args, **bound.kwargs)
    assert {field.name: optimizer.param_groups[0][field.name] for field in cls.hparams} == cls.hparams.defaults()


def test_help_shows_the_declared_keywords() -> None:
    shown = " ".join(pydoc.render_doc(CLASSES["Muon"], renderer=pydoc.plaintext).split())
    assert "Muon(params: " in shown and "*, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True" in shown
