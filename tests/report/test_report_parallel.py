"""The report's forked workers (structbench.report.parallel): what exists when they fork is frozen out of the garbage
collector until they close, and freezes are counted, so one pool closing leaves another's freeze in place."""

import gc
import multiprocessing
import operator

import pytest

from structbench import heap
from structbench.report import parallel


@pytest.fixture
def forks_seen(monkeypatch):
    """The freeze count at each making of a process pool, which forks the workers when it is first given a task."""
    seen: list[int] = []
    pool = parallel.ProcessPoolExecutor

    def recording(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return pool(*args, **kwargs)

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", recording)
    return seen


def test_what_exists_when_workers_fork_is_frozen_until_they_close(forks_seen):
    assert gc.get_freeze_count() == 0
    workers = parallel.Workers(operator.neg, 2)
    workers.add(1)
    workers.add(2)
    assert forks_seen and forks_seen[0] > 0 and len(forks_seen) == 1
    assert workers.results() == [-1, -2]
    assert gc.get_freeze_count() == 0 and multiprocessing.active_children() == []


def test_one_pool_closing_leaves_the_others_freeze(forks_seen):
    """Two pools open at once (a report of every format: figures and text); the first to close must not give back what
    the second froze (gc.unfreeze gives back everything at once), nor the second what a caller of `freeze` holds."""
    heap.freeze()
    figures, text = parallel.Workers(operator.neg, 2), parallel.Workers(abs, 2)
    figures.add(3)
    text.add(-4)
    assert len(forks_seen) == 2
    assert text.results() == [4]
    assert gc.get_freeze_count() > 0
    assert figures.results() == [-3]
    assert gc.get_freeze_count() > 0
    heap.thaw()
    assert gc.get_freeze_count() == 0 and multiprocessing.active_children() == []


def test_work_done_here_freezes_nothing(forks_seen):
    workers = parallel.Workers(operator.neg, 1)
    workers.add(5)
    assert gc.get_freeze_count() == 0 and not forks_seen
    assert workers.results() == [-5]
    workers.close()
    assert gc.get_freeze_count() == 0
