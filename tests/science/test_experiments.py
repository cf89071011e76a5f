"""Experiment suites: run through the CLI, stored as a run row plus a result table, claims printed."""

from __future__ import annotations

import json

import pandas as pd

from structbench.experiments import EXPERIMENTS, Claim, ExperimentDef, ExperimentResult
from tests.support.store import read_runs


def squares(args, seed, device):
    n = args["n"]
    table = pd.DataFrame({"k": list(range(n)), "square": [float(k * k) for k in range(n)]})
    claim = Claim("arithmetic", "the last square is (n-1)^2", table.square.iloc[-1] == (n - 1) ** 2, f"n={n}")
    return ExperimentResult(table=table, claims=[claim])


def test_experiment_suite_stores_a_row_and_a_table(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(EXPERIMENTS, "squares", ExperimentDef("squares", "k^2 for k < n", {"n": 3}, squares))
    suite = tmp_path / "squares.toml"
    suite.write_text('experiment = "squares"\nseeds = [0]\n[task_args]\nn = 4\n')
    result = cli("run", "--suite", suite, "--set", "task_args.n=5", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "holds" in result.stdout and "the last square is (n-1)^2" in result.stdout
    assert "[arithmetic]" in result.stdout  # a bracketed source is text, not rich markup
    run = read_runs(tmp_path / "out").iloc[0]
    assert (run.task, run.optim, run.status) == ("experiment:squares", "-", "ok")
    assert json.loads(run.spec)["task_args"] == {"n": 5}
    assert json.loads(run.claims)[0]["holds"] is True
    table = pd.read_parquet(tmp_path / "out" / "tables")
    assert table.square.tolist() == [0.0, 1.0, 4.0, 9.0, 16.0]
    assert set(table.run_id) == {run.run_id}


def test_a_failing_experiment_is_recorded_as_error(cli, tmp_path, monkeypatch):
    def broken(args, seed, device):
        raise ValueError("no convergence")

    monkeypatch.setitem(EXPERIMENTS, "broken", ExperimentDef("broken", "fails", {}, broken))
    suite = tmp_path / "broken.toml"
    suite.write_text('experiment = "broken"\n')
    result = cli("run", "--suite", suite, "--out", tmp_path / "out")
    assert result.exit_code == 1
    run = read_runs(tmp_path / "out").iloc[0]
    assert run.status == "error" and "no convergence" in run.error
