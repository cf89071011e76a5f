"""Draw the report's figures while the report is built: each suite's figures are taken from the figure cache when
their data did not change, or else handed, in parts of about equal drawing time (plots.SUITE_PARTS), to forked
workers (parallel.py) as soon as the suite is built (`Drawing` listens to build.build_report), so that on a machine
of two cores the second draws while the first builds the next suites and then lays out the report's text. The
cross-suite figures need the whole report: they are drawn here once the report's text is laid out (`Drawing.figures`),
while the workers finish. A task is a suite (pickled to the worker) and a part; only the PNG bytes come back.

While figures are drawn, the objects that exist when the workers are forked (the runs and curves read) are frozen
out of the garbage collector (parallel.py); drawing here freezes the whole report the same way. The plotting module
(and matplotlib's drawing machinery) is loaded only when something is drawn, once before the workers are forked
rather than in each.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from structbench.heap import freeze, thaw
from structbench.report.build import Report, SuiteReport
from structbench.report.figures import figure_cache
from structbench.report.figures.figure_file import FigureFile, Look, optimizer_looks
from structbench.report.parallel import HoldsWorkers, Workers, workers_for

MIN_TASKS_FOR_WORKERS = 4
"""Suites plus the cross-suite task below which the figures are drawn here."""

DrawTask = tuple[SuiteReport, dict[str, Look], int]


def _draw(task: DrawTask) -> list[FigureFile]:
    """Part `part` of a suite's figures, in its optimizers' looks."""
    from structbench.report.figures import plots

    suite, looks, part = task
    return plots.suite_figures(suite, looks, part)


def _across_slot(report: Report, looks: Mapping[str, Look]) -> tuple[str, str, dict[str, Look]]:
    """(name, digest, looks) under which the cross-suite figures are cached: the digest covers every suite's and which
    suites the aggregates leave out."""
    left_out = (*report.left_out, *report.without_ok)
    lines = [f"{s.name}\t{s.digest}" for s in report.suites] + [f"left out\t{name}" for name in left_out]
    return figure_cache.ACROSS, hashlib.sha256("\n".join(lines).encode()).hexdigest(), dict(looks)


class Drawing(HoldsWorkers):
    """A report's figures, drawn suite by suite as build.build_report builds the suites (a build.SuiteListener)."""

    def __init__(self, out: Path, workers: int | None = None, cache: bool = True) -> None:
        """`out`: the store whose figure cache is used (the report's first); `workers`: processes (default from the
        cores and the number of suites); `cache`: whether to use the figure cache."""
        self._out, self._asked, self._cache = out, workers, cache
        self._looks: dict[str, Look] = {}
        self._workers: Workers[DrawTask, list[FigureFile]] = Workers(_draw, 1)
        self._suites: list[tuple[str, str, dict[str, Look]]] = []
        self._found: list[list[FigureFile]] = []
        self._jobs: list[int] = []
        """The suite of each task handed to the workers, in order."""

    def begin(self, suites: int, optims: Sequence[str]) -> None:
        self._looks = optimizer_looks(optims)
        count = workers_for(suites + 1, MIN_TASKS_FOR_WORKERS) if self._asked is None else self._asked
        self._workers = Workers(_draw, count)

    def built(self, index: int, suite: SuiteReport) -> None:
        slot = suite.name, suite.digest, {o: self._looks[o] for o in suite.selected}
        self._suites.append(slot)
        cached = figure_cache.load(self._out, *slot) if self._cache else None
        self._found.append(cached or [])
        if cached is not None:
            return
        parts = importlib.import_module("structbench.report.figures.plots").SUITE_PARTS
        for part in range(parts):
            self._jobs.append(index)
            self._workers.add((suite, slot[2], part))

    def figures(self, report: Report) -> list[FigureFile]:
        """Every figure of `report` (whose suites were built with this drawing listening): cross-suite first, then
        suite by suite. Draws what is left here, waits for the workers and closes them."""
        freeze()  # the whole report now, for what is drawn here
        try:
            across_slot = _across_slot(report, self._looks)
            across = figure_cache.load(self._out, *across_slot) if self._cache else None
            if across is None:
                plots = importlib.import_module("structbench.report.figures.plots")
                across = plots.cross_suite_figures(report, self._looks)
                if self._cache:
                    figure_cache.store(self._out, *across_slot, across)
            for index, figures in zip(self._jobs, self._workers.results(), strict=True):
                self._found[index] += figures
        finally:
            self.close()
            thaw()
        if self._cache:
            for index in dict.fromkeys(self._jobs):
                figure_cache.store(self._out, *self._suites[index], self._found[index])
        return [*across, *(f for figures in self._found for f in figures)]


def render_figures(report: Report, workers: int | None = None, cache: bool = True) -> list[FigureFile]:
    """Every figure of a report already built: cross-suite first, then suite by suite (`workers`: processes; default
    from the cores)."""
    drawing = Drawing(report.out, workers, cache)
    drawing.begin(len(report.suites), report.optims)
    for index, suite in enumerate(report.suites):
        drawing.built(index, suite)
    return drawing.figures(report)
