"""Draw the report's figures: reuse the figures of a suite (and the cross-suite ones) from the figure cache when
their data did not change, and draw the rest in forked workers (parallel.py) when there are enough suites to pay for
it; forking shares the assembled report with the workers without copying it, and only the PNG bytes travel back.
`start_figures` returns as soon as the workers are started, so that the report's text can be written while they draw
(`Drawing.figures` waits for them). A suite's figures are drawn in parts (plots.SUITE_PARTS) and the short
cross-suite task goes last, so that the workers end at about the same time. While figures are drawn, the objects
that exist before (the report, some hundred thousand at 5,000 runs) are frozen out of the garbage collector
(gc.freeze): the collections that drawing triggers do not walk them again, and a forked worker does not copy the
memory pages they sit on. The plotting module (and matplotlib's drawing machinery) is loaded only when something is
drawn.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
from collections.abc import Mapping

from structbench.report import figure_cache
from structbench.report.build import Report
from structbench.report.figure_file import FigureFile, Look, optimizer_looks
from structbench.report.parallel import Pending, fork_start, workers_for

MIN_TASKS_FOR_WORKERS = 4
ACROSS = -1
"""The task (and cache slot) of the cross-suite figures; task i >= 0 is suite i."""

_shared: tuple[Report, dict[str, Look]] | None = None


def _draw(job: tuple[int, int]) -> list[FigureFile]:
    """The figures of one task (ACROSS or a suite's index), or of one part of a suite's (plots.SUITE_PARTS). Reads
    the report the parent shared by forking."""
    from structbench.report import plots

    assert _shared is not None
    report, looks = _shared
    task, part = job
    if task == ACROSS:
        return plots.cross_suite_figures(report, looks)
    return plots.suite_figures(report.suites[task], looks, part)


def _cache_slot(report: Report, task: int, looks: Mapping[str, Look]) -> tuple[str, str, dict[str, Look]]:
    """(name, digest, the looks drawn) under which the task's figures are cached; the cross-suite figures' digest
    covers every suite's and which suites the aggregates leave out."""
    if task == ACROSS:
        lines = [f"{s.name}\t{s.digest}" for s in report.suites] + [f"left out\t{name}" for name in report.left_out]
        return figure_cache.ACROSS, hashlib.sha256("\n".join(lines).encode()).hexdigest(), dict(looks)
    suite = report.suites[task]
    return suite.name, suite.digest, {o: looks[o] for o in suite.selected}


class Drawing:
    """The figures of a report, some perhaps still being drawn by forked workers."""

    def __init__(self, report: Report, workers: int | None, cache: bool) -> None:
        global _shared
        self._report, self._cache = report, cache
        looks = optimizer_looks(report.optims)
        self._tasks = [ACROSS, *range(len(report.suites))]
        self._slots = {task: _cache_slot(report, task, looks) for task in self._tasks}
        self._found = {t: figure_cache.load(report.out, *self._slots[t]) if cache else None for t in self._tasks}
        missing = [task for task in [*self._tasks[1:], ACROSS] if self._found[task] is None]
        self._jobs: list[tuple[int, int]] = []
        self._pending: Pending[tuple[int, int], list[FigureFile]] | None = None
        if missing:
            # Loaded once here, before forking, rather than in each worker.
            parts = importlib.import_module("structbench.report.plots").SUITE_PARTS
            self._jobs = [(task, part) for task in missing for part in range(1 if task == ACROSS else parts)]
            count = workers_for(len(missing), MIN_TASKS_FOR_WORKERS) if workers is None else workers
            _shared = (report, looks)
            gc.freeze()  # the report's objects: never traversed again by the collections drawing triggers (nor copied)
            try:
                self._pending = fork_start(_draw, self._jobs, MIN_TASKS_FOR_WORKERS, count)
            except BaseException:
                self._release()
                raise

    @staticmethod
    def _release() -> None:
        global _shared
        gc.unfreeze()
        _shared = None

    def figures(self) -> list[FigureFile]:
        """Every figure: cross-suite first, then suite by suite (waits for the workers; call once)."""
        if self._pending is not None:
            try:
                drawn = self._pending.results()
            finally:
                self._pending = None
                self._release()
            for (task, _), figures in zip(self._jobs, drawn, strict=True):
                self._found[task] = [*(self._found[task] or []), *figures]
            if self._cache:
                for task in dict.fromkeys(task for task, _ in self._jobs):
                    figure_cache.store(self._report.out, *self._slots[task], self._found[task] or [])
        return [f for task in self._tasks for f in self._found[task] or []]


def start_figures(report: Report, workers: int | None = None, cache: bool = True) -> Drawing:
    """Take the report's figures from the cache and start drawing the others (`workers`: processes; default from the
    cores), in forked workers where that pays; `Drawing.figures` hands them over."""
    return Drawing(report, workers, cache)


def render_figures(report: Report, workers: int | None = None, cache: bool = True) -> list[FigureFile]:
    """Every figure: cross-suite first, then suite by suite (`workers`: processes; default from the cores)."""
    return start_figures(report, workers, cache).figures()
