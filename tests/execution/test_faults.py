"""Fault injection: signals at random points of a grid, interrupts inside the store write and the git call, a full
disk, a task that cannot be built, non-finite losses, and what a crash leaves behind. Nothing finished is lost, the
exit code and the message match what the store holds, and the next `run` leaves no debris.

`STRUCTBENCH_FAULT_TRIALS` raises the number of signal trials (9 by default: each signal at three delays)."""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from structbench.execution import checkpoint, slurm
from structbench.execution.job import Job
from structbench.store import write as store
from structbench.tasks.quadratic import QuadraticTask
from tests.support.slurm_cluster import quiet_submitit_sacct, require_slurm
from tests.support.store import read_runs

TRIALS = int(os.environ.get("STRUCTBENCH_FAULT_TRIALS", "9"))
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
LATEST_SIGNAL_S = 2.5
"""The latest signal, in seconds after the grid line."""
GRID = ["--suite", "quadratic", "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--seed", "1", "--steps", "2000"]
SUMMARY = re.compile(r"interrupted by (SIG\w+): this command stored (\d+) run\(s\) \(([^)]*)\)")

# The command line with one addition: when a run's training loop returns normally, "<optim> <seed>" is appended to
# the file named by FINISHED_LOG (flushed and fsynced) — the independent record of which runs finished training.
DRIVER = textwrap.dedent(
    """
    import os, sys
    from structbench.execution import runner
    from structbench.cli import app as cli

    log = open(os.environ["FINISHED_LOG"], "a")
    execute, train = runner.execute, runner._train
    current = {}

    def recording_execute(suite, optim_name, seed, *args, **kwargs):
        current["run"] = f"{optim_name} {seed}"
        return execute(suite, optim_name, seed, *args, **kwargs)

    def recording_train(*args, **kwargs):
        final = train(*args, **kwargs)
        log.write(current["run"] + "\\n"); log.flush(); os.fsync(log.fileno())
        return final

    runner.execute, runner._train = recording_execute, recording_train
    sys.argv = ["structbench", *sys.argv[1:]]
    cli.app()
    """
)


def stored_runs(out: Path) -> pd.DataFrame:
    return read_runs(out) if (out / "runs").is_dir() and any((out / "runs").iterdir()) else pd.DataFrame()


def assert_store_consistent(out: Path) -> None:
    """Every run row reads and has its curve file; no file but the store's own."""
    runs = stored_runs(out)
    for run_id in runs.get("run_id", []):
        assert (out / "curves" / f"{run_id}.parquet").is_file(), f"run {run_id} without its curves"
        pq.read_table(out / "curves" / f"{run_id}.parquet")


def wait_for_line(proc: subprocess.Popen, prefix: bytes, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix) or not line:
            return
    raise AssertionError(f"no {prefix!r} line within {limit_s} s")


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_signal_at_a_random_point_of_a_grid_loses_nothing(trial, tmp_path, cli):
    """Trial k sends signal k mod 3 at a random time in the k-th of TRIALS equal slices of [0, LATEST_SIGNAL_S]
    after the grid line: the signals take turns, and each meets the grid early, midway and late."""
    signum = SIGNALS[trial % len(SIGNALS)]
    delay = (trial + random.Random(trial).random()) * LATEST_SIGNAL_S / TRIALS
    out, finished_log = tmp_path / "results", tmp_path / "finished.txt"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "FINISHED_LOG": str(finished_log), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(driver), "run", *GRID, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    wait_for_line(proc, b"grid:", 120)  # signals before the command runs are Python's defaults: not tested here
    time.sleep(delay)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    stderr = err.decode()
    runs = stored_runs(out)

    print(f"trial {trial}: {signal.Signals(signum).name} {delay:.2f} s after the grid line -> exit {proc.returncode}, "
          f"stored {dict(Counter(runs.status)) if len(runs) else {}}")  # fmt: skip
    assert_store_consistent(out)
    finished = finished_log.read_text().split("\n")[:-1] if finished_log.exists() else []
    stored = {f"{r.optim} {r.seed}" for r in runs.itertuples()} if len(runs) else set()
    if signum != signal.SIGKILL:  # SIGKILL may land between a run's training and its storing
        assert set(finished) <= stored, f"finished runs missing from the store: {set(finished) - stored}"
    if signum == signal.SIGKILL:  # nothing to say but consistency, checked above, and the clean next run below
        assert proc.returncode in (0, -signal.SIGKILL)
    elif proc.returncode in (0, -signum):  # the grid ended before the signal (or it hit the interpreter's exit)
        assert len(runs) == 4 and set(runs.status) == {"ok"}
    else:
        assert proc.returncode == 128 + signum, stderr
        match = SUMMARY.search(stderr)
        assert match, stderr
        assert match.group(1) == signal.Signals(signum).name
        assert int(match.group(2)) == len(runs)
        counts = Counter(runs.status) if len(runs) else Counter()
        expected = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"
        assert match.group(3) == expected
        assert counts["interrupted"] <= 1, "inline: at most the one run in progress is interrupted"
        assert "Traceback" not in stderr

    rerun = cli("run", *GRID, "--out", out, "--quiet")
    assert rerun.exit_code == 0, rerun.stderr
    assert store.find_debris(out).paths() == []
    final = read_runs(out)
    assert sorted(final[final.status == "ok"][["optim", "seed"]].itertuples(index=False)) == [
        ("adamw", 0),
        ("adamw", 1),
        ("sgd", 0),
        ("sgd", 1),
    ]


