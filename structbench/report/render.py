"""Draw the report's figures: reuse a suite's cached figures when its data did not change, and draw the
rest suite by suite in forked workers (parallel.py) when there are enough suites to pay for it; forking
shares the assembled report with the workers without copying it, and only the PNG bytes travel back.
"""

from __future__ import annotations

from structbench.report import figure_cache
from structbench.report.build import Report
from structbench.report.parallel import fork_map
from structbench.report.plots import FigureFile, cross_suite_figures, optimizer_colors, suite_figures

MIN_TASKS_FOR_WORKERS = 4

_shared: tuple[Report, dict[str, tuple[float, ...]]] | None = None


def _draw(task: int) -> list[FigureFile]:
    """Task -1: the cross-suite figures; task i: suite i's. Reads the report the parent shared by forking."""
    assert _shared is not None
    report, colors = _shared
    return cross_suite_figures(report, colors) if task < 0 else suite_figures(report.suites[task], colors)


def render_figures(report: Report, workers: int | None = None, cache: bool = True) -> list[FigureFile]:
    """Every figure: cross-suite first, then suite by suite (`workers`: processes; default from the cores)."""
    global _shared
    colors = optimizer_colors(report.optims)
    by_suite = {i: (figure_cache.load(report.out, s, colors) if cache else None) for i, s in enumerate(report.suites)}
    missing = [i for i, figures in by_suite.items() if figures is None]
    _shared = (report, colors)
    try:
        drawn = fork_map(_draw, [-1, *missing], MIN_TASKS_FOR_WORKERS, workers)
    finally:
        _shared = None
    for i, figures in zip(missing, drawn[1:], strict=True):
        by_suite[i] = figures
        if cache:
            figure_cache.store(report.out, report.suites[i], colors, figures)
    return [*drawn[0], *(f for i in range(len(report.suites)) for f in by_suite[i] or [])]
