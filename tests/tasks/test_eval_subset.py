"""A CIFAR suite checked on a CPU (issue 35, item 3): `task_args.eval_examples` evaluates a fixed, seeded subset of
the test and validation splits; `--steps 3` evaluates before training and at the end only; progress says when a run
evaluates and on how many examples; the report says a subset was used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from structbench.data.holdout import evaluation_subset
from structbench.data.splits import ArraySplit
from structbench.execution import runner
from structbench.execution.loop import Progress
from structbench.plan import spec
from tests.support.datasets import write_cifar10
from tests.support.store import read_curves, read_runs

pytestmark = pytest.mark.filterwarnings("ignore::structbench.data.ChecksumWarning")

PER_BATCH = 64
"""Tiny CIFAR-10 files: 5 x 64 = 320 training images (32 held out for validation by val_fraction 0.1), 64 test."""
SUBSET = 24
NARROW = "task_args.model_options={width_div = 16}"
"""ResNet-18 with 1/16 of its channels: FISMO's factors stay at most 288 x 288, so a step takes a fraction of a
second on a CPU (the full width's 4608 x 4608 factors take minutes)."""


def tiny_split(count: int) -> ArraySplit:
    """`count` 1x1 images whose single pixel is their position, so a subset names the rows it kept."""
    return ArraySplit(torch.arange(count, dtype=torch.uint8).view(count, 1, 1, 1), torch.arange(count))


def test_an_evaluation_subset_is_a_fixed_ordered_sample_of_distinct_rows() -> None:
    split = tiny_split(200)
    first, again = evaluation_subset(split, 50, seed=0), evaluation_subset(split, 50, seed=0)
    kept = first.labels.tolist()
    assert len(kept) == 50 and len(set(kept)) == 50
    assert kept == sorted(kept) and set(kept) <= set(range(200))
    assert torch.equal(first.inputs.view(-1).long(), first.labels)
    assert torch.equal(again.labels, first.labels)
    assert not torch.equal(evaluation_subset(split, 50, seed=1).labels, first.labels)


@pytest.mark.parametrize("count", [0, 200, 500])
def test_no_subset_or_one_as_large_as_the_split_keeps_the_whole_split(count: int) -> None:
    split = tiny_split(200)
    assert evaluation_subset(split, count, seed=0) is split


def run_cifar(cli, tmp_path: Path, *extra: str):
    write_cifar10(tmp_path / "data", per_batch=PER_BATCH)
    return cli(
        "run", "--suite", "cifar10", "--optim", "fismo", "--steps", "3", "--data-dir", tmp_path / "data",
        "--out", tmp_path / "out", "--device", "cpu", "--set", "budget.batch_size=32", "--set", NARROW, *extra,
    )  # fmt: skip


def test_a_three_step_cifar_run_evaluates_the_subset_twice_and_the_report_says_so(cli, tmp_path: Path) -> None:
    result = run_cifar(cli, tmp_path, "--set", f"task_args.eval_examples={SUBSET}", "--quiet")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    assert "cifar10: --steps 3 is too short for 5 evaluations" in said and "evaluated 2 times" in said
    [run] = read_runs(tmp_path / "out").itertuples()
    stored = json.loads(run.spec)
    assert stored["budget"]["eval_every"] == 0
    assert stored["task_args"]["eval_examples"] == SUBSET
    resolved = stored["task_args_resolved"]
    assert (resolved["eval_test_size"], resolved["eval_val_size"]) == (SUBSET, SUBSET)
    assert (resolved["test_size"], resolved["val_size"]) == (PER_BATCH, 32)
    # Accuracy over 24 examples is a whole number of 24ths.
    assert abs(run.final_eval_metric * SUBSET - round(run.final_eval_metric * SUBSET)) < 1e-9
    curves = read_curves(tmp_path / "out")
    assert sorted(curves[curves.split == "eval"].step) == [0, 3]
    report = cli("report", "--out", tmp_path / "out")
    assert report.exit_code == 0, report.output
    shown = " ".join(report.stdout.split())
    assert "evaluation subset (task_args.eval_examples): fismo (24 test and 24 validation examples)" in shown


def test_a_negative_evaluation_subset_is_a_usage_error(cli, tmp_path: Path) -> None:
    result = run_cifar(cli, tmp_path, "--set", "task_args.eval_examples=-1", "--quiet")
    assert result.exit_code == 2
    assert "task_args.eval_examples must be >= 0" in result.stderr
    assert not (tmp_path / "out" / "runs").exists() or not any((tmp_path / "out" / "runs").iterdir())


def test_progress_announces_each_evaluation_with_its_size(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "data", per_batch=PER_BATCH)
    overrides = [f"task_args.eval_examples={SUBSET}", NARROW, "budget.batch_size=32"]
    [suite], _ = spec.load_suites("cifar10", overrides, ["fismo"], [0], steps=9)
    events: list[Progress] = []
    outcome = runner.execute(suite, "fismo", 0, torch.device("cpu"), tmp_path / "data", on_progress=events.append)
    assert outcome.row["status"] == "ok"
    evaluated = [e.step for e in events if e.evaluating is not None]
    stored = sorted(c["step"] for c in outcome.curves if c["split"] == "eval")
    assert evaluated == stored and evaluated[0] == 0 and evaluated[-1] == 9 and len(evaluated) >= 3
    assert {e.evaluating for e in events if e.evaluating is not None} == {2 * SUBSET}


@pytest.mark.parametrize(
    ("examples", "shown"), [(10_000, "cifar10 fismo evaluating 10,000 examples"), (0, "cifar10 fismo evaluating")]
)
def test_the_progress_label_names_the_evaluation_and_its_size(examples: int, shown: str) -> None:
    from structbench.cli.run import evaluating_label

    assert evaluating_label("cifar10 fismo", examples) == shown