def test_sigterm_to_the_local_executor_reaches_its_workers_and_their_runs_are_stored(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "structbench", "run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0",
         "--seed", "1", "--steps", "100000000", "--set", "budget.checkpoint_every=1", "--executor", "local",
         "--jobs", "2", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    wait_for_line(proc, b"grid:", 120)
    deadline = time.monotonic() + 120
    # The runs last ~forever; each run's first checkpoint (after its first step) says its worker is training.
    while len(list((out / "checkpoints").glob("*/checkpoint.pt"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "both workers should be training by now"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # to the command alone, as `timeout` or a batch system sends it
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err.decode()
    runs = read_runs(out)
    assert sorted(runs.status) == ["interrupted", "interrupted"]
    assert (runs.steps > 0).all()
    assert "this command stored 2 run(s) (2 interrupted)" in err.decode()


# ------------------------------------------------------------------ interrupts inside the protected region


def _signal_self_once(signum: int, times: int = 1):
    sent = {"done": False}

    def send() -> None:
        if not sent["done"]:
            sent["done"] = True
            for _ in range(times):
                os.kill(os.getpid(), signum)

    return send


def test_ctrl_c_twice_inside_the_store_write_still_stores_the_finished_run(cli, tmp_path, monkeypatch):
    send = _signal_self_once(signal.SIGINT, times=2)
    original = store._write_atomic

    def interrupting_write(table, path, writer):
        if path.parent.name == "runs":
            send()
        original(table, path, writer)

    monkeypatch.setattr(store, "_write_atomic", interrupting_write)
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--seed", "1", "--steps", "30",
                 "--out", tmp_path, "--quiet")  # fmt: skip
    assert result.exit_code == 130
    runs = read_runs(tmp_path)
    assert runs.status.tolist() == ["ok"] and runs.seed.tolist() == [0], "stored; the grid stopped after it"
    assert "interrupted by SIGINT: this command stored 1 run(s) (1 ok); 1 of the 2 planned" in result.stderr
    assert list(tmp_path.rglob("*.tmp")) == []


def test_sigterm_inside_the_git_call_still_stores_the_finished_run(cli, tmp_path, monkeypatch):
    from structbench import environment

    send = _signal_self_once(signal.SIGTERM)
    original = environment.git_commit

    def interrupted_git(root):
        send()
        return original(root)

    monkeypatch.setattr(environment, "git_commit", interrupted_git)
    environment.code_facts.cache_clear()  # git runs once per process: make it run in this command
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30", "--out", tmp_path)
    assert result.exit_code == 143
    runs = read_runs(tmp_path)
    assert runs.status.tolist() == ["ok"] and runs.steps.tolist() == [30]
    assert "interrupted by SIGTERM: this command stored 1 run(s) (1 ok)" in result.stderr


# ------------------------------------------------------------------ a full disk


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def _fill(directory: Path) -> None:
    """Write a filler file until the filesystem is full (unbuffered: nothing is left to write when it is closed)."""
    with (directory / "filler").open("wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_full_disk_is_one_line_exit_1_and_earlier_runs_stay_intact(cli, tmp_path, monkeypatch):
    mount = tmp_path / "disk"
    mounted = _mount_tmpfs(mount, "8m")
    try:
        out = mount / "results" if mounted else tmp_path / "results"
        first = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30", "--out", out)
        assert first.exit_code == 0
        before = {p: p.read_bytes() for p in out.rglob("*.parquet")}
        if mounted:
            _fill(mount)
        else:
            print("no tmpfs mount here (needs root): a patched writer raises ENOSPC instead")
            monkeypatch.setattr(store, "_write_atomic", _raise_enospc)
        result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "1", "--seed", "2", "--steps", "30",
                     "--out", out, "--quiet")  # fmt: skip
        assert result.exit_code == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(f"error: cannot write to the results store {out.resolve()}: No space left on device")
        assert {p: p.read_bytes() for p in out.rglob("*.parquet")} == before
        assert [p for p in out.rglob("*") if p.name.endswith(".tmp")] == []
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=True)


def _raise_enospc(table, path, writer):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


# ------------------------------------------------------------------ failures inside a run are its status


def test_an_out_of_memory_error_while_building_the_task_is_that_runs_status(cli, tmp_path, monkeypatch):
    original = QuadraticTask.__init__

    def failing_build(self, args, ctx):
        if ctx.seed == 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        original(self, args, ctx)

    monkeypatch.setattr(QuadraticTask, "__init__", failing_build)
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--seed", "1", "--steps", "30",
                 "--out", tmp_path, "--quiet")  # fmt: skip
    runs = read_runs(tmp_path).sort_values("seed")
    assert runs.status.tolist() == ["oom", "ok"]
    assert runs.error.iloc[0] == "CUDA out of memory. Tried to allocate 80.00 GiB"
    assert runs.steps.iloc[0] == 0 and pd.isna(runs.param_count.iloc[0])
    assert result.exit_code == 0


def test_a_data_error_while_building_the_task_is_an_error_run_and_the_grid_goes_on(cli, tmp_path, monkeypatch):
    original = QuadraticTask.__init__

    def failing_build(self, args, ctx):
        if ctx.seed == 0:
            raise OSError(errno.EIO, "Input/output error", "/data/shard-3")
        original(self, args, ctx)

    monkeypatch.setattr(QuadraticTask, "__init__", failing_build)
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--seed", "1", "--steps", "30",
                 "--out", tmp_path, "--quiet")  # fmt: skip
    runs = read_runs(tmp_path).sort_values("seed")
    assert runs.status.tolist() == ["error", "ok"]
    assert "/data/shard-3" in runs.error.iloc[0]
    assert result.exit_code == 1


