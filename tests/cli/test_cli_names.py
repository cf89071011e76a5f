"""Command-line names and paths: a missing --data-dir, repeated --optim/--seed values, did-you-mean everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.store import read_runs


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_a_missing_data_dir_is_an_error_and_nothing_is_created(cli, tmp_path):
    missing, out = tmp_path / "no-such-data", tmp_path / "results"
    line = one_error_line(cli("run", "--suite", "quadratic", "--steps", "2", "--data-dir", missing, "--out", out))
    assert f"--data-dir {missing} does not exist" in line and "--create-data-dir" in line
    assert not missing.exists() and not out.exists()
    assert "does not exist" in one_error_line(cli("data", "status", "--data-dir", missing))


def test_a_data_dir_that_is_a_file_is_an_error(cli, tmp_path):
    afile = tmp_path / "data.txt"
    afile.write_text("")
    line = one_error_line(cli("run", "--suite", "quadratic", "--data-dir", afile, "--dry-run"))
    assert line == f"error: --data-dir {afile} is not a directory."


def test_create_data_dir_makes_the_directory_and_the_run_goes_on(cli, tmp_path):
    wanted, out = tmp_path / "made" / "data", tmp_path / "results"
    args = ("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "2", "--quiet")
    result = cli(*args, "--data-dir", wanted, "--create-data-dir", "--out", out)
    assert result.exit_code == 0, result.output
    assert wanted.is_dir() and list(wanted.iterdir()) == []
    assert read_runs(out)["status"].tolist() == ["ok"]


def test_repeated_optimizers_and_seeds_run_once_with_a_note(cli, tmp_path):
    out = tmp_path / "results"
    result = cli(
        "run", "--suite", "quadratic", "--optim", "adamw", "--optim", "sgd", "--optim", "adamw",
        "--seed", "3", "--seed", "3", "--steps", "2", "--quiet", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "note: --optim adamw given more than once; each runs once." in result.stderr
    assert "note: --seed 3 given more than once; each runs once." in result.stderr
    runs = read_runs(out)
    assert sorted(zip(runs["optim"], runs["seed"], strict=True)) == [("adamw", 3), ("sgd", 3)]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store with one quadratic sgd run."""
    from typer.testing import CliRunner

    from structbench.cli.app import app

    out = tmp_path_factory.mktemp("names") / "results"
    args = ["run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "2", "--quiet"]
    assert CliRunner().invoke(app, [*args, "--out", str(out)]).exit_code == 0
    return out


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (("list", "suite"), "'suites'"),
        (("list", "optim"), "'optims'"),
        (("run", "--suite", "quadratik", "--dry-run"), "'quadratic'"),
        (("run", "--suite", "quadratic", "--optim", "adamww", "--dry-run"), "'adamw'"),
        (("run", "--suite", "quadratic", "--executor", "locl", "--dry-run"), "'local'"),
        (("check", "--optim", "shampo"), "'shampoo'"),
        (("list", "optims", "--optim", "fismoo"), "'fismo'"),
    ],
)
def test_an_unknown_name_suggests_the_closest_known_one(cli, tmp_path, args, suggestion):
    assert f"Did you mean {suggestion}?" in one_error_line(cli(*args))


@pytest.mark.parametrize(
    ("args", "suggestion"),
    [
        (("--suite", "quadratik"), "'quadratic'"),
        (("--optim", "sgdd"), "'sgd'"),
        (("--format", "hmtl"), "'html'"),
    ],
)
def test_an_unknown_report_filter_suggests_the_closest_stored_name(cli, store, args, suggestion):
    assert f"Did you mean {suggestion}?" in one_error_line(cli("report", "--out", store, *args))
