"""Issue 35's smaller usage items, from the user's side: a missing suite file, `data status` on a missing data root,
negative seeds, an optimizer name in the wrong case, and a suite file whose eval_every exceeds its steps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.cli import usage_error
from tests.support.store import read_runs


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "results"


def write_suite(directory: Path, name: str, budget: str) -> Path:
    path = directory / name
    path.write_text(f'task = "quadratic"\noptims = ["sgd"]\nseeds = [0]\n[budget]\n{budget}\n')
    return path


# ---- a missing suite file --------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["mysuite.toml", "./x/s.toml", "x/s.toml"])
def test_a_missing_suite_file_is_named_as_a_missing_file_not_an_unknown_suite(cli, out, tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    line = usage_error(cli("run", "--suite", given, "--dry-run", "--out", out), out)
    assert line.startswith(f"error: no such suite file: {given} "), line
    assert "unknown suite" not in line
    assert "Known:" not in line


def test_a_directory_given_as_the_suite_file_is_named_as_one(cli, out, tmp_path):
    line = usage_error(cli("run", "--suite", tmp_path, "--dry-run", "--out", out), out)
    assert line == f"error: suite file {tmp_path} is a directory; give the path of a .toml file in it."


def test_a_bare_name_that_is_no_suite_keeps_the_did_you_mean(cli, out):
    line = usage_error(cli("run", "--suite", "quadratc", "--dry-run", "--out", out), out)
    assert line.startswith("error: unknown suite 'quadratc'. Did you mean 'quadratic'? Known: ")


# ---- data status on a missing data root ------------------------------------------------------------------------


def test_data_status_on_a_missing_data_dir_names_a_command_that_creates_it(cli, tmp_path):
    missing = tmp_path / "no-data"
    line = usage_error(cli("data", "status", "--data-dir", missing), missing)
    assert "--create-data-dir" not in line
    suggested = line.rpartition(": ")[2]
    assert suggested == f"structbench data fetch NAME --data-dir {missing}"
    fetch_help = cli("data", "fetch", "--help").stdout
    assert "--data-dir" in fetch_help
    assert not missing.exists()


def test_data_status_does_not_take_the_create_option_the_old_message_named(cli, tmp_path):
    result = cli("data", "status", "--data-dir", tmp_path / "no-data", "--create-data-dir")
    assert result.exit_code == 2
    assert not (tmp_path / "no-data").exists()


# ---- negative seeds ----------------------------------------------------------------------------------------------


def test_a_negative_seed_runs_and_is_stored_as_given(cli, tmp_path):
    result = cli(
        "run", "--suite", "quadratic", "--optim", "sgd", "--steps", "2", "--quiet",
        "--seed", "-1", "--seed=-2", "--seed", "1", "--out", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = read_runs(tmp_path)
    assert sorted(runs.seed.tolist()) == [-2, -1, 1]
    assert set(runs.status) == {"ok"}
    assert runs.run_key.nunique() == 3


# ---- an optimizer name in the wrong case -------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "meant"), [("FISMO", "fismo"), ("AdamW", "adamw"), ("Shampoo-4Bit", "shampoo-4bit")])
def test_an_optimizer_name_in_the_wrong_case_suggests_the_registered_one(cli, out, given, meant):
    line = usage_error(cli("run", "--suite", "quadratic", "--optim", given, "--dry-run", "--out", out), out)
    assert re.match(rf"error: unknown optimizer '{given}'\. Did you mean '{meant}'\? Known: ", line), line


# ---- eval_every beyond steps in a suite file ---------------------------------------------------------------------


def test_a_suite_file_whose_eval_every_exceeds_its_steps_is_a_usage_error_naming_both(cli, out, tmp_path):
    suite = write_suite(tmp_path, "late-eval.toml", "steps = 10\neval_every = 50")
    line = usage_error(cli("run", "--suite", suite, "--dry-run", "--out", out), out)
    assert f"suite late-eval ({suite})" in line
    assert "budget.eval_every 50 exceeds budget.steps 10" in line


@pytest.mark.parametrize(
    "budget", ["steps = 10\neval_every = 10", "steps = 10\neval_every = 0", "epochs = 1.0\neval_every = 500"]
)
def test_a_suite_file_evaluating_within_its_budget_is_accepted(cli, out, tmp_path, budget):
    suite = write_suite(tmp_path, "fits.toml", budget)
    result = cli("run", "--suite", suite, "--dry-run", "--out", out)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args", [("--steps", "4"), ("--set", "budget.steps=5"), ("--set", "budget.eval_every=5")]
)
def test_the_command_line_setting_steps_or_eval_every_takes_precedence_over_the_check(cli, out, tmp_path, args):
    suite = write_suite(tmp_path, "late-eval.toml", "steps = 10\neval_every = 50")
    result = cli("run", "--suite", suite, *args, "--dry-run", "--out", out)
    assert result.exit_code == 0, result.output