@pytest.mark.parametrize("bad", [math_value for math_value in (float("nan"), float("inf"), float("-inf"))])
def test_every_non_finite_training_loss_ends_the_run_diverged(bad, cli, tmp_path, monkeypatch):
    original = QuadraticTask.train_loss

    def poisoned(self, step):
        loss = original(self, step)
        return loss * bad if step == 6 else loss

    monkeypatch.setattr(QuadraticTask, "train_loss", poisoned)
    cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30", "--out", tmp_path)
    runs = read_runs(tmp_path)
    assert runs.status.tolist() == ["diverged"] and runs.steps.tolist() == [7]
    assert f"non-finite training loss ({bad}) at step 7" == runs.error.iloc[0]


def test_a_non_finite_evaluation_loss_ends_the_run_diverged(cli, tmp_path, monkeypatch):
    from structbench.tasks.base import EvalResult

    original = QuadraticTask.evaluate
    calls = {"n": 0}

    def infinite_later(self):
        calls["n"] += 1
        result = original(self)
        return result if calls["n"] == 1 else EvalResult(loss=float("inf"), metric=result.metric)

    monkeypatch.setattr(QuadraticTask, "evaluate", infinite_later)
    cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30",
        "--set", "budget.eval_every=10", "--out", tmp_path)  # fmt: skip
    runs = read_runs(tmp_path)
    assert runs.status.tolist() == ["diverged"]
    assert runs.error.iloc[0] == "non-finite evaluation loss (inf) at step 10"


# ------------------------------------------------------------------ debris a crash leaves


def _make_debris(out: Path) -> dict[str, Path]:
    run_id = read_runs(out).run_id.iloc[0]
    orphan = out / "curves" / "20250101T000000-quadratic-sgd-s9-abcdef.parquet"
    orphan.write_bytes((out / "curves" / f"{run_id}.parquet").read_bytes())
    temporary = out / "runs" / ".20250101T000000-quadratic-sgd-s8-abcdef.parquet.tmp"
    temporary.write_bytes(b"PAR1 half")
    stale = checkpoint.directory(out, read_runs(out).run_key.iloc[0])
    stale.mkdir(parents=True)
    (stale / checkpoint.FILE).write_bytes(b"old")
    live = checkpoint.directory(out, "f" * 20)  # a run in progress (no final row): kept
    live.mkdir(parents=True)
    (live / checkpoint.FILE).write_bytes(b"live")
    return {"orphan": orphan, "temporary": temporary, "stale": stale, "live": live}


