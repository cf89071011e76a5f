"""Run a function over tasks handed over one by one, in forked worker processes where that pays, else in this process.

For CPU-bound Python work that holds the GIL (drawing figures with matplotlib), where threads do not help. The
workers are forked when the first task is handed over, so that they start working while this process goes on
producing the next tasks (the report draws a suite's figures while it builds the next suite); each task is pickled to
a worker and each result pickled back. It pays only for tasks of a second or more: for many small ones (reading
Parquet files was measured) the pickling overhead eats the gain, and threads do better where the work releases the
GIL (cached_read.py reads on threads). Where fork is unavailable (not Linux), with one core, with fewer than
`min_tasks` tasks expected, or if the pool fails, the function runs here when the results are asked for: the results
are the same either way. A worker ends with the process that forked it, however that process ends (a signal, kill -9):
Linux sends it SIGTERM then (prctl PR_SET_PDEATHSIG), so an interrupted report leaves no worker behind.

When the workers are forked, every object that exists then is frozen out of the garbage collector (gc.freeze) until
they are closed: the collections that the work triggers, in the workers and here, do not walk the objects read before
(some hundred thousand at 5,000 runs), and a worker does not copy the memory pages they sit on. Freezes are counted
(`structbench.heap`): two pools may be open together (a report of every format draws figures and typesets text).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, Self, TypeVar

from structbench import environment, heap

MAX_WORKERS = 8
PR_SET_PDEATHSIG = 1
"""prctl(2): the signal a process receives when the thread that forked it ends."""
T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    """The cores this process may run on (environment.usable_cores), at most MAX_WORKERS."""
    return max(1, min(environment.usable_cores(), MAX_WORKERS))


def workers_for(tasks: int, min_tasks: int) -> int:
    if not sys.platform.startswith("linux") or tasks < min_tasks:
        return 1
    return min(usable_cores(), tasks)


def _end_with(parent: int) -> None:
    """In a worker: be sent SIGTERM when the parent ends; end now if it already has (it may end before this runs)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


class Workers(Generic[T, R]):
    """[fn(t) for t in the tasks added], run by `count` forked processes (forked when the first task is added, with
    what exists then frozen until `close`) or, with a count of 1 or a pool that failed, here when the results are asked
    for."""

    def __init__(self, fn: Callable[[T], R], count: int) -> None:
        self._fn, self._count = fn, count
        self._tasks: list[T] = []
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Future[R]] = []
        self._failed = False
        self._frozen = False

    @property
    def forked(self) -> bool:
        """Whether the tasks go to worker processes."""
        return self._count > 1 and not self._failed

    def add(self, task: T) -> None:
        self._tasks.append(task)
        if not self.forked:
            return
        try:
            if self._pool is None:
                heap.freeze()
                self._frozen = True
                self._pool = ProcessPoolExecutor(
                    self._count,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=_end_with,
                    initargs=(os.getpid(),),
                )
            self._futures.append(self._pool.submit(self._fn, task))
        except (BrokenProcessPool, OSError):
            self._failed = True
            self.close()

    def close(self) -> None:
        """Stop the workers (tasks not started are dropped) and thaw their freeze; safe to call more than once."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self._pool, self._futures = None, []
        if self._frozen:
            heap.thaw()
            self._frozen = False

    def results(self) -> list[R]:
        """fn(t) for every task added, in the order added (run here for any the workers could not finish)."""
        try:
            if self._futures:  # every task went to the workers (a failed pool drops them all: close)
                return [future.result() for future in self._futures]
        except (BrokenProcessPool, OSError):
            pass
        finally:
            self.close()
        return [self._fn(task) for task in self._tasks]


class HoldsWorkers:
    """Base of an object that keeps its forked workers in `_workers` (the report's figure drawing and text
    typesetting): `close`, or the end of a with block, stops them."""

    _workers: Workers[Any, Any]

    def close(self) -> None:
        """Stop the workers (safe to call more than once)."""
        self._workers.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
