"""Typeset the report's terminal text while the report is built: each suite's tables and sweeps are handed to forked
workers (parallel.py) as soon as the suite is built (`Typesetting` listens to build.build_report), so that on a
machine of two cores the second lays out rich tables while the first builds the next suites. Rich spends about as
long laying out a 5,000-run report's tables as the report takes to build. The suite's notes, which the build may
still change after the suite is handed over (build.SuiteListener), and the cross-suite section are typeset here. A
worker's console is a copy of this process's (`ConsoleLook`), so the text is the one `terminal.print_report` prints.

The objects that exist when the workers are forked (the runs read and the suites built) are frozen out of the
garbage collector until the text is done (parallel.py): the workers' collections do not walk them (and copy the pages
they sit on), nor do this process's while it builds the other suites. On the 5,000-run store (2 cores, four
alternated runs each), the command's CPU, its workers' included, was a median 6.6 s without the freeze and 5.9 s with
it, against about 5.5 s for laying the text out in this process.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console

from structbench.report.build import Report, SuiteReport
from structbench.report.parallel import HoldsWorkers, Workers, workers_for
from structbench.report.views import terminal

MIN_SUITES_FOR_WORKERS = 4
"""Suites below which the text is typeset here: a suite's tables take about 0.1-0.2 s at 500 runs a suite, and the
first suite's fork and pickling cost some tens of milliseconds."""


@dataclass(frozen=True)
class ConsoleLook:
    """What a console's text depends on, to typeset it the same in another process."""

    width: int
    color_system: str | None
    is_terminal: bool
    no_color: bool

    @classmethod
    def of(cls, console: Console) -> ConsoleLook:
        return cls(console.width, console.color_system, console.is_terminal, console.no_color)

    def console(self) -> Console:
        """A console of this look whose text is only captured."""
        return Console(
            file=io.StringIO(),
            width=self.width,
            color_system=self.color_system,  # type: ignore[arg-type]
            force_terminal=self.is_terminal,
            no_color=self.no_color,
        )


TypesetTask = tuple[ConsoleLook, SuiteReport]


def _typeset_suite(task: TypesetTask) -> tuple[str, str]:
    """A suite's head (rule and tables) and its sweeps, as `task`'s console prints them."""
    look, suite = task
    console = look.console()
    with console.capture() as head:
        terminal.print_suite_head(console, suite)
    with console.capture() as sweeps:
        terminal.print_sweeps(console, suite)
    return head.get(), sweeps.get()


class Typesetting(HoldsWorkers):
    """A report's terminal text, typeset suite by suite as build.build_report builds the suites (a
    build.SuiteListener)."""

    def __init__(self, console: Console, workers: int | None = None) -> None:
        """`console`: the one the text is for; `workers`: processes (default from the cores and the number of
        suites)."""
        self._console, self._look, self._asked = console, ConsoleLook.of(console), workers
        self._workers: Workers[TypesetTask, tuple[str, str]] = Workers(_typeset_suite, 1)

    def begin(self, suites: int, optims: Sequence[str]) -> None:
        count = workers_for(suites, MIN_SUITES_FOR_WORKERS) if self._asked is None else self._asked
        self._workers = Workers(_typeset_suite, count)

    def built(self, index: int, suite: SuiteReport) -> None:
        self._workers.add((self._look, suite))

    def text(self, report: Report) -> str:
        """The terminal text of `report` (whose suites were built with this typesetting listening): what
        terminal.print_report prints. Typesets the rest here, waits for the workers and closes them."""
        console = self._console
        with console.capture() as across:
            terminal.print_across(console, report)
        parts = self._workers.results()
        text = []
        for suite, (head, sweeps) in zip(report.suites, parts, strict=True):
            with console.capture() as notes:
                terminal.print_suite_notes(console, suite)
            text += [head, notes.get(), sweeps]
        return "".join(text) + across.get()
