"""The conformance kit, run for every registered optimizer (later optimizers are checked automatically)."""

from __future__ import annotations

import pytest

from structbench import optim
from structbench.optim import conformance


@pytest.mark.parametrize("check", conformance.CHECKS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", optim.names())
def test_conformance(name: str, check: conformance.Check) -> None:
    check.run(name)


def test_the_kit_catches_a_resume_that_is_not_bit_identical(monkeypatch):
    """A kit that cannot fail proves nothing: break SGD's resume and the round-trip check must fail."""
    import torch

    original = torch.optim.SGD.load_state_dict

    def lossy(self, state_dict):
        original(self, state_dict)
        for state in self.state.values():
            state["momentum_buffer"].mul_(0.5)

    monkeypatch.setattr(torch.optim.SGD, "load_state_dict", lossy)
    with pytest.raises(conformance.CheckFailed, match="not bit-identical"):
        conformance.check_roundtrip_float32("sgd")


def test_the_kit_catches_a_wrong_state_formula(monkeypatch):
    import dataclasses

    from structbench.optim import registry

    wrong = dataclasses.replace(optim.get("adamw"), state_bytes=lambda s, f, hp: 0)
    monkeypatch.setitem(registry._REGISTRY, "adamw", wrong)
    results = {r.check: r for r in conformance.run_checks("adamw")}
    assert not results["state-bytes"].passed and "analytic 0 B" in results["state-bytes"].message