def test_the_next_run_removes_what_a_crash_left_and_keeps_live_checkpoints(cli, tmp_path):
    assert cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30", "--out", tmp_path,
               "--quiet").exit_code == 0  # fmt: skip
    debris = _make_debris(tmp_path)
    report = cli("report", "--out", tmp_path)
    assert report.exit_code == 0
    assert (
        f"warning: {tmp_path} holds 1 leftover temporary file, 1 curve/table file without its run, "
        "1 checkpoint of a run already stored; `structbench doctor" in report.stderr
    )
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "1", "--steps", "30", "--out", tmp_path,
                 "--quiet")  # fmt: skip
    assert result.exit_code == 0
    assert "removed from" in result.stderr and "1 leftover temporary file" in result.stderr
    assert not debris["orphan"].exists() and not debris["temporary"].exists() and not debris["stale"].exists()
    assert (debris["live"] / checkpoint.FILE).read_bytes() == b"live"
    assert len(read_runs(tmp_path)) == 2


def test_doctor_reports_then_repairs_debris_and_unreadable_files(cli, tmp_path):
    assert cli("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30", "--out", tmp_path,
               "--quiet").exit_code == 0  # fmt: skip
    debris = _make_debris(tmp_path)
    corrupt = tmp_path / "runs" / "20250101T000000-quadratic-sgd-s7-abcdef.parquet"
    corrupt.write_bytes(b"not parquet")
    found = cli("doctor", "--out", tmp_path)
    assert found.exit_code == 1
    for path in (debris["orphan"], debris["temporary"], debris["stale"]):
        assert f"found: {path}" in found.stdout
    assert f"unreadable: {corrupt}" in found.stdout
    assert str(debris["live"]) not in found.stdout
    repaired = cli("doctor", "--out", tmp_path, "--repair")
    assert repaired.exit_code == 0
    assert not corrupt.exists() and (tmp_path / ".quarantine" / "runs" / corrupt.name).read_bytes() == b"not parquet"
    clean = cli("doctor", "--out", tmp_path)
    assert clean.exit_code == 0 and "1 runs, no debris, every file readable" in clean.stdout


# A sitecustomize that makes the first build of seed 0's task kill its own process (SIGKILL, as the kernel's
# out-of-memory killer does); loaded by every interpreter of the command, the local executor's workers included.
KILL_ONCE = textwrap.dedent(
    """
    import os, signal
    from pathlib import Path
    from structbench.tasks import quadratic

    marker = Path(os.environ["KILL_MARKER"])
    build = quadratic.QuadraticTask.__init__

    def dying_build(self, args, ctx):
        if ctx.seed == 0 and not marker.exists():
            marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        build(self, args, ctx)

    quadratic.QuadraticTask.__init__ = dying_build
    """
)


