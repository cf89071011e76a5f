from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch

from structbench.execution import signals
from structbench.report.parallel import usable_cores
from tests.support import system_parts
from tests.support.cli import invoke

# One intra-op thread for the whole test run: its tensors are small, and OpenMP threads that spin at barriers slow
# a run many times over when another process shares the cores (a 2-core CI rehearsal took 23 min instead of 2).
torch.set_num_threads(1)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml's addopts): one worker per core this process may run on, at most 8 (each imports
    torch), not pytest-xdist's default of the machine's physical cores, which is 1 on a VM of 2 vCPUs that are
    hyperthreads of one core, and counts cores a container or `taskset` withholds."""
    return usable_cores()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "system_part(name): the test needs this system part (tests/support/system_parts.py); skipped without it, "
        "failed without it under CI=true",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("system_part"):
        system_parts.require(*marker.args)


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """A command run in-process installs structbench's SIGINT/SIGTERM handlers: restore pytest's after each test."""
    saved = {signum: signal.getsignal(signum) for signum in (*signals.HANDLED, signals.SLURM_WARNING)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    signals.reset()


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load average of 0 for commands run in-process: `run` warns once when the machine's load exceeds its usable
    cores, and a loaded test machine (pytest's own workers) must not add that line to the output tests compare. The
    contention tests set their own load over this one."""
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for the test even where a run before it set more (small matrices: a second thread only
    adds overhead, and stalls on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cli():
    """Invoke the real Typer app in-process; returns click's Result (stdout and stderr separate)."""
    return invoke
