"""End-to-end runs of the real CLI into a temporary results store, read back with pandas."""

from __future__ import annotations

import platform
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from structbench.execution import job as job_module
from tests.support.store import read_curves, read_runs
from tests.support.tasks import interrupt_at

QUICK = ("--suite", "quadratic", "--steps", "30", "--quiet", "--device", "cpu")


def test_run_writes_every_contract_column_with_its_type(cli, tmp_path):
    result = cli("run", *QUICK, "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--seed", "1", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    runs = read_runs(tmp_path)
    assert len(runs) == 4
    assert sorted(zip(runs.optim, runs.seed, strict=True)) == [("adamw", 0), ("adamw", 1), ("sgd", 0), ("sgd", 1)]
    contract = [
        "run_id",
        "schema_version",
        "suite",
        "task",
        "optim",
        "seed",
        "hparams",
        "spec",
        "status",
        "error",
        "started_at",
        "finished_at",
        "steps",
        "wall_s",
        "train_s",
        "eval_s",
        "compile_s",
        "step_time_median_s",
        "optim_time_median_s",
        "peak_mem_bytes",
        "peak_mem_source",
        "state_bytes",
        "param_count",
        "final_train_loss",
        "final_eval_loss",
        "final_eval_metric",
        "eval_metric_name",
        "target_step",
        "target_s",
        "device",
        "device_name",
        "torch_version",
        "structbench_version",
        "git_commit",
        "hostname",
        "python_version",
    ]
    assert set(contract) <= set(runs.columns)
    arrow = pq.read_schema(next((tmp_path / "runs").glob("*.parquet")))
    assert str(arrow.field("started_at").type) == "timestamp[us, tz=UTC]"
    for column in ("seed", "steps", "peak_mem_bytes", "state_bytes", "param_count", "schema_version"):
        assert pd.api.types.is_integer_dtype(runs[column]), column
    for column in ("wall_s", "train_s", "eval_s", "compile_s", "step_time_median_s", "final_eval_loss"):
        assert pd.api.types.is_float_dtype(runs[column]), column
    assert set(runs.status) == {"ok"}
    assert (runs.steps == 30).all()
    # On CPU: the peak resident set above the one before the run; a run this small may fit in memory the process
    # already holds (0 bytes more).
    assert (runs.peak_mem_source == "rss-delta").all()
    assert (runs.peak_mem_bytes >= 0).all()
    # 32x16 weight: SGD keeps one momentum buffer (float32), AdamW two moments plus a float32 step scalar.
    assert runs.set_index("optim").loc["sgd", "state_bytes"].tolist() == [32 * 16 * 4] * 2
    assert runs.set_index("optim").loc["adamw", "state_bytes"].tolist() == [2 * 32 * 16 * 4 + 4] * 2
    assert (runs.param_count == 32 * 16).all()
    assert (runs.analytic_state_bytes == runs.state_bytes).all()
    # Training time is the warm-up step plus the rest, and excludes evaluation. train_s is stored as
    # fl(wall - compile), so train + compile rounds twice: within (2 u + u^2) wall of it (float64, u = 2^-53, all
    # three nonnegative), under gamma_3 relative. Leaving out the warm-up (compile_s) or adding eval_s is off by
    # that many seconds (>= 1e-5 here).
    assert np.allclose(runs.wall_s, runs.train_s + runs.compile_s, rtol=3 * 2.0**-53 / (1 - 3 * 2.0**-53), atol=0)
    assert (runs.eval_s > 0).all()
    assert (runs.step_time_median_s >= runs.optim_time_median_s).all()
    assert (runs.final_eval_loss < runs.initial_eval_loss).all()
    curves = read_curves(tmp_path)
    assert set(curves.run_id) == set(runs.run_id)
    assert set(curves.split) == {"train", "eval"}
    assert list(curves.columns[:9]) == [
        "run_id",
        "step",
        "wall_s",
        "split",
        "loss",
        "metric",
        "lr",
        "step_time_s",
        "optim_time_s",
    ]


def test_same_seed_gives_the_same_curve_bit_for_bit(cli, tmp_path):
    for out in ("a", "b"):
        assert (
            cli(
                "run", *QUICK, "--optim", "adamw", "--seed", "3", "--set", "budget.log_every=1", "--out", tmp_path / out
            ).exit_code
            == 0
        )
    losses = [
        read_curves(tmp_path / out).query("split == 'train'").sort_values("step").loss.to_numpy() for out in ("a", "b")
    ]
    assert len(losses[0]) == 30
    assert np.array_equal(losses[0], losses[1])
    assert (
        cli(
            "run", *QUICK, "--optim", "adamw", "--seed", "4", "--set", "budget.log_every=1", "--out", tmp_path / "c"
        ).exit_code
        == 0
    )
    other = read_curves(tmp_path / "c").query("split == 'train'").sort_values("step").loss.to_numpy()
    assert not np.array_equal(losses[0], other)


def test_absurd_learning_rate_is_recorded_as_diverged(cli, tmp_path):
    result = cli(
        "run",
        *QUICK,
        "--optim",
        "sgd",
        "--seed",
        "0",
        "--set",
        "hparams.sgd.lr=1e6",
        "--set",
        "budget.log_every=1",
        "--out",
        tmp_path,
    )
    assert result.exit_code == 0, result.output  # diverged is a result, not an error
    run = read_runs(tmp_path).iloc[0]
    assert run.status == "diverged"
    assert 1 <= run.steps < 30
    assert "non-finite" in run.error
    train = read_curves(tmp_path).query("split == 'train'")
    assert train.step.tolist() == list(range(1, run.steps))  # every finite step logged, none after


def test_target_step_is_the_first_eval_that_reaches_the_target(cli, tmp_path):
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--quiet", "--out", tmp_path)
    assert result.exit_code == 0
    run = read_runs(tmp_path).iloc[0]
    evals = read_curves(tmp_path).query("split == 'eval'").sort_values("step")
    reached = evals[evals.metric <= 0.01]
    assert run.target_step == reached.step.iloc[0]
    assert run.target_s == reached.wall_s.iloc[0]  # exact: the runner stores the same wall time in both places
    assert evals[evals.step < run.target_step].metric.gt(0.01).all()


def test_error_inside_a_run_is_recorded_and_the_grid_goes_on(cli, tmp_path, monkeypatch):
    from structbench.tasks.quadratic import QuadraticTask

    original = QuadraticTask.train_loss

    def failing(self, step):
        if self.model.weight.shape == (32, 16) and step == 3 and runner_calls["n"] == 0:
            raise RuntimeError("boom at step 3")
        return original(self, step)

    runner_calls = {"n": 0}
    original_execute = job_module.run_job

    def counting_execute(*args, **kwargs):
        try:
            return original_execute(*args, **kwargs)
        finally:
            runner_calls["n"] += 1

    monkeypatch.setattr(QuadraticTask, "train_loss", failing)
    monkeypatch.setattr("structbench.execution.job.run_job", counting_execute)
    result = cli("run", *QUICK, "--optim", "sgd", "--seed", "0", "--seed", "1", "--out", tmp_path)
    assert result.exit_code == 1
    runs = read_runs(tmp_path).sort_values("seed")
    assert runs.status.tolist() == ["error", "ok"]
    assert "boom at step 3" in runs.error.iloc[0]
    # --steps 30 logs every step (quadratic's log_every 5 shortened with eval_every): steps 0-2 were completed.
    assert runs.steps.iloc[0] == 3


def test_keyboard_interrupt_stores_the_partial_run_as_interrupted(cli, tmp_path, monkeypatch):
    interrupt_at(monkeypatch, 12)
    result = cli(
        "run",
        *QUICK,
        "--optim",
        "sgd",
        "--optim",
        "adamw",
        "--set",
        "budget.log_every=5",
        "--seed",
        "0",
        "--out",
        tmp_path,
    )
    assert result.exit_code == 130
    runs = read_runs(tmp_path)
    assert len(runs) == 1  # the grid stopped: adamw never started
    assert runs.status.iloc[0] == "interrupted"
    assert runs.steps.iloc[0] == 10  # the last log point before the interrupt


def test_sigint_to_a_real_process_exits_130_and_keeps_the_partial_run(tmp_path):
    import psutil

    cmd = [
        sys.executable,
        "-m",
        "structbench",
        "run",
        "--suite",
        "quadratic",
        "--optim",
        "sgd",
        "--seed",
        "0",
        "--steps",
        "100000000",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    child = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while not (tmp_path / "runs").is_dir() and time.monotonic() < deadline:
        time.sleep(0.05)
    # The store exists once the run starts; give it 3 s of CPU (not wall) time so it is well into training.
    started = sum(child.cpu_times()[:2])
    while sum(child.cpu_times()[:2]) < started + 3.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output.decode()
    runs = read_runs(tmp_path)
    assert runs.status.tolist() == ["interrupted"]
    assert runs.steps.iloc[0] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--suite", "quadratik"), "Did you mean 'quadratic'"),
        (("--suite", "quadratic", "--optim", "adamv"), "Did you mean 'adamw'"),
        (("--suite", "quadratic", "--set", "budget.stepz=3"), "valid here: budget.batch_size"),
        (("--suite", "quadratic", "--set", "budget.steps=many"), "budget.steps must be of type int"),
        (("--suite", "quadratic", "--set", "hparams.sgd.lr=0"), "lr must be a positive finite number"),
        (("--suite", "quadratic", "--set", "hparams.sgd.lr=-0.1"), "lr must be a positive finite number"),
        (("--suite", "quadratic", "--set", "hparams.adamw.lr=inf"), "lr must be a positive finite number"),
        (("--suite", "quadratic", "--set", "hparams.sgd.betas=1"), "valid here: hparams.sgd.lr"),
        (("--suite", "quadratic", "--set", "noequals"), "expects key=value"),
        (("--suite", "quadratic", "--device", "tpu"), "--device must be auto, cpu or cuda"),
        (("--suite", "quadratic", "--set", "task_args.problem=circle"), "unknown quadratic problem"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, tmp_path, args, message):
    out = tmp_path / "out"
    result = cli("run", *args, "--quiet", "--out", out)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert not out.exists()


def test_unwritable_out_is_a_usage_error(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = cli("run", *QUICK, "--optim", "sgd", "--out", blocker / "results")
    assert result.exit_code == 2
    assert "not writable" in result.stderr


def test_missing_results_dir_for_report_is_a_usage_error(cli, tmp_path):
    result = cli("report", "--out", tmp_path / "nothing")
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_report_aggregates_and_skips_a_corrupt_file(cli, tmp_path):
    args = ("--optim", "sgd", "--optim", "adamw", "--seed", "0", "--seed", "1")
    assert cli("run", *QUICK, *args, "--out", tmp_path).exit_code == 0
    (tmp_path / "runs" / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp_path / "runs" / "notes.txt").write_text("foreign file")
    result = cli("report", "--out", tmp_path)
    assert result.exit_code == 0
    assert "corrupt.parquet" in result.stderr and "notes.txt" in result.stderr
    for name in ("quadratic", "sgd", "adamw", "2 ok"):
        assert name in result.stdout


def test_report_numbers_are_the_medians_of_the_store(tmp_path, cli):
    assert (
        cli("run", *QUICK, "--optim", "sgd", "--seed", "0", "--seed", "1", "--seed", "2", "--out", tmp_path).exit_code
        == 0
    )
    from structbench.report.build import build_report

    runs = read_runs(tmp_path)
    sgd = build_report(tmp_path).suites[0].selected["sgd"]
    assert sgd.statuses["ok"] == 3 and len(sgd.variant.run_ids) == 3
    assert sgd.final_loss.median == sorted(runs.final_eval_loss)[1]
    assert sgd.state_bytes == 32 * 16 * 4


def test_smoke_suite_runs_every_optimizer_and_checks_losses(cli, tmp_path):
    from structbench import optim

    result = cli("run", "--suite", "smoke", "--quiet", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    runs = read_runs(tmp_path)
    assert sorted(runs.suite.unique()) == ["smoke-mlp", "smoke-quadratic"]
    for suite in ("smoke-mlp", "smoke-quadratic"):
        assert sorted(runs[runs.suite == suite].optim) == optim.names()
    assert (runs.status == "ok").all()
    assert (runs.final_eval_loss < runs.initial_eval_loss).all()
    assert set(runs[runs.suite == "smoke-mlp"].data_source) == {"synthetic gaussian mixture"}


def test_smoke_check_fails_when_a_loss_does_not_fall(cli, tmp_path):
    result = cli(
        "run", "--suite", "smoke", "--optim", "sgd", "--set", "hparams.sgd.lr=1e-12", "--quiet", "--out", tmp_path
    )
    assert result.exit_code == 1
    assert "did not fall" in result.stderr


def test_effective_spec_is_stored_with_the_run(cli, tmp_path):
    import json

    assert (
        cli(
            "run",
            *QUICK,
            "--optim",
            "adamw",
            "--set",
            "hparams.adamw.beta2=0.95",
            "--set",
            "task_args.m=8",
            "--out",
            tmp_path,
        ).exit_code
        == 0
    )
    run = read_runs(tmp_path).iloc[0]
    spec = json.loads(run.spec)
    assert spec["hparams"]["beta2"] == 0.95 and json.loads(run.hparams)["beta2"] == 0.95
    assert spec["task_args"]["m"] == 8 and spec["budget"]["steps"] == 30
    assert run.param_count == 8 * 16


def test_suite_from_a_toml_path(cli, tmp_path):
    suite = tmp_path / "mine.toml"
    suite.write_text('task = "quadratic"\noptims = ["sgd"]\n[budget]\nsteps = 7\n[task_args]\nm = 4\nn = 3\n')
    assert cli("run", "--suite", suite, "--quiet", "--out", tmp_path / "out").exit_code == 0
    run = read_runs(tmp_path / "out").iloc[0]
    assert (run.suite, run.steps, run.param_count) == ("mine", 7, 12)


def test_list_and_env(cli):
    listing = cli("list")
    assert listing.exit_code == 0
    for name in ("quadratic", "smoke", "sgd", "adamw", "torch.optim.AdamW"):
        assert name in listing.stdout
    assert cli("list", "nonsense").exit_code == 2
    env = cli("env")
    assert env.exit_code == 0 and "memory probe" in env.stdout and "rss" in env.stdout
    glibc = platform.libc_ver()[0] == "glibc"
    assert ("C heap trimmed first" in env.stdout) == glibc and ("no malloc_trim" in env.stdout) != glibc


def test_missing_data_is_one_line_exit_2_naming_the_expected_path(cli, tmp_path, monkeypatch):
    from structbench.data import digits

    monkeypatch.setattr(digits, "sklearn_digits_file", lambda: None)  # an installed scikit-learn would supply it
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    result = cli("run", "--suite", "digits", "--data-dir", tmp_path / "empty", "--out", out)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert str(tmp_path / "empty" / "digits" / "digits.csv.gz") in result.stderr
    assert "never downloads" in result.stderr and "Traceback" not in result.output
    assert not out.exists()


def test_a_real_format_dataset_trains_through_the_cli(cli, tmp_path):
    from tests.support.datasets import write_digits_csv

    write_digits_csv(tmp_path / "data" / "digits" / "digits.csv.gz", n_per_class=20)
    result = cli(
        "run",
        "--suite",
        "digits",
        "--optim",
        "adamw",
        "--seed",
        "0",
        "--steps",
        "20",
        "--quiet",
        "--data-dir",
        tmp_path / "data",
        "--out",
        tmp_path / "out",
    )
    assert result.exit_code == 0, result.output
    run = read_runs(tmp_path / "out").iloc[0]
    assert run.status == "ok" and run.eval_metric_name == "accuracy"
    assert str(tmp_path / "data" / "digits") in run.data_source
    assert run.param_count == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10


def test_a_solver_failure_ends_the_run_solver_error_and_the_grid_goes_on(cli, tmp_path, monkeypatch):
    import torch

    from structbench.errors import SolverError
    from structbench.optim import hparams, registry

    class FailingSolver(torch.optim.SGD):
        solver_failures = 0

        def step(self, closure=None):
            self.solver_failures += 1
            if self.solver_failures > 3:
                raise SolverError("eigh failed in float32 and float64 three times running")
            return super().step(closure)

    entry = registry.OptimizerEntry(
        name="failing-solver",
        summary="test double",
        reference="-",
        hparams=hparams.Declaration(hparams.real("lr", 0.1, hparams.ours("a test double"), "(0, inf)")),
        build=lambda named, routing, hp: FailingSolver([p for _, p in named], lr=hp["lr"]),
    )
    monkeypatch.setitem(registry._REGISTRY, "failing-solver", entry)
    result = cli("run", *QUICK, "--optim", "failing-solver", "--optim", "sgd", "--seed", "0", "--out", tmp_path)
    assert result.exit_code == 0, result.output  # solver_error is a result, not a crash
    runs = read_runs(tmp_path).set_index("optim")
    assert runs.loc["failing-solver", "status"] == "solver_error"
    assert "three times running" in runs.loc["failing-solver", "error"]
    assert runs.loc["sgd", "status"] == "ok"
