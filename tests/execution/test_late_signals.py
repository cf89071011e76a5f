"""A signal in the last phases of `run` (the grid's manifest write, the index refresh, the runs table) still ends
the command with its interruption summary and the signal's exit code; after that the command ignores signals, so one
arriving while the interpreter exits cannot kill it. And kill -9 of a local-executor command: its workers store
nothing after it is gone.

Each signal is sent by the process to itself from inside the phase (a patched function), not after a delay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from structbench.report.views import terminal
from structbench.store import grids
from structbench.store import read as store_read

GRID = ("run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "20", "--quiet")


def signalling(function, signum: int):
    """`function`, which first sends `signum` to this process (the handler runs before the function's body)."""

    def wrapped(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return function(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize(
    ("module", "name", "signum", "stored"),
    [
        (grids, "write_manifest", signal.SIGTERM, "0 run(s) (none); 1 of the 1"),
        (store_read, "refresh_index", signal.SIGINT, "1 run(s) (1 ok); 0 of the 1"),
        (terminal, "runs_table", signal.SIGINT, "1 run(s) (1 ok); 0 of the 1"),
        (terminal, "runs_table", signal.SIGTERM, "1 run(s) (1 ok); 0 of the 1"),
    ],
)
def test_a_signal_in_a_last_phase_of_run_ends_it_with_the_summary(cli, tmp_path, monkeypatch, module, name, signum,
                                                                   stored):  # fmt: skip
    monkeypatch.setattr(module, name, signalling(getattr(module, name), signum))
    result = cli(*GRID, "--out", tmp_path)
    assert result.exit_code == 128 + signum, result.stderr
    summary = f"interrupted by {signal.Signals(signum).name}: this command stored {stored} planned run(s)"
    assert summary in result.stderr
    assert len(list((tmp_path / "runs").glob("*.parquet"))) == int(stored[0])


def test_after_its_summary_run_ignores_signals_to_its_exit(cli, tmp_path):
    """Python puts the default handlers back late in its shutdown, where a signal would kill the process with no
    word; the command ignores SIGINT and SIGTERM from its last output on."""
    assert cli(*GRID, "--out", tmp_path).exit_code == 0
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


# ------------------------------------------------------------------ kill -9 of the local executor's command


def workers_of(command: psutil.Process) -> list[psutil.Process]:
    """The command's pool workers: the children of its forkserver (structbench.execution.local)."""
    return [worker for child in command.children() for worker in child.children()]


def test_workers_store_nothing_after_kill_9_of_their_command(tmp_path):
    """Two runs whose training lasts ~forever; once both workers have checkpointed (they train), kill -9 of the
    command; every worker must exit, and no run file may appear."""
    out = tmp_path / "results"
    command = subprocess.Popen(
        [sys.executable, "-m", "structbench", "run", "--suite", "quadratic", "--optim", "sgd", "--seed", "0",
         "--seed", "1", "--steps", "100000000", "--set", "budget.checkpoint_every=1", "--set", "budget.max_time_s=30",
         "--executor", "local", "--jobs", "2", "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(list(Path(out, "checkpoints").glob("*/checkpoint.pt"))) < 2:
        assert command.poll() is None and time.monotonic() < deadline, "both workers should be training by now"
        time.sleep(0.05)
    workers = workers_of(psutil.Process(command.pid))
    assert len(workers) == 2
    command.kill()
    command.wait()
    _, alive = psutil.wait_procs(workers, timeout=60)
    for worker in alive:
        worker.kill()
    assert alive == [], "a worker outlived its command by a minute"
    assert list(Path(out, "runs").glob("*.parquet")) == []