def test_a_killed_local_worker_does_not_end_the_grid(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(KILL_ONCE)
    marker, out = tmp_path / "killed", tmp_path / "results"
    env = {**os.environ, "KILL_MARKER": str(marker), "PYTHONPATH": str(tmp_path / "site")}
    done = subprocess.run(
        [sys.executable, "-m", "structbench", "run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0",
         "--seed", "1", "--seed", "2", "--steps", "2000", "--executor", "local", "--jobs", "2", "--out", str(out),
         "--quiet"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert marker.read_text() == "killed", "the fault was injected"
    assert done.returncode == 0, done.stderr
    runs = read_runs(out)
    assert sorted(runs[runs.status == "ok"].seed) == [0, 1, 2]
    assert set(runs.status) <= {"ok", "interrupted"}, "a worker the broken pool stopped stores its run interrupted"


def test_a_slurm_job_killed_before_its_result_is_a_failed_run_and_the_wait_ends(cli, tmp_path, monkeypatch):
    """Seed 0's job dies by SIGKILL before it writes a result; the cluster keeps no accounting, so submitit alone
    would wait for that result forever. The wait ends with the run reported failed, seed 1 stored, exit 1; the same
    command then runs only seed 0."""
    require_slurm()
    quiet_submitit_sacct()
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(KILL_ONCE)
    marker, out = tmp_path / "killed", tmp_path / "results"
    monkeypatch.setenv("KILL_MARKER", str(marker))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))  # the jobs' environment: sbatch exports this one's
    monkeypatch.setattr(slurm, "LOST_AFTER_S", 2.0)
    command = ("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--seed", "1", "--steps", "40",
               "--executor", "slurm", "--wait", "--slurm-time", "5", "--out", out, "--quiet")  # fmt: skip
    result = cli(*command)
    assert marker.read_text() == "killed", "the fault was injected"
    assert result.exit_code == 1, result.stderr
    assert re.search(r"seed=0.*: the worker failed: Slurm job \d+_0 ended without a result \(", result.stderr), (
        result.stderr
    )
    assert read_runs(out).seed.tolist() == [1]
    again = cli(*command)
    assert again.exit_code == 0, again.stderr
    assert sorted(read_runs(out).seed) == [0, 1] and set(read_runs(out).status) == {"ok"}


@pytest.mark.parametrize("listings", [["listed", "unlisted"], ["unanswered", "unlisted"]])
def test_a_job_slurm_no_longer_lists_fails_only_after_lost_after_s_without_a_result(listings, monkeypatch):
    """A job still listed, or a round squeue does not answer, never starts the clock; unlisted, the job fails once
    LOST_AFTER_S has passed with no result, quoting the last line of its error log. A job whose result appears
    while it is unlisted is collected."""
    monkeypatch.setattr(slurm, "LOST_AFTER_S", 0.3)
    lost, late = FakeSlurmJob("7_0", stderr="starting\nsrun: error: task 0: Killed\n\n"), FakeSlurmJob("7_1")
    rounds: list[float] = []

    def squeue() -> dict[str, str] | None:
        rounds.append(time.monotonic())
        if len(rounds) == 6:
            late.row = {"run_id": "late"}
        if len(rounds) <= 3:
            return {"7_0": "RUNNING", "7_1": "RUNNING"} if listings[0] == "listed" else None
        return {}

    finished = [
        (time.monotonic(), f.job.cell, f.row, f.failure)
        for f in slurm.collect_slurm([job_for("a"), job_for("b")], [lost, late], poll_s=0.01, queued=squeue)
    ]
    assert [f[1:] for f in finished] == [
        ("b", {"run_id": "late"}, None),
        ("a", None, "Slurm job 7_0 ended without a result (its error log ends: srun: error: task 0: Killed)"),
    ]
    assert finished[1][0] - rounds[3] >= 0.3, "failed no sooner than LOST_AFTER_S after it was first unlisted"


def test_a_lost_job_with_an_empty_error_log_says_so(monkeypatch):
    monkeypatch.setattr(slurm, "LOST_AFTER_S", 0.0)
    job = FakeSlurmJob("8_0", stderr=None)
    (finished,) = slurm.collect_slurm([job_for("a")], [job], poll_s=0.0, queued=dict)
    assert finished.failure == "Slurm job 8_0 ended without a result (its error log is empty)"


class FakeSlurmJob:
    """The part of a submitit job that collect_slurm uses: done once `row` is set."""

    def __init__(self, job_id: str, stderr: str | None = "") -> None:
        self.job_id, self.row, self._stderr = job_id, None, stderr

    def done(self) -> bool:
        return self.row is not None

    def result(self) -> dict[str, str]:
        assert self.row is not None
        return self.row

    def stderr(self) -> str | None:
        return self._stderr


def job_for(cell: str) -> Job:
    return Job(cell=cell, device="cpu", data_root="", out="", executor="slurm", parallel_runs=1, threads=1)


@pytest.mark.parametrize(("time_limit_s", "status"), [(120.0, "timeout"), (86400.0, "interrupted")])
def test_slurms_time_limit_warning_ends_a_run_timeout_only_near_the_jobs_limit(time_limit_s, status, tmp_path,
                                                                              monkeypatch):  # fmt: skip
    """submitit has Slurm send SIGUSR2 90 s before the time limit, and also on preemption: near the limit (a 2-minute
    job) the run ends `timeout` (final); a day-long job warned after seconds was preempted: `interrupted`."""
    from structbench.execution.job import Job, run_job
    from structbench.plan import grid, spec

    original = QuadraticTask.train_loss

    def warned(self, step):
        if step == 5:
            os.kill(os.getpid(), signal.SIGUSR2)
        return original(self, step)

    monkeypatch.setattr(QuadraticTask, "train_loss", warned)
    suites, _ = spec.load_suites("quadratic", ["budget.steps=1000"], ["sgd"], [0])
    cell = grid.build_grid(suites, "cpu")[0]
    store.prepare(tmp_path)
    row = run_job(Job(cell=cell, device="cpu", data_root=str(tmp_path), out=str(tmp_path), executor="slurm",
                      parallel_runs=1, threads=1, time_limit_s=time_limit_s))  # fmt: skip
    assert row["status"] == status and row["steps"] < 1000
    assert read_runs(tmp_path).status.tolist() == [status]
