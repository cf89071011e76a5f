"""Draw the report's figures: reuse the figures of a suite (and the cross-suite ones) from the figure cache when
their data did not change, and draw the rest suite by suite in forked workers (parallel.py) when there are enough
suites to pay for it; forking shares the assembled report with the workers without copying it, and only the PNG
bytes travel back. While figures are drawn, the objects that exist before (the report, some hundred thousand at
5,000 runs) are frozen out of the garbage collector (gc.freeze): the collections that drawing triggers do not walk
them again, and a forked worker does not copy the memory pages they sit on. The plotting module (and matplotlib's
drawing machinery) is loaded only when something is drawn.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
from collections.abc import Mapping

from structbench.report import figure_cache
from structbench.report.build import Report
from structbench.report.figure_file import FigureFile, Look, optimizer_looks
from structbench.report.parallel import fork_map

MIN_TASKS_FOR_WORKERS = 4
ACROSS = -1
"""The task (and cache slot) of the cross-suite figures; task i >= 0 is suite i."""

_shared: tuple[Report, dict[str, Look]] | None = None


def _draw(task: int) -> list[FigureFile]:
    """The figures of one task (ACROSS or a suite's index). Reads the report the parent shared by forking."""
    from structbench.report import plots

    assert _shared is not None
    report, looks = _shared
    if task == ACROSS:
        return plots.cross_suite_figures(report, looks)
    return plots.suite_figures(report.suites[task], looks)


def _cache_slot(report: Report, task: int, looks: Mapping[str, Look]) -> tuple[str, str, dict[str, Look]]:
    """(name, digest, the looks drawn) under which the task's figures are cached; the cross-suite figures' digest
    covers every suite's and which suites the aggregates leave out."""
    if task == ACROSS:
        lines = [f"{s.name}\t{s.digest}" for s in report.suites] + [f"left out\t{name}" for name in report.left_out]
        return figure_cache.ACROSS, hashlib.sha256("\n".join(lines).encode()).hexdigest(), dict(looks)
    suite = report.suites[task]
    return suite.name, suite.digest, {o: looks[o] for o in suite.selected}


def render_figures(report: Report, workers: int | None = None, cache: bool = True) -> list[FigureFile]:
    """Every figure: cross-suite first, then suite by suite (`workers`: processes; default from the cores)."""
    global _shared
    looks = optimizer_looks(report.optims)
    tasks = [ACROSS, *range(len(report.suites))]
    slots = {task: _cache_slot(report, task, looks) for task in tasks}
    found = {task: figure_cache.load(report.out, *slots[task]) if cache else None for task in tasks}
    missing = [task for task in tasks if found[task] is None]
    if missing:
        importlib.import_module("structbench.report.plots")  # once here, before forking, rather than in each worker
        _shared = (report, looks)
        gc.freeze()  # the report's objects: never traversed again by the collections drawing triggers (nor copied)
        try:
            drawn = fork_map(_draw, missing, MIN_TASKS_FOR_WORKERS, workers)
        finally:
            gc.unfreeze()
            _shared = None
        for task, figures in zip(missing, drawn, strict=True):
            found[task] = figures
            if cache:
                figure_cache.store(report.out, *slots[task], figures)
    return [f for task in tasks for f in found[task] or []]
