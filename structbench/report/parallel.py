"""Map a function over tasks in forked worker processes where that pays, else in this process.

For CPU-bound Python work that holds the GIL (drawing figures with matplotlib), where threads do not help.
Forked workers start in milliseconds and share the parent's memory; tasks are small keys and only results
travel back. It pays only for tasks of a second or more: for many small ones (reading Parquet files was
measured) the copy-on-write and pickling overhead eats the gain, and threads do better where the work
releases the GIL (cached_read.py reads on threads). Where fork is unavailable (not Linux),
with one core, with fewer than `min_tasks` tasks, or if the pool fails, the function runs here: the
results are the same either way.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

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


def fork_map(fn: Callable[[T], R], tasks: Sequence[T], min_tasks: int, workers: int | None = None) -> list[R]:
    """[fn(t) for t in tasks], in forked processes when `workers` (default: the usable cores) is above 1."""
    count = workers_for(len(tasks), min_tasks) if workers is None else workers
    if count > 1:
        try:
            with ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("fork")) as pool:
                return list(pool.map(fn, tasks))
        except (BrokenProcessPool, OSError):
            pass
    return [fn(task) for task in tasks]
