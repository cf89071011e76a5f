"""`run --steps N` keeps at least five evaluations: eval_every and log_every shortened in proportion, stored in the
spec, said in the output; hand-derived from each suite file's budget."""

from __future__ import annotations

import json

import pytest

from structbench.plan import spec
from tests.support.store import read_curves, read_runs


def test_shakespeare_llama_at_30_steps_is_evaluated_every_5(cli, tmp_path):
    # The suite: 300 steps, eval_every 50 (6 intervals), log_every 10. 30 steps would evaluate at 0 and 30 only;
    # 6 intervals in 30 steps is every 5 (7 evaluations), and log_every 10 x 30 / 300 = 1.
    result = cli(
        "run", "--suite", "shakespeare-llama", "--optim", "adamw", "--steps", "30", "--dry-run", "--out", tmp_path
    )
    assert result.exit_code == 0, result.output
    assert (
        "shakespeare-llama: --steps 30 shortens eval_every 50 -> 5 and log_every 10 -> 1, so each run is evaluated "
        "7 times instead of 2." in " ".join(result.stdout.split())
    )


@pytest.mark.parametrize(
    ("suite", "steps", "eval_every", "log_every"),
    [
        # quadratic: 300 steps, eval_every 25 (12 intervals), log_every 5; at 30 steps floor(30 / 12) = 2, 5 x 0.1 -> 1.
        ("quadratic", 30, 2, 1),
        # At 200 steps quadratic keeps 1 + 200 / 25 = 9 evaluations: nothing changes.
        ("quadratic", 200, 25, 5),
        # digits: 15 epochs evaluated at each epoch's end; 15 intervals in 30 steps: every 2, log_every capped at 2.
        ("digits", 30, 2, 2),
        # Fewer than 4 intervals in the suite still give 4: fashion-mnist's 3 epochs -> floor(30 / 4) = 7.
        ("fashion-mnist", 30, 7, 7),
        # smoke-quadratic evaluates at the start and the end only (eval_every 0): left as it is.
        ("smoke-quadratic", 30, 0, 5),
    ],
)
def test_shortened_values_follow_the_suite_budget(suite, steps, eval_every, log_every):
    [shortened], _ = spec.load_suites(suite, steps=steps)
    assert (shortened.budget["eval_every"], shortened.budget["log_every"]) == (eval_every, log_every)


def test_a_field_set_on_the_command_line_is_not_shortened():
    [kept], _ = spec.load_suites("quadratic", ["budget.eval_every=15"], steps=30)
    assert kept.budget["eval_every"] == 15 and kept.budget["log_every"] == 5 and kept.budget_note == ""


def test_a_real_30_step_run_stores_the_shortened_budget_and_seven_evaluations(cli, tmp_path):
    out = tmp_path / "results"
    (tmp_path / "data").mkdir()
    result = cli(
        "run", "--suite", "shakespeare-llama", "--optim", "adamw", "--steps", "30", "--out", out,
        "--data-dir", tmp_path / "data", "--set", "task_args.eval_tokens=256", "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [run] = read_runs(out).itertuples()
    budget = json.loads(run.spec)["budget"]
    assert (budget["steps"], budget["eval_every"], budget["log_every"]) == (30, 5, 1)
    curves = read_curves(out)
    for split in ("val", "eval"):
        assert sorted(curves[curves.split == split].step) == [0, 5, 10, 15, 20, 25, 30]
    assert len(curves[curves.split == "train"]) == 30


def test_three_steps_of_a_per_epoch_suite_are_evaluated_at_the_start_and_end_only():
    # cifar10: 200 epochs evaluated at each epoch's end. 3 steps cannot hold 4 intervals of 2 steps: eval_every stays
    # 0 (the old rule made it 1: 4 evaluations of the whole test split in a 3-step smoke check).
    [kept], _ = spec.load_suites("cifar10", steps=3)
    assert kept.budget["eval_every"] == 0
    assert spec.evaluations(3, kept.budget["eval_every"]) == 2
    assert "--steps 3 is too short for 5 evaluations at least 2 steps apart" in kept.budget_note
    assert "evaluated 2 times" in kept.budget_note


def test_a_smoke_check_runs_without_warm_up_unless_the_command_line_or_the_suite_sets_it(tmp_path):
    # A smoke check has no steady state for a warm-up to separate from the first steps: its 2 default warm-up steps
    # would take 2 of the run's 5 optimizer steps (FISMO's first steps on ResNet-18 cost minutes on a CPU).
    assert spec.BUDGET_DEFAULTS["warmup_steps"] == 2
    [smoke], _ = spec.load_suites("cifar10", steps=3)
    assert smoke.budget["warmup_steps"] == 0
    assert "its 2 warm-up steps are dropped" in smoke.budget_note
    [asked], _ = spec.load_suites("cifar10", ["budget.warmup_steps=2"], steps=3)
    assert asked.budget["warmup_steps"] == 2 and "warm-up" not in asked.budget_note
    [longer], _ = spec.load_suites("cifar10", steps=40)
    assert longer.budget["warmup_steps"] == 2
    own = tmp_path / "own.toml"
    own.write_text(
        'task = "quadratic"\noptims = ["sgd"]\n[budget]\nsteps = 100\neval_every = 10\nwarmup_steps = 1\n'
    )
    [declared], _ = spec.load_suites(str(own), steps=3)
    assert declared.budget["warmup_steps"] == 1 and "too short" in declared.budget_note


def test_the_report_says_which_runs_were_timed_without_warm_up(cli, tmp_path):
    smoke = ("run", "--suite", "quadratic", "--optim", "adamw", "--seed", "0", "--steps", "3", "--quiet")
    first = cli(*smoke, "--out", tmp_path / "smoke")
    assert first.exit_code == 0, first.output
    assert "its 2 warm-up steps are dropped" in " ".join(first.output.split())
    report = cli("report", "--out", tmp_path / "smoke")
    assert "without warm-up (budget.warmup_steps 0): adamw" in " ".join(report.stdout.split())
    kept = cli(*smoke, "--set", "budget.warmup_steps=1", "--out", tmp_path / "kept")
    assert kept.exit_code == 0, kept.output
    [run] = read_runs(tmp_path / "kept").itertuples()
    assert json.loads(run.spec)["budget"]["warmup_steps"] == 1 and run.warmup_s > 0
    assert "without warm-up" not in " ".join(cli("report", "--out", tmp_path / "kept").stdout.split())


def test_forty_steps_of_a_long_suite_are_evaluated_every_other_step_at_most():
    # cifar10's 200 intervals in 40 steps: floor(40 / 200) = 0, raised to the 2-step minimum: 1 + 40 / 2 = 21
    # evaluations (the old rule: every step, 41).
    [shortened], _ = spec.load_suites("cifar10", steps=40)
    assert shortened.budget["eval_every"] == 2
    assert "evaluated 21 times instead of 2" in shortened.budget_note
