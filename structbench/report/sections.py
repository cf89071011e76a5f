"""The report's tables in the order every writer shows them: ACROSS (the cross-suite section) and PER_SUITE (each
suite's section, before its notes, figures and sweeps).

The terminal, Markdown and HTML writers walk these lists and render each table in their own form, with the heading
and anchor the table model carries (tables.Table's title and key), so a new table is its function in
views/tables.py and its entry here. A section whose table is None for a report or a suite is left out there. A
folded section (one with a `summary`) is shown collapsed under that line in Markdown and HTML, and left out of the
terminal, which cannot fold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from structbench.report.build import Report, SuiteReport
from structbench.report.views import tables

Part = TypeVar("Part", Report, SuiteReport)
"""What a section's table is built from: the whole report (ACROSS) or one suite (PER_SUITE)."""


@dataclass(frozen=True)
class Section(Generic[Part]):
    """One table of the report: `table` builds it, or returns None where there is nothing to show."""

    table: Callable[[Part], tables.Table | None]
    summary: Callable[[Part], str] | None = None
    """The line a folded section is collapsed under in Markdown and HTML (where its table's key is the anchor of the
    folded block); None for a table shown open everywhere."""


def time_profile(report: Report) -> tables.Table | None:
    """The performance profile on time to target, when some suite has a target."""
    return None if report.profile_seconds is None else tables.profile_table(report.profile_seconds, "time")


def steps_profile(report: Report) -> tables.Table | None:
    """The performance profile on steps to target, when some suite has a target."""
    return None if report.profile_steps is None else tables.profile_table(report.profile_steps, "steps")


def every_setting(suite: SuiteReport) -> tables.Table | None:
    """Every setting the suite's optimizers ran, when some optimizer ran under more than one."""
    return tables.suite_table(suite, every_setting=True) if len(suite.variants) > len(suite.selected) else None


def every_setting_summary(suite: SuiteReport) -> str:
    return f"Every setting ({len(suite.variants)})"


def shown(listed: Sequence[Section[Part]], part: Part, foldable: bool = True) -> list[tuple[tables.Table, str | None]]:
    """The tables the `listed` sections show for `part`, in order, each with the line it is folded under (None: shown
    open). A writer that cannot fold (not `foldable`) gets the open ones only."""
    tables_shown = []
    for section in listed:
        if section.summary is not None and not foldable:
            continue
        table = section.table(part)
        if table is not None:
            tables_shown.append((table, None if section.summary is None else section.summary(part)))
    return tables_shown


ACROSS: tuple[Section[Report], ...] = (
    Section(time_profile),
    Section(steps_profile),
    Section(tables.rank_table),
    Section(tables.experiment_table),
)

PER_SUITE: tuple[Section[SuiteReport], ...] = (
    Section(tables.suite_table),
    Section(every_setting, summary=every_setting_summary),
    Section(tables.comparison_table),
    Section(tables.failure_table),
)
