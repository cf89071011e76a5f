"""The local executor: a `concurrent.futures.ProcessPoolExecutor` of N workers, each run in a fresh process
(`max_tasks_per_child=1`) so a CPU run's peak RSS is its own, with torch's threads divided among the workers.

submitit's local executor is not used: it starts every job of a grid at once and has no cap on how many run together,
which would oversubscribe the cores; capping it would mean writing a queue of our own. Workers fork from a server
process that has imported torch already (`forkserver` with a preload), so a run does not pay torch's import.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import psutil

from structbench.data.checksums import show_checksum_warnings_as_lines
from structbench.environment import usable_cores
from structbench.execution.job import Finished, Job, one_line, run_job


def threads_per_worker(jobs: int) -> int:
    """torch threads for each of `jobs` processes sharing this process's cores."""
    return max(1, usable_cores() // jobs)


def start_worker_server() -> multiprocessing.context.BaseContext:
    """Start the server process local workers fork from, importing torch and the runner there, without waiting:
    called first thing, its imports overlap with this process's own."""
    from multiprocessing import forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["structbench.execution.job", "structbench.execution.runner"])
    forkserver.ensure_running()
    return context


WORKER_ATTEMPTS = 3
"""How often a run is started on a fresh pool after its worker pool broke (a worker killed, e.g. by the kernel's
out-of-memory killer, or crashed) before it is reported as failed."""


def run_local(jobs: Sequence[Job], workers: int) -> Iterator[Finished]:
    """Run `jobs` on `workers` fresh worker processes; yield each as it finishes.

    On a signal (Ctrl-C, SIGTERM) the runs not started are cancelled, the signal is passed on to the workers (a
    terminal's Ctrl-C reaches them anyway; a SIGTERM sent to this process alone does not), and this waits until each
    has stored its interrupted run. A worker that raised StoreWriteError is yielded with `fatal` set. When a worker
    dies, Python's pool fails every run not yet finished (and stops the other workers, which store their runs as
    interrupted): those runs start again on a new pool, each at most WORKER_ATTEMPTS times in all.
    """
    from structbench.execution import signals

    attempts: Counter[str] = Counter()
    remaining = list(jobs)
    while remaining:
        broken: list[Job] = []
        for finished in _run_pool(remaining, workers):
            if finished.worker_died:
                attempts[finished.job.cell.key] += 1
                if attempts[finished.job.cell.key] < WORKER_ATTEMPTS:
                    broken.append(finished.job)
                    continue
                finished.failure = f"its worker process died {WORKER_ATTEMPTS} times (killed, e.g. out of memory?)"
            yield finished
        remaining = broken if signals.received() is None else []


def _run_pool(jobs: Sequence[Job], workers: int) -> Iterator[Finished]:
    from structbench.errors import StoreWriteError
    from structbench.execution import signals

    context = start_worker_server()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, max_tasks_per_child=1)
    futures: dict[Future[dict[str, Any]], Job] = {pool.submit(run_worker_job, job, os.getpid()): job for job in jobs}
    try:
        for future in as_completed(futures):
            job = futures[future]
            error = future.exception()
            if error is None:
                yield Finished.of(job, future.result())
            elif isinstance(error, StoreWriteError):
                yield Finished(job, None, str(error), fatal=True)
            elif isinstance(error, BrokenProcessPool):
                yield Finished(job, None, one_line(error), worker_died=True)
            else:
                yield Finished(job, None, one_line(error))
    finally:
        for future in futures:
            future.cancel()
        signum = signals.received()
        if signum is not None:
            forward_to_workers(signum)
        with signals.armed(False):
            pool.shutdown(wait=True, cancel_futures=True)


def run_worker_job(job: Job, command_pid: int) -> dict[str, Any]:
    """`run_job` in a pool worker that dies with the command that submitted it: a worker whose command is gone (kill
    -9) must not store a run the command will never report, and that a new command may be running again meanwhile.

    The worker is not the command's child (the forkserver is its parent, and stays up while any worker does), so no
    parent-death signal tells it; a thread waits for the command's exit instead and kills the worker at once."""
    threading.Thread(target=_die_with, args=(command_pid,), name="command-watch", daemon=True).start()
    show_checksum_warnings_as_lines()
    return run_job(job)


def _die_with(pid: int) -> None:
    """Wait for process `pid` to end (already gone: at once), then SIGKILL this process."""
    with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
        _wait_for_exit(pid)
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_exit(pid: int) -> None:
    """Block until `pid` ends: on a pidfd where the kernel has them (Linux 5.3; woken only by the exit), else by
    psutil's polling (every 40 ms at most)."""
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError) as exc:
        if isinstance(exc, ProcessLookupError):
            raise
        psutil.Process(pid).wait()
        return
    try:
        select.select([handle], [], [])
    finally:
        os.close(handle)


def forward_to_workers(signum: int) -> None:
    """Send `signum` to the pool's worker processes: the grandchildren of this process (its children are the
    forkserver and multiprocessing's resource tracker, which the workers fork from or talk to)."""
    for child in psutil.Process().children():
        for worker in child.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.send_signal(signum)
