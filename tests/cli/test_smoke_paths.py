"""The smoke suite runs every optimizer's own path within its 40 steps, not only the first-order part around it.

With the registry's full-size intervals (Shampoo's root every 500 steps, projections refreshed every 200) and size
thresholds (4-bit storage from 4096 elements), a 40-step run of a structured optimizer is its fallback alone: 32-bit
and 4-bit Shampoo gave exactly SGD with weight decay 5e-4. Each test below fails when the suite's per-optimizer
settings stop running that path.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from structbench.execution import runner
from structbench.optim.hybrid import HybridOptimizer
from structbench.plan import spec

SUITES = ("smoke-quadratic", "smoke-mlp")
NEVER = 1000
"""An interval longer than the smoke budget (40 steps): the path it schedules never runs after the first step."""

SWITCHED_OFF = {
    "shampoo": {"root_interval": NEVER},
    "shampoo-4bit": {"root_interval": NEVER},
    "shampoo-4bit-naive": {"root_interval": NEVER},
    "soap": {"precondition_frequency": NEVER},
    "eigen-adam": {"precondition_frequency": NEVER},
    "galore": {"update_proj_gap": NEVER},
    "fira": {"update_proj_gap": NEVER},
    "apollo-svd": {"update_proj_gap": NEVER},
    "apollo-mini": {"update_proj_gap": NEVER},
    "alice": {"update_interval": NEVER},
    "alice-0": {"update_interval": NEVER},
    "sumo": {"update_freq": NEVER},
    "sumo-ns5": {"update_freq": NEVER},
}
"""Per structured optimizer with an interval, the setting that leaves its distinctive path (root, eigenbasis,
projection or subspace refresh) out of a smoke run."""


def smoke_run(suite: str, optim_name: str, tmp_path: Path, **hparams) -> dict:
    overrides = [f"hparams.{optim_name}.{key}={value}" for key, value in hparams.items()]
    [suite_spec], _ = spec.load_suites(suite, overrides, [optim_name])
    row = runner.execute(suite_spec, optim_name, 0, torch.device("cpu"), tmp_path).row
    assert row["status"] == "ok", row["error"]
    return row


def test_every_structured_optimizer_with_an_interval_is_listed() -> None:
    """The suites set an override for each optimizer named here, and every registered optimizer whose hyperparameters
    schedule a refresh is named here (a new one must say how the smoke suite reaches its path)."""
    from structbench import optim

    scheduled = {"root_interval", "precondition_frequency", "update_proj_gap", "update_interval", "update_freq"}
    with_interval = {name for name in optim.names() if scheduled & set(optim.get(name).defaults)}
    assert with_interval == set(SWITCHED_OFF)
    for suite in SUITES:
        [suite_spec], _ = spec.load_suites(suite, [], list(SWITCHED_OFF))
        for name, off in SWITCHED_OFF.items():
            [(key, _)] = off.items()
            assert suite_spec.hparams[name][key] <= 10, f"{suite}: {name}.{key} = {suite_spec.hparams[name][key]}"


@pytest.mark.parametrize("optim_name", sorted(SWITCHED_OFF))
def test_the_smoke_run_differs_from_the_run_without_the_optimizers_own_path(optim_name: str, tmp_path: Path) -> None:
    suite = "smoke-quadratic"
    with_path = smoke_run(suite, optim_name, tmp_path)
    without = smoke_run(suite, optim_name, tmp_path, **SWITCHED_OFF[optim_name])
    assert with_path["final_eval_loss"] != without["final_eval_loss"], (
        f"{optim_name}: the smoke run equals the run without its refreshes ({with_path['final_eval_loss']!r})"
    )


@pytest.mark.parametrize("optim_name", ["shampoo", "shampoo-4bit", "shampoo-4bit-naive"])
def test_shampoo_differs_from_its_grafted_sgd_alone(optim_name: str, tmp_path: Path) -> None:
    """Until its first root, Shampoo's step is its SGD graft (momentum 0.9, weight decay 5e-4) on the raw gradient:
    the smoke run must differ from that SGD run, and does not when the roots are switched off (which shows that the
    comparison is the right one)."""
    suite = "smoke-quadratic"
    sgd = smoke_run(suite, "sgd", tmp_path, lr=0.1, momentum=0.9, weight_decay=5e-4)
    shampoo = smoke_run(suite, optim_name, tmp_path)
    rootless = smoke_run(suite, optim_name, tmp_path, root_interval=NEVER)
    # Bit for bit: without a root every direction is G itself, whose graft scale ||G|| / (||G|| + 1e-12) is exactly
    # 1 in float32 (||G|| + 1e-12 rounds to ||G|| for ||G|| > 2^24 1e-12, every step here), and ShampooSGD's weight
    # decay, momentum (0 * mu + G~ on the first step) and W -= lr buf are torch.optim.SGD's operations in its order,
    # in the same process. With roots the final loss differs by 69-84% here: 1% tells the two apart.
    assert rootless["final_eval_loss"] == sgd["final_eval_loss"]
    assert not math.isclose(shampoo["final_eval_loss"], sgd["final_eval_loss"], rel_tol=1e-2)


def test_4bit_shampoo_quantization_changes_the_smoke_run(tmp_path: Path) -> None:
    suite = "smoke-quadratic"
    quantized = smoke_run(suite, "shampoo-4bit", tmp_path)
    full = smoke_run(suite, "shampoo-4bit", tmp_path, min_lowbit_numel=10**6)
    assert quantized["final_eval_loss"] != full["final_eval_loss"]
    assert quantized["state_bytes"] < full["state_bytes"]


def unpacked_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes stored two to a byte."""
    return torch.stack([codes & 0x0F, codes >> 4], dim=-1).flatten()


@pytest.mark.parametrize("suite", SUITES)
def test_4bit_shampoo_state_holds_packed_4bit_matrices_after_the_smoke_run(
    suite: str, tmp_path: Path, monkeypatch
) -> None:
    """Every preconditioner of at least `min_lowbit_numel` elements is stored as uint8 codes, two 4-bit codes a byte
    (order^2 / 2 bytes), and after the roots were computed its codes are no longer those of the identity or zero
    matrix it started as (whose codes take at most two values)."""
    built = []
    real_build = runner.build_with_routing

    def spy(*args, **kwargs):
        built.append(real_build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(runner, "build_with_routing", spy)
    row = smoke_run(suite, "shampoo-4bit", tmp_path)
    [_, (optimizer, _)] = built  # the warm-up's throw-away optimizer, then the run's (structbench.execution.warmup)
    assert isinstance(optimizer, HybridOptimizer)
    threshold = spec.load_suites(suite, [], ["shampoo-4bit"])[0][0].hparams["shampoo-4bit"]["min_lowbit_numel"]
    structured = optimizer.parts["structured"]
    packed = 0
    for param in structured.param_groups[0]["params"]:
        state = structured.state[param]
        rows, cols = param.reshape(param.shape[0], -1).shape
        for order in (rows, cols):
            codes = [v for k, v in state.items() if k.endswith(".codes") and v.numel() == (order * order + 1) // 2]
            if order * order < threshold:
                continue
            assert codes, f"no packed codes of {order}x{order} for {tuple(param.shape)}: {sorted(state)}"
            for stored in codes:
                assert stored.dtype == torch.uint8
                packed += 1
            assert max(len(torch.unique(unpacked_nibbles(c))) for c in codes) > 2
    assert packed > 0 and row["state_bytes"] > 0
