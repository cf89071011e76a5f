"""Issue 35, item 5: a row says its hyperparameters are the suite's only when the suite tunes the optimizer (its
`[hparams.<optim>]` table sets `lr`, or its `tuned` list names it); an optimizer a suite only lists runs at the
registry's defaults and says so: "untuned here (registry defaults)"."""

from __future__ import annotations

from pathlib import Path

import pytest

from structbench.store import write as store
from tests.support.report_store import Point, write_run
from tests.support.store import read_runs

SUITE = """\
task = "quadratic"
optims = ["adamw", "muon", "soap"]
seeds = [0]
{tuned}
[task_args]
m = 8
n = 4

[budget]
steps = 4
eval_every = 2

[hparams.adamw]
lr = 0.05

[hparams.soap]
precondition_frequency = 2
"""
SUITES = "suite's"
UNTUNED = "untuned here (registry defaults)"


def hyperparameter_words(report: str, optim: str) -> str:
    """What the terminal report's row of `optim` says in the hyperparameters column (one of the known phrasings)."""
    rows = [line for line in report.splitlines() if line.startswith(f"│ {optim} ")]
    [words] = {words for line in rows for words in (SUITES, "untuned here") if words in line}
    return words


@pytest.mark.parametrize(("tuned", "muon"), [("", "untuned here"), ('tuned = ["muon"]', SUITES)])
def test_an_optimizer_the_suite_only_lists_is_untuned_here(cli, tmp_path, monkeypatch, tuned, muon):
    monkeypatch.setenv("COLUMNS", "400")
    path = tmp_path / "listed.toml"
    path.write_text(SUITE.format(tuned=tuned))
    out = tmp_path / "results"
    result = cli("run", "--suite", path, "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    assert set(read_runs(out)["status"]) == {"ok"}
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    assert hyperparameter_words(report.stdout, "adamw") == SUITES
    assert hyperparameter_words(report.stdout, "muon") == muon
    # soap's table sets only precondition_frequency: its learning rate is the registry's
    assert hyperparameter_words(report.stdout, "soap") == "untuned here"


def test_a_store_that_said_suites_for_a_listed_optimizer_is_read_as_untuned(cli, tmp_path: Path, monkeypatch):
    """Runs stored by the old rule (cifar10's muon and fismo marked "suite" though the suite sets neither's lr)."""
    monkeypatch.setenv("COLUMNS", "400")
    out = tmp_path / "results"
    store.prepare(out)
    points = [Point(0, 0.0, 2.0, 0.1, 2.0, 0.1), Point(10, 1.0, 1.0, 0.5, 1.0, 0.5)]
    for optim in ("sgd", "muon", "fismo"):
        write_run(out, f"{optim}-0", optim, 0, points, suite="cifar10", hparams_source="suite")
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    assert hyperparameter_words(report.stdout, "sgd") == SUITES
    assert hyperparameter_words(report.stdout, "muon") == "untuned here"
    assert hyperparameter_words(report.stdout, "fismo") == "untuned here"
