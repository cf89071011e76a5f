"""The vision suites through the real CLI, and the learning-rate schedules they use.

- digits and a short Fashion-MNIST run train on the real data end to end and must end far above chance;
- each CIFAR suite runs two steps on tiny files in the real CIFAR python-pickle format (`--data-dir`), which proves
  the suite resolves, its model builds on the dataset's shapes and its first optimizer steps;
- suite values that come from a paper are checked against the paper's text; schedules against hand-computed values
  and PyTorch's own schedulers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from structbench.errors import UsageError
from structbench.plan import spec, suite_file
from structbench.plan.schedule import lr_factor, make_scheduler
from tests.support.datasets import write_cifar10, write_cifar100
from tests.support.store import read_curves, read_runs

pytestmark = pytest.mark.filterwarnings("ignore::structbench.data.ChecksumWarning")

VISION_SUITES = {
    "digits": ("digits", "mlp"),
    "fashion-mnist": ("fashion-mnist", "mlp"),
    "cifar10": ("cifar10", "resnet18"),
    "cifar100": ("cifar100", "resnet34"),
    "cifar10-dla": ("cifar10", "simple-dla"),
    "cifar100-vit": ("cifar100", "vit-small"),
    "cifar10-speed": ("cifar10", "speed-net"),
}
TINY = ("--set", "budget.epochs=0", "--set", "budget.steps=2", "--set", "budget.batch_size=4", "--quiet")
U = 2.0**-53  # float64 unit roundoff
# A schedule value (in [0, 1.2]) is at most 8 correctly rounded float64 operations (a sum, a product, a quotient, a
# cos or pow within 1 ulp) on operands <= 1.2, so it is within 8 u * 1.2 < 10 u of the exact value, on our side and
# on the hand-computed (or np.interp) side alike. A wrong knot, slope or milestone is off by >= 1e-3.
SCHEDULE_TOLERANCE = 2 * 10 * U


def gamma_u(n: int) -> float:
    """gamma_n = n u / (1 - n u) (float64): the relative error bound of n correctly rounded operations in a row."""
    return n * U / (1 - n * U)


def schedule(**fields: object) -> dict[str, object]:
    return {**spec.SCHEDULE_DEFAULTS, **fields}


# ---------------------------------------------------------------- suite files


@pytest.mark.parametrize("name", sorted(VISION_SUITES))
def test_every_vision_suite_resolves_with_its_dataset_and_model(name: str) -> None:
    (suite,), _ = spec.load_suites(name)
    dataset, model = VISION_SUITES[name]
    assert suite.task == "image-classification"
    assert (suite.task_args["dataset"], suite.task_args["model"]) == (dataset, model)
    assert suite.budget["epochs"] > 0 and suite.target["metric"] == "accuracy"
    _, _, raw = suite_file.read_suite_file(name)
    assert set(raw.get("hparams", {})) <= set(raw["optims"]), "hyperparameters for an optimizer the suite omits"


def test_cifar100_suite_is_the_4bit_shampoo_cnn_setup() -> None:
    # Wang et al. 2024, App. G: batch 128, wd 5e-4, SGD-M lr 0.1 momentum 0.9, x0.1 every 30% of the epochs after a
    # 5-epoch linear warm-up, 200 epochs for SGD-M + Shampoo, T1 = 100, T2 = 500, eps 1e-6, beta 0.95.
    (suite,), _ = spec.load_suites("cifar100")
    assert suite.budget["batch_size"] == 128 and suite.budget["epochs"] == 200
    assert suite.schedule["kind"] == "step" and suite.schedule["milestones"] == [0.3, 0.6, 0.9]
    assert suite.schedule["gamma"] == 0.1
    assert suite.schedule["warmup_steps"] == 5 * math.ceil(50_000 / 128)
    assert {k: suite.hparams["sgd"][k] for k in ("lr", "momentum", "weight_decay")} == {
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 5e-4,
    }
    for name in ("shampoo", "shampoo-4bit", "shampoo-4bit-naive"):
        hp = suite.hparams[name]
        assert (hp["base"], hp["lr"], hp["sgd_momentum"], hp["sgd_weight_decay"]) == ("sgd", 0.1, 0.9, 5e-4)
        assert (hp["stat_interval"], hp["root_interval"], hp["matrix_eps"], hp["stat_decay"]) == (100, 500, 1e-6, 0.95)


def test_cifar100_vit_suite_is_the_4bit_shampoo_transformer_setup() -> None:
    # App. G: ViT-Small patch 4, batch 128, cosine, AdamW lr 1e-3 (0.9, 0.999, 1e-8) wd 0.05, 100 epochs with
    # Shampoo, no AMP for transformers on CIFAR-100.
    (suite,), _ = spec.load_suites("cifar100-vit")
    assert suite.budget["batch_size"] == 128 and suite.budget["epochs"] == 100
    assert suite.schedule["kind"] == "cosine" and suite.task_args["autocast"] == "off"
    adamw = suite.hparams["adamw"]
    assert (adamw["lr"], adamw["beta1"], adamw["beta2"], adamw["eps"], adamw["weight_decay"]) == (
        1e-3,
        0.9,
        0.999,
        1e-8,
        0.05,
    )
    for name in ("shampoo", "shampoo-4bit", "shampoo-4bit-naive"):
        hp = suite.hparams[name]
        assert (hp["base"], hp["lr"], hp["adamw_weight_decay"]) == ("adamw", 1e-3, 0.05)
        assert (hp["stat_interval"], hp["root_interval"]) == (100, 500)


def test_cifar10_speed_suite_converts_airbench94_hyperparameters() -> None:
    # airbench94: lr 11.5 and wd 0.0153 per 1024 examples on a summed loss, Nesterov momentum 0.85, batch 1024.
    # On a mean loss the step is lr_sum * 1024 = 11.5 / (1 + 1/(1 - 0.85)); the decay per step is wd * 1024 /
    # (1024 (1 + 1/0.15)), which torch's coupled weight decay gives as lr * weight_decay.
    (suite,), _ = spec.load_suites("cifar10-speed")
    sgd = suite.hparams["sgd"]
    scale = 1 + 1 / (1 - 0.85)
    # 4 roundings, and 0.85's representation error (u relative) amplified by 0.85 / 0.15 in 1 - 0.85.
    assert sgd["lr"] == pytest.approx(11.5 / scale, rel=(4 + 0.85 / 0.15) * U)
    # The suite writes weight_decay = 0.0153 / 11.5 to 5 significant digits (1.3304e-3): half a unit of the last,
    # 0.5e-7 / 1.3304e-3 = 3.8e-5 relative, plus float64 rounding. Leaving out the 1/lr is off by 10x.
    rounding = 0.5e-7 / sgd["weight_decay"]
    assert sgd["lr"] * sgd["weight_decay"] == pytest.approx(0.0153 / scale, rel=rounding + 16 * U)
    assert (sgd["momentum"], sgd["nesterov"], suite.budget["batch_size"]) == (0.85, True, 1024)
    assert suite.target["value"] == 0.94 and suite.task_args["label_smoothing"] == 0.2


# ---------------------------------------------------------------- real data through the CLI


def test_digits_through_the_cli_ends_far_above_chance(cli, tmp_path: Path) -> None:
    result = cli("run", "--suite", "digits", "--optim", "sgd", "--seed", "0", "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    (run,) = read_runs(tmp_path).itertuples()
    # 10 balanced classes: chance is 0.1. An MLP on digits reaches about 0.97; a broken pipeline (labels detached
    # from images, bad normalisation, no learning) stays near 0.1. 0.9 is 9x chance with room for seed noise.
    assert run.status == "ok" and run.final_eval_metric >= 0.9
    resolved = json.loads(run.spec)["task_args_resolved"]
    assert (resolved["autocast"], resolved["channels_last"]) == ("off", "off")
    curves = read_curves(tmp_path)
    evals = curves.query("split == 'eval'")
    per_epoch = resolved["steps_per_epoch"]
    assert sorted(evals.step) == [epoch * per_epoch for epoch in range(16)] and run.steps == 15 * per_epoch
    # 10% of the training split is held out for validation, evaluated at the same steps as the test split.
    train, val = resolved["train_size"], resolved["val_size"]
    assert val == round(0.1 * (train + val)) and sorted(curves.query("split == 'val'").step) == sorted(evals.step)
    assert run.final_val_metric >= 0.9


@pytest.mark.system_part("fashion-mnist")
def test_short_fashion_mnist_run_through_the_cli_ends_far_above_chance(cli, tmp_path: Path) -> None:
    steps = ("--set", "budget.epochs=0", "--set", "budget.steps=150", "--set", "budget.log_every=50")
    result = cli(
        "run", "--suite", "fashion-mnist", "--optim", "sgd", "--seed", "0", *steps, "--out", tmp_path, "--quiet"
    )
    assert result.exit_code == 0, result.output
    (run,) = read_runs(tmp_path).itertuples()
    # 10 balanced classes: chance is 0.1. 150 steps (a third of an epoch) of the MLP reach about 0.8; a linear
    # classifier at convergence gets about 0.84 (Xiao et al. 2017). 0.7 is 7x chance yet unreachable for a pipeline
    # that scrambles labels or inputs.
    assert run.status == "ok" and run.steps == 150 and run.final_eval_metric >= 0.7
    assert run.initial_eval_metric < 0.3


# ---------------------------------------------------------------- CIFAR suites on tiny real-format files


@pytest.mark.parametrize(
    ("name", "writer", "params"),
    [
        # Published parameter counts: kuangliu ResNet-18, 10 classes; ResNet-34 with a 100-way head
        # (21,282,122 for 10 classes + 90 x 513); SimpleDLA about 15.1M (kuangliu/pytorch-cifar); ViT-S about 21.3M.
        ("cifar10", write_cifar10, (11_173_962, 11_173_962)),
        ("cifar100", write_cifar100, (21_328_292, 21_328_292)),
        ("cifar10-dla", write_cifar10, (15.0e6, 15.2e6)),
        ("cifar100-vit", write_cifar100, (21.0e6, 21.7e6)),
        ("cifar10-speed", write_cifar10, (1.0e6, 3.0e6)),
    ],
)
def test_cifar_suite_runs_on_tiny_cifar_files(
    cli, tmp_path: Path, name: str, writer, params: tuple[float, float]
) -> None:
    writer(tmp_path / "data")
    first = spec.load_suites(name)[0][0].optims[0]
    result = cli(
        "run",
        "--suite",
        name,
        "--optim",
        first,
        "--seed",
        "0",
        "--data-dir",
        tmp_path / "data",
        "--out",
        tmp_path / "out",
        *TINY,
        "--set",
        "budget.eval_every=0",
        "--set",
        "budget.log_every=1",
    )
    assert result.exit_code == 0, result.output
    (run,) = read_runs(tmp_path / "out").itertuples()
    assert run.status == "ok" and run.steps == 2, run.error
    assert params[0] <= run.param_count <= params[1]
    assert 0.0 <= run.final_eval_metric <= 1.0 and math.isfinite(run.final_eval_loss)
    assert str(tmp_path / "data") in run.data_source


def test_missing_cifar_data_exits_2_naming_the_expected_path(cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("run", "--suite", "cifar10", "--data-dir", empty, "--out", tmp_path / "out", "--quiet")
    assert result.exit_code == 2
    assert str(empty / "cifar-10-batches-py") in result.stderr
    assert not (tmp_path / "out" / "runs").exists()


# ---------------------------------------------------------------- schedules


def test_onecycle_is_airbench_triangle_by_hand() -> None:
    # Knots (0, 0.2), (25, 1), (100, 0): warm-up 25 steps = 0.25 of 100.
    sched = schedule(kind="onecycle", warmup_fraction=0.25, start_lr_ratio=0.2, min_lr_ratio=0.0)
    expected = {0: 0.2, 10: 0.2 + 0.8 * 10 / 25, 25: 1.0, 50: 1.0 - 25 / 75, 99: 1.0 - 74 / 75, 100: 0.0}
    for step, value in expected.items():
        assert lr_factor(step, 100, sched) == pytest.approx(value, rel=0, abs=SCHEDULE_TOLERANCE), step
    floor = schedule(kind="onecycle", warmup_steps=23, start_lr_ratio=0.2, min_lr_ratio=0.07)
    steps = np.arange(101)
    reference = np.interp(steps, [0, 23, 100], [0.2, 1.0, 0.07])
    ours = [lr_factor(int(s), 100, floor) for s in steps]
    assert np.allclose(ours, reference, rtol=0, atol=SCHEDULE_TOLERANCE)


def test_step_schedule_by_hand_after_warmup() -> None:
    sched = schedule(kind="step", warmup_steps=5, milestones=[0.3, 0.6, 0.9], gamma=0.1)
    expected = {0: 0.2, 1: 0.4, 4: 1.0, 5: 1.0, 29: 1.0, 30: 0.1, 59: 0.1, 60: 0.01, 89: 0.01, 90: 0.001, 99: 0.001}
    for step, value in expected.items():
        # gamma ** k (pow within 1 ulp: 2 u; 0.1's representation error k <= 3 times) against the literal 10^-k
        # (rounded once): 6 u.
        assert lr_factor(step, 100, sched) == pytest.approx(value, rel=gamma_u(6)), step


def test_step_schedule_matches_torch_multisteplr() -> None:
    ours = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    theirs = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    mine = make_scheduler(ours, 200, schedule(kind="step", milestones=[0.25, 0.5, 0.75], gamma=0.2))
    reference = torch.optim.lr_scheduler.MultiStepLR(theirs, milestones=[50, 100, 150], gamma=0.2)
    for _ in range(200):
        # MultiStepLR multiplies by gamma at each of <= 3 milestones (3 u), LambdaLR takes 0.5 * gamma ** k (pow
        # within 1 ulp: 2 u; halving is exact); 0.2's representation error is the same k-fold factor on both sides.
        assert ours.param_groups[0]["lr"] == pytest.approx(theirs.param_groups[0]["lr"], rel=gamma_u(5))
        ours.step()
        theirs.step()
        mine.step()
        reference.step()


def test_warmup_fraction_sets_the_warmup_length_for_every_kind() -> None:
    # 10% of 200 steps = 20 warm-up steps: (t + 1) / 20, then cosine from 1 at t = 20 to 0 at t = 200.
    cosine = schedule(kind="cosine", warmup_fraction=0.1)
    # Exact in float64: 1 / 20 and 20 / 20 are correctly rounded quotients; cos(0) = 1; cos(fl(pi) / 2) = 6e-17
    # vanishes in 1 + cos; cos(fl(pi)) = -1 + 2e-33 rounds to -1 (any libm within 1 ulp).
    assert lr_factor(0, 200, cosine) == 1 / 20
    assert lr_factor(19, 200, cosine) == 1.0
    assert lr_factor(20, 200, cosine) == 1.0
    assert lr_factor(110, 200, cosine) == 0.5
    assert lr_factor(200, 200, cosine) == 0.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('schedule.kind="exponential"', "unknown schedule.kind"),
        ("schedule.milestones=[0.6, 0.3]", "milestones must be increasing"),
        ("schedule.milestones=[1.5]", "milestones must be increasing"),
        ("schedule.warmup_fraction=1.0", "warmup_fraction must be in"),
        ("schedule.gamma=0", "gamma > 0"),
    ],
)
def test_bad_schedules_are_usage_errors(override: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        spec.load_suites("digits", [override])


def test_warmup_steps_and_fraction_together_are_rejected() -> None:
    with pytest.raises(UsageError, match="not both"):
        spec.load_suites("cifar100", ["schedule.warmup_fraction=0.1"])
