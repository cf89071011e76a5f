"""Map a function over tasks in forked worker processes where that pays, else in this process.

For CPU-bound Python work that holds the GIL (drawing figures with matplotlib), where threads do not help.
Forked workers start in milliseconds and share the parent's memory; tasks are small keys and only results
travel back. It pays only for tasks of a second or more: for many small ones (reading Parquet files was
measured) the copy-on-write and pickling overhead eats the gain, and threads do better where the work
releases the GIL (cached_read.py reads on threads). Where fork is unavailable (not Linux),
with one core, with fewer than `min_tasks` tasks, or if the pool fails, the function runs here: the
results are the same either way. `fork_start` hands the tasks to the workers and returns at once, so that this process
can do other work while they run (`Pending.results` collects them).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Generic, TypeVar

MAX_WORKERS = 8
T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    """The cores this process may run on, at most MAX_WORKERS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, MAX_WORKERS))


def workers_for(tasks: int, min_tasks: int) -> int:
    if not sys.platform.startswith("linux") or tasks < min_tasks:
        return 1
    return min(usable_cores(), tasks)


class Pending(Generic[T, R]):
    """Tasks handed to forked workers (or, without workers, run here when their results are asked for)."""

    def __init__(self, fn: Callable[[T], R], tasks: Sequence[T], count: int) -> None:
        self._fn, self._tasks = fn, list(tasks)
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Future[R]] = []
        if count > 1:
            try:
                self._pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork"))
                self._futures = [self._pool.submit(fn, task) for task in self._tasks]
            except (BrokenProcessPool, OSError):
                self._close()

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self._pool, self._futures = None, []

    def results(self) -> list[R]:
        """[fn(t) for t in tasks], in the tasks' order (run here for any the workers could not finish)."""
        try:
            if self._futures:
                return [future.result() for future in self._futures]
        except (BrokenProcessPool, OSError):
            pass
        finally:
            self._close()
        return [self._fn(task) for task in self._tasks]


def fork_start(fn: Callable[[T], R], tasks: Sequence[T], min_tasks: int, workers: int | None = None) -> Pending[T, R]:
    """Start [fn(t) for t in tasks] in forked processes when `workers` (default: the usable cores) is above 1."""
    return Pending(fn, tasks, workers_for(len(tasks), min_tasks) if workers is None else workers)
