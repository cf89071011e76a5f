"""Sweeps: value syntax, grid expansion, run keys and the cache, the three executors, time limits, bad input."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from structbench import optim
from structbench.errors import UsageError
from structbench.plan import grid, spec, suite_file, sweep
from tests.support.slurm_cluster import quiet_submitit_sacct, require_slurm
from tests.support.store import assert_indexes_the_store, read_curves, read_runs

# 2 optimizers x 3 learning rates x 2 seeds on the quadratic suite, short enough for CI.
GRID = (
    "--suite", "quadratic", "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--seed", "1",
    "--set", "hparams.*.lr=[0.02,0.05,0.1]", "--steps", "40", "--quiet",
)  # fmt: skip


def test_log_and_lin_ranges_give_the_hand_computed_values():
    assert sweep.parse_swept("k", "log(1e-4,1e-1,7)").grid() == [
        1e-4, 3.16228e-4, 1e-3, 3.16228e-3, 1e-2, 3.16228e-2, 1e-1,
    ]  # fmt: skip
    assert sweep.parse_swept("k", "lin(0,1,5)").grid() == [0.0, 0.25, 0.5, 0.75, 1.0]
    steps = sweep.parse_swept("k", "lin(100,400,4)").grid()
    assert steps == [100, 200, 300, 400] and all(isinstance(v, int) for v in steps)
    assert sweep.parse_swept("k", "lin(0.1,0.3,3)").grid() == [0.1, 0.2, 0.3]
    assert sweep.parse_swept("k", "log(2,2,1)").grid() == [2.0]
    assert sweep.parse_swept("k", [1, 2]).grid() == [1, 2]
    assert sweep.parse_swept("k", 0.5) is None and sweep.parse_swept("k", "adamw") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("log(0,1,3)", "start and stop > 0"),
        ("log(-1,1,3)", "start and stop > 0"),
        ("lin(1,2)", "three numbers"),
        ("lin(1,2,0)", "count must be between"),
        ("lin(a,2,3)", "must be numbers"),
        ("lin(1,inf,3)", "finite"),
    ],
)
def test_malformed_ranges_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        sweep.parse_swept("hparams.adamw.lr", text)


def test_radical_inverse_and_halton_search():
    # Van der Corput: 1, 2, 3 in base 2 -> 0.1b, 0.01b, 0.11b; in base 3 -> 1/3, 2/3, 1/9.
    assert [sweep.radical_inverse(i, 2) for i in (1, 2, 3)] == [0.5, 0.25, 0.75]
    # Base 2 is exact (powers of two). Base 3, at most two digits: the scale 3^-k after k <= 2 divisions, digit *
    # scale, the sum of two terms and the literal k / 3^m each round once: within 5 u (float64) of each other; a
    # digit in the wrong place (1/3 for 3) is off by 2.
    expected = [1 / 3, 2 / 3, 1 / 9]
    assert [sweep.radical_inverse(i, 3) for i in (1, 2, 3)] == pytest.approx(
        expected, rel=5 * 2.0**-53 / (1 - 5 * 2.0**-53)
    )
    fields = [sweep.parse_swept("a", "log(1e-4,1e-1,2)"), sweep.parse_swept("b", [0.8, 0.9, 0.95])]
    first = sweep.Search(16, 3).points(fields)
    assert first == sweep.Search(16, 3).points(fields)
    assert first != sweep.Search(16, 4).points(fields)
    assert len(first) == 16
    assert all(1e-4 <= p["a"] <= 1e-1 and p["b"] in (0.8, 0.9, 0.95) for p in first)
    # A low-discrepancy sequence covers each categorical value, and both decades halves of the log range.
    assert {p["b"] for p in first} == {0.8, 0.9, 0.95}
    assert min(p["a"] for p in first) < 1e-3 < 1e-2 < max(p["a"] for p in first)
    with pytest.raises(UsageError, match="halton:N"):
        sweep.parse_search("sobol:4")


def _cells(overrides, optims=("sgd", "adamw"), seeds=(0, 1), **kwargs):
    suites, _ = spec.load_suites("quadratic", overrides, list(optims), list(seeds), **kwargs)
    return grid.build_grid(suites, "cpu")


def test_wildcard_sweep_is_per_optimizer_and_crossed_with_seeds():
    cells = _cells(["hparams.*.lr=[0.02,0.05,0.1]"])
    assert len(cells) == 12 and len({c.key for c in cells}) == 12
    lrs = {(c.optim, c.suite.hparams[c.optim]["lr"]) for c in cells}
    assert lrs == {(o, lr) for o in ("sgd", "adamw") for lr in (0.02, 0.05, 0.1)}
    assert {c.setting for c in cells} == {"lr=0.02", "lr=0.05", "lr=0.1"}


def test_several_swept_keys_form_their_product_and_global_keys_multiply():
    cells = _cells(["hparams.adamw.lr=[0.01,0.1]", "hparams.adamw.beta2=[0.9,0.99,0.999]"], optims=["adamw"])
    assert len(cells) == 2 * 3 * 2
    cells = _cells(["hparams.adamw.lr=[0.01,0.1]", "budget.steps=[10,20]"], seeds=[0])
    # sgd: one setting per budget (2); adamw: 2 lrs per budget (4).
    assert sorted((c.optim, c.suite.budget["steps"]) for c in cells) == sorted(
        [("sgd", 10), ("sgd", 20)] + [("adamw", s) for s in (10, 10, 20, 20)]
    )


def test_suite_sweep_tables_expand_with_sweep_and_the_command_line_wins(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(
        'task = "quadratic"\noptims = ["sgd", "adamw"]\n[budget]\nsteps = 5\n'
        '[sweep.sgd]\nlr = "log(0.01,1,3)"\nmomentum = [0.0, 0.9]\n[sweep.adamw]\nlr = [0.001]\n'
    )
    suites, _ = spec.load_suites(str(path), sweep=True)
    cells = grid.build_grid(suites, "cpu")
    assert sorted((c.optim, c.suite.hparams[c.optim]["lr"]) for c in cells if c.optim == "sgd") == sorted(
        ("sgd", lr) for lr in (0.01, 0.1, 1.0) for _ in (0.0, 0.9)
    )
    suites, _ = spec.load_suites(str(path), ["hparams.sgd.lr=[0.5]"], sweep=True)
    assert {s.hparams["sgd"]["lr"] for s in suites if "sgd" in s.optims} == {0.5}
    without, _ = spec.load_suites(str(path))
    assert len(grid.build_grid(without, "cpu")) == 2


def test_an_optimizer_without_a_suite_table_sweeps_its_declared_tuning_ranges(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text('task = "quadratic"\noptims = ["sgd", "adamw"]\n[budget]\nsteps = 5\n[sweep.sgd]\nlr = [0.3]\n')
    declared = optim.get("adamw").hparams
    tuned = [field for field in declared if field.tune is not None]
    assert [field.name for field in tuned] == ["lr", "beta1"]
    grids = {field.name: sweep.declared_sweep("adamw", declared)[i].grid() for i, field in enumerate(tuned)}
    assert grids == {"lr": [1e-4, 3.16228e-4, 1e-3, 3.16228e-3, 1e-2], "beta1": [0.85, 0.9, 0.95]}

    suites, _ = spec.load_suites(str(path), sweep=True)
    settings = [(s.hparams["adamw"]["lr"], s.hparams["adamw"]["beta1"]) for s in suites if s.optims == ["adamw"]]
    assert sorted(settings) == sorted((lr, b) for lr in grids["lr"] for b in grids["beta1"])
    # the suite's table replaces sgd's declared ranges: its momentum stays at the default
    assert [(s.hparams["sgd"]["lr"], s.hparams["sgd"]["momentum"]) for s in suites if s.optims == ["sgd"]] == [
        (0.3, 0.9)
    ]

    searched, _ = spec.load_suites(str(path), search=sweep.Search(8, 0))
    points = [s.hparams["adamw"] for s in searched if s.optims == ["adamw"]]
    assert len(points) == 8 and len({p["lr"] for p in points}) == 8
    assert all(1e-4 <= p["lr"] <= 1e-2 and 0.85 <= p["beta1"] <= 0.95 for p in points)
    assert min(p["lr"] for p in points) < 1e-3 < max(p["lr"] for p in points)
    assert all(p["weight_decay"] == declared["weight_decay"].default for p in points)  # no tuning range: kept


def test_run_key_depends_on_what_determines_the_result_only(tmp_path):
    (base,) = _cells([], optims=["adamw"], seeds=[0])
    assert base.key == _cells([], optims=["adamw"], seeds=[0])[0].key
    assert base.key != _cells(["hparams.adamw.lr=0.002"], optims=["adamw"], seeds=[0])[0].key
    assert base.key != _cells([], optims=["adamw"], seeds=[1])[0].key
    assert base.key != _cells(["budget.steps=301"], optims=["adamw"], seeds=[0])[0].key
    suites, _ = spec.load_suites("quadratic", [], ["adamw"], [0])
    assert grid.build_grid(suites, "cuda")[0].key != base.key
    # The same suite read from a copy of its file elsewhere is the same run.
    copy = tmp_path / "quadratic.toml"
    copy.write_text(suite_file.read_suite_file("quadratic")[1].read_text())
    suites, _ = spec.load_suites(str(copy), [], ["adamw"], [0])
    assert grid.build_grid(suites, "cpu")[0].key == base.key


def _final_losses(out: Path) -> pd.Series:
    runs = read_runs(out)
    assert runs.run_key.is_unique
    return runs.set_index("run_key").sort_index()[["final_train_loss", "final_eval_loss"]]


def test_inline_and_local_executors_store_the_same_keys_bit_identically(cli, tmp_path):
    inline, local = tmp_path / "inline", tmp_path / "local"
    assert cli("run", *GRID, "--out", inline).exit_code == 0
    assert cli("run", *GRID, "--out", local, "--executor", "local", "--jobs", "2").exit_code == 0
    a, b = _final_losses(inline), _final_losses(local)
    assert len(a) == 12
    # Exact: the same code on the same machine (the same kernels), in another process; the quadratic's tensors
    # (32 x 16) are below torch's parallel grain size, so a worker's thread count changes no operation's order.
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    runs = read_runs(local)
    assert set(runs.executor) == {"local"} and set(runs.parallel_runs) == {2}
    assert set(read_runs(inline).executor) == {"inline"}
    assert_indexes_the_store(local)


def test_slurm_executor_stores_the_same_keys_bit_identically(cli, tmp_path):
    require_slurm()
    quiet_submitit_sacct()
    inline, slurm = tmp_path / "inline", tmp_path / "slurm"
    assert cli("run", *GRID, "--out", inline).exit_code == 0
    result = cli("run", *GRID, "--out", slurm, "--executor", "slurm", "--wait", "--slurm-time", "5")
    assert result.exit_code == 0, result.stderr
    # As for local: the test cluster (.ci/slurm.sh) runs its one node on this machine.
    pd.testing.assert_frame_equal(_final_losses(inline), _final_losses(slurm), check_exact=True)
    assert set(read_runs(slurm).executor) == {"slurm"}
    assert_indexes_the_store(slurm)
    assert list((slurm / ".submitit").iterdir()), "job logs under the store's .submitit/"
    status = cli("status", "--out", slurm)
    assert status.exit_code == 0
    assert "quadratic" in status.stdout and "│    6 │" in status.stdout


def test_repeating_a_grid_runs_nothing_and_rerun_replaces(cli, tmp_path):
    result = cli("run", *GRID, "--out", tmp_path)
    assert result.exit_code == 0
    assert "setting" in result.stdout and all(f"lr={lr}" in result.stdout for lr in ("0.02", "0.05", "0.1"))
    first = read_runs(tmp_path)
    again = cli("run", *GRID, "--out", tmp_path)
    assert again.exit_code == 0 and "12 already stored, 0 to run" in again.stdout.replace("\n", " ")
    assert len(read_runs(tmp_path)) == 12
    dry = cli("run", *GRID, "--out", tmp_path, "--dry-run")
    assert dry.stdout.count("stored") >= 12 and "12 cached, 0 to run" in dry.stdout
    assert cli("run", *GRID, "--out", tmp_path, "--rerun").exit_code == 0
    second = read_runs(tmp_path)
    assert len(second) == 12 and second.run_key.is_unique
    assert not set(first.run_id) & set(second.run_id)
    assert len(read_curves(tmp_path).run_id.unique()) == 12


def test_dry_run_writes_nothing(cli, tmp_path):
    out = tmp_path / "store"
    result = cli("run", *GRID, "--out", out, "--dry-run")
    assert result.exit_code == 0 and "12 cached" not in result.stdout and "0 cached, 12 to run" in result.stdout
    assert not out.exists()


def test_a_run_past_its_time_limit_is_stored_as_timeout_and_the_grid_goes_on(cli, tmp_path):
    result = cli(
        "run", "--suite", "quadratic", "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--quiet",
        "--steps", "100000", "--set", "budget.max_time_s=0.3", "--out", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0
    runs = read_runs(tmp_path).set_index("optim")
    assert runs.status.tolist() == ["timeout", "timeout"]
    assert (runs.steps > 0).all() and (runs.steps < 100_000).all()
    assert (runs.wall_s + runs.eval_s >= 0.3).all() and (runs.wall_s < 5).all()
    curves = read_curves(tmp_path)
    for run_id, steps in zip(runs.run_id, runs.steps, strict=True):
        train = curves[(curves.run_id == run_id) & (curves.split == "train")]
        assert train.step.max() == steps, "the step that crossed the limit is logged"
    again = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--quiet",
                "--steps", "100000", "--set", "budget.max_time_s=0.3", "--out", tmp_path)  # fmt: skip
    assert "1 already stored, 0 to run" in again.stdout.replace("\n", " "), "timeout is a final status"


def test_kill_9_mid_grid_then_the_same_command_runs_only_the_missing_runs(tmp_path):
    command = [
        sys.executable, "-m", "structbench", "run", "--suite", "quadratic", "--optim", "sgd", "--optim", "adamw",
        "--seed", "0", "--seed", "1", "--set", "hparams.*.lr=[0.02,0.05,0.1]", "--steps", "1500", "--quiet",
        "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    runs_dir = tmp_path / "runs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = [p for p in runs_dir.glob("*.parquet")] if runs_dir.is_dir() else []
        if len(done) >= 3:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    stored_before = len(read_runs(tmp_path))
    assert 3 <= stored_before < 12, "killed mid-grid"
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    expected = f"{stored_before} already stored, {12 - stored_before} to run"
    assert expected in " ".join(second.stdout.split())
    runs = read_runs(tmp_path)
    assert len(runs) == 12 and runs.run_key.is_unique and set(runs.status) == {"ok"}


def _stderr_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "hparams.adamw.lr=[0.1,"], "must be of type float"),
        (["--set", "hparams.adamw.lr=[]"], "empty list"),
        (["--set", "hparams.adamw.lrr=[0.1,0.2]"], "unknown key"),
        (["--set", "hparams.adamw.lr=log(0,1,3)"], "start and stop > 0"),
        (["--set", "hparams.*.nesterovv=[true,false]"], "no optimizer of this grid"),
        (["--jobs", "0", "--executor", "local"], "--jobs must be >= 1"),
        (["--jobs", "2"], "--jobs sets the worker count"),
        (["--slurm-partition", "gpu"], "need(s) --executor slurm"),
        (["--executor", "kubernetes"], "--executor takes"),
        (["--search", "halton:0"], "halton:N"),
        (["--executor", "slurm", "--slurm-time", "ten"], "--slurm-time takes"),
    ],
)
def test_bad_sweep_and_executor_input_is_one_line_exit_2_and_writes_nothing(cli, tmp_path, extra, message):
    out = tmp_path / "store"
    result = cli("run", "--suite", "quadratic", "--optim", "adamw", "--out", out, *extra)
    assert result.exit_code == 2
    assert message in _stderr_line(result)
    assert not out.exists()


def test_slurm_without_sbatch_is_a_usage_error(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "store"
    result = cli("run", "--suite", "quadratic", "--optim", "adamw", "--out", out, "--executor", "slurm")
    assert result.exit_code == 2 and "needs Slurm's sbatch" in _stderr_line(result)
    assert not out.exists()


@pytest.mark.parametrize(
    ("time", "minutes", "warned"),
    [("1", 1, True), ("2", 2, True), ("1:30", 2, True), ("2:01", 3, False), ("60", 60, False)],
)
def test_a_slurm_time_limit_the_early_sigusr2_can_kill_is_warned_of(cli, tmp_path, time, minutes, warned):
    """submitit asks for SIGUSR2 90 s before the limit and sbatch may send it 60 s early: a limit of 150 s or less
    (the submitted limit, in whole minutes rounded up) can have it arrive as the job starts."""
    result = cli("run", "--suite", "quadratic", "--optim", "adamw", "--out", tmp_path / "store", "--executor", "slurm",
                 "--slurm-time", time, "--dry-run")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert (f"warning: a Slurm time limit of {minutes} min lets Slurm send" in result.stderr) is warned, result.stderr


def test_slurm_time_formats():
    from structbench.execution.slurm import parse_slurm_time

    assert [parse_slurm_time(t) for t in ("30", "90:30", "2:00:00", "1-0", "1-02:03", 15)] == [
        30, 91, 120, 1440, 1563, 15,
    ]  # fmt: skip


def test_status_counts_done_failed_queued_running_and_missing(tmp_path):
    from structbench.store import grids as grid_status

    cells = [{"key": f"k{i}", "suite": "s", "optim": "muon", "seed": i, "job_id": f"7_{i}"} for i in range(6)]
    grid_status.write_manifest(tmp_path, "g1", {"created": "1", "cells": cells, "submitit_folder": "/f/%j"})
    runs = pd.DataFrame(
        {
            "run_key": ["k0", "k1", "k2", "k2", "k9"],
            "status": ["ok", "diverged", "error", "ok", "ok"],
            "suite": ["s"] * 5,
            "optim": ["muon"] * 4 + ["adamw"],
        }
    )
    live = {"7_3": "PENDING", "7_4": "RUNNING", "7_5": "UNKNOWN"}
    tallies = grid_status.grid_status(tmp_path, runs, lambda folder, ids: {i: live.get(i, "UNKNOWN") for i in ids})
    muon = tallies[("s", "muon")]
    assert (muon.done, dict(muon.failed), muon.queued, muon.running, muon.missing) == (2, {"diverged": 1}, 1, 1, 1)
    assert tallies[("s", "adamw")].done == 1


def test_local_workers_divide_the_cores(monkeypatch):
    from structbench.execution import local

    monkeypatch.setattr(local, "usable_cores", lambda: 8)
    assert [local.threads_per_worker(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert math.isfinite(local.usable_cores())


def test_error_runs_are_run_again_and_final_failures_are_not(cli, tmp_path, monkeypatch):
    from structbench.tasks.quadratic import QuadraticTask

    original = QuadraticTask.train_loss

    def failing(self, step):
        if step == 2 and getattr(self, "_fail", False):
            raise RuntimeError("injected")
        return original(self, step)

    args = ("run", "--suite", "quadratic", "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--steps", "20",
            "--quiet", "--out", tmp_path)  # fmt: skip
    monkeypatch.setattr(QuadraticTask, "train_loss", failing)
    built = QuadraticTask.__init__

    def marking_init(self, *a, **k):
        built(self, *a, **k)
        self._fail = True

    monkeypatch.setattr(QuadraticTask, "__init__", marking_init)
    assert cli(*args, "--set", "hparams.sgd.lr=1e9").exit_code == 1
    first = read_runs(tmp_path).set_index("optim").status.to_dict()
    assert first == {"sgd": "error", "adamw": "error"}
    monkeypatch.setattr(QuadraticTask, "__init__", built)
    again = cli(*args, "--set", "hparams.sgd.lr=1e9")
    assert "2 already stored" not in again.stdout and "0 already stored, 2 to run" in " ".join(again.stdout.split())
    statuses = read_runs(tmp_path).groupby("optim").status.apply(sorted).to_dict()
    assert statuses == {"adamw": ["error", "ok"], "sgd": ["diverged", "error"]}
    third = cli(*args, "--set", "hparams.sgd.lr=1e9")
    assert "2 already stored, 0 to run" in " ".join(third.stdout.split()), "diverged and ok are final"
