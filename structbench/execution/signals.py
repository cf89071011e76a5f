"""How a process that trains and stores runs reacts to SIGINT, SIGTERM and, on Slurm, the time-limit warning.

A signal interrupts work only inside an `armed()` region (training, waiting on workers); anywhere else — above all
while a finished run is being stored — it is recorded and honoured at the next `armed()` entry or by the caller
checking `received()` between runs. Only the first signal interrupts: a second Ctrl-C while the interrupted run is
being stored is recorded and otherwise ignored, so the write completes.

SIGUSR2 is what submitit asks Slurm to send 90 s before a job's time limit (or when the job is preempted); a run
interrupted by it ends `timeout` when the job is that close to its limit, else `interrupted`.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)
SLURM_WARNING = signal.SIGUSR2
SUBMITIT_WARNING_S = 90.0
"""How long before a job's time limit submitit asks Slurm for SIGUSR2 (its default `slurm_signal_delay_s`)."""
SLURM_WARNING_MARGIN_S = 2 * SUBMITIT_WARNING_S
"""A SIGUSR2 this close to the job's time limit (twice submitit's warning delay) means the limit."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; `timed_out` when the signal was the cluster's time-limit warning."""

    def __init__(self, signum: int, timed_out: bool = False) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.timed_out = timed_out


@dataclass
class _State:
    armed: bool = False
    received: int | None = None
    raised: bool = False
    started: float = 0.0
    time_limit_s: float | None = None


_state = _State()


def install(time_limit_s: float | None = None) -> None:
    """Handle SIGINT and SIGTERM (and SIGUSR2 when the job has a cluster time limit) in this process.

    Must be called from the main thread; a call from another thread does nothing (signals reach the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    _state.started = time.monotonic()
    _state.time_limit_s = time_limit_s
    for signum in HANDLED:
        signal.signal(signum, _on_signal)
    if time_limit_s is not None:
        signal.signal(SLURM_WARNING, _on_signal)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _state.received is None:
        _state.received = signum
    if _state.armed and not _state.raised:
        _state.raised = True
        raise _interruption(signum)


def _interruption(signum: int) -> Interrupted:
    limit = _state.time_limit_s
    near_limit = limit is not None and time.monotonic() - _state.started >= limit - SLURM_WARNING_MARGIN_S
    return Interrupted(signum, timed_out=signum == SLURM_WARNING and near_limit)


@contextmanager
def armed(on: bool = True) -> Iterator[None]:
    """Inside, the first signal raises `Interrupted` (`on=False`: signals are only recorded, e.g. while storing).

    Entering an armed region after a signal was recorded but not yet acted on raises at once.
    """
    previous = _state.armed
    if on and _state.received is not None and not _state.raised:
        _state.raised = True
        raise _interruption(_state.received)
    _state.armed = on
    try:
        yield
    finally:
        _state.armed = previous


@contextmanager
def deferred() -> Iterator[None]:
    """Inside, signals are only recorded (e.g. while a checkpoint is written); one that arrived is raised on leaving
    when the code around was armed, so the work inside completes and the interruption still happens."""
    previous = _state.armed
    _state.armed = False
    try:
        yield
    finally:
        _state.armed = previous
    if previous and _state.received is not None and not _state.raised:
        _state.raised = True
        raise _interruption(_state.received)


def settle() -> int | None:
    """The end of a command: from here to the process's exit SIGINT and SIGTERM are ignored, so one arriving while
    the interpreter shuts down neither kills the process (late in its shutdown Python puts the default handlers back)
    nor goes unreported. Returns the first signal received before, which the command reports. Main thread only
    (elsewhere it only returns)."""
    if threading.current_thread() is threading.main_thread():
        for signum in HANDLED:
            signal.signal(signum, signal.SIG_IGN)
    return _state.received


def received() -> int | None:
    """The first signal this process received since `install`/`reset`, or None."""
    return _state.received


def reset() -> None:
    """Forget received signals (a new command in the same process, e.g. in tests)."""
    _state.armed, _state.received, _state.raised = False, None, False


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum
