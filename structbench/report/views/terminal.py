"""Rich output for the terminal: the report's tables, and the per-run table `structbench run` prints."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from structbench.inert import inert, inert_markup
from structbench.report import sections
from structbench.report.build import Report, SuiteReport
from structbench.report.views import claims_section, tables
from structbench.report.views.format import fmt_bytes, fmt_num, fmt_seconds

STYLES = {"best": "bold green", "good": "green", "bad": "red", "muted": "dim"}
HOW_TO_READ = (
    "How to read: numbers are medians over seeds, with the min–max below 5 seeds and the 95% bootstrap CI from 5; "
    "best (bold) from 3 seeds. val: the validation split, which selects settings and sets and times targets; test: "
    "reported for the selected setting only. A paired verdict needs 5 seeds (exact Wilcoxon signed-rank p < 0.05 and "
    "a CI that excludes 0); below that it says 'too few seeds'. ⚠: a run with fewer than 3 evaluations, or a time to "
    "target interpolated over more than a quarter of the run. 'untuned here': registry defaults, not a finding. "
    "Profiles and ranks count each optimizer over the suites it ran. --format md or html defines every number."
)


def _inert_cell(cell: tables.Cell) -> tables.Cell:
    """The cell with its text and the line below it made inert; its line breaks stay (they cannot leave the cell)."""
    text, sub = inert(cell.text, keep_newlines=True), inert(cell.sub, keep_newlines=True)
    return cell if (text, sub) == (cell.text, cell.sub) else dataclasses.replace(cell, text=text, sub=sub)


def inert_table(table: tables.Table) -> tables.Table:
    """The table with every text a terminal would show made inert (structbench.inert): its title, caption, column
    names and cells."""
    return dataclasses.replace(
        table,
        title=inert(table.title),
        columns=[dataclasses.replace(column, name=inert(column.name)) for column in table.columns],
        rows=[[_inert_cell(cell) for cell in row] for row in table.rows],
        caption=inert(table.caption),
    )


def _cell(cell: tables.Cell) -> Text:
    text = Text(cell.text, style=STYLES.get(cell.tone, ""))
    if cell.sub:
        text.append("\n" + cell.sub, style="dim")
    return text


COLUMN_COST = 3
"""Characters a rich table spends on each column besides its text: a border and a space either side."""
LABEL_SHARE = 2
"""The first column (the rows' labels) takes at most 1/LABEL_SHARE of the terminal's width; a longer label wraps, so
every part of a split table keeps room for its numbers."""


def _natural_widths(table: tables.Table) -> list[int]:
    """Each column's width with no cell wrapped, in terminal cells: its longest line (header, text or the line below
    it)."""
    return [
        max(
            (
                cell_len(line)
                for text in (column.name, *(part for row in table.rows for part in (row[i].text, row[i].sub) if part))
                for line in text.splitlines()
            ),
            default=1,
        )
        for i, column in enumerate(table.columns)
    ]


def _label_width(natural: list[int], width: int | None) -> int:
    """The first column's width: its unwrapped width, at most 1/LABEL_SHARE of `width` (the terminal's)."""
    return natural[0] if width is None else max(1, min(natural[0], width // LABEL_SHARE))


def _chunks(natural: list[int], columns: list[int], width: int | None) -> list[list[int]]:
    """The group's columns split into runs that fit `width` beside the first column (at its `_label_width`) with no
    cell wrapped (one run when it fits, or without a width); a column wider than that on its own gets a run to
    itself and wraps at spaces. `natural`: every column's width unwrapped."""
    if width is None:
        return [columns]
    room = width - 1 - (_label_width(natural, width) + COLUMN_COST)
    chunks: list[list[int]] = [[]]
    used = 0
    for i in columns:
        need = natural[i] + COLUMN_COST
        if chunks[-1] and used + need > room:
            chunks.append([])
            used = 0
        chunks[-1].append(i)
        used += need
    return chunks


def rich_tables(table: tables.Table, width: int | None = None) -> list[RichTable]:
    """The table as one rich table per column group, each repeating the first column. A group too wide for `width`
    (the terminal's) is split further into tables that fit it unwrapped; only a column too wide on its own wraps (at
    spaces, folding a longer token onto the next line), so a number is never cut short. The columns of a table that
    fits are given their unwrapped widths, the widths rich would measure: rich then does not measure every cell
    again (an eighth of the time it takes to print a large report). Every text is made inert first (`inert_table`),
    so that the widths measured are those of what is printed."""
    table = inert_table(table)
    natural = _natural_widths(table)
    label_width = _label_width(natural, width)
    groups = list(dict.fromkeys(c.group for c in table.columns[1:]))
    parts = [
        (group, chunk)
        for group in groups
        for chunk in _chunks(natural, [i for i, c in enumerate(table.columns) if i and c.group == group], width)
    ]
    rendered = []
    for number, (group, chunk) in enumerate(parts):
        keep = [0, *chunk]
        title = table.title if len(parts) == 1 else f"{table.title} — {group}"
        if sum(1 for g, _ in parts if g == group) > 1:
            title += f" ({[c for g, c in parts if g == group].index(chunk) + 1})"
        out = RichTable(title=inert_markup(title), title_justify="left", show_lines=False)
        widths = [label_width, *(natural[i] for i in chunk)]
        fits = width is not None and 1 + sum(w + COLUMN_COST for w in widths) <= width
        wrapped_label = label_width < natural[0]
        for i, column_width in zip(keep, widths, strict=True):
            column = table.columns[i]
            out.add_column(
                inert_markup(column.name),
                justify="left" if column.left else "right",
                no_wrap=(i == 0 and not wrapped_label) or not column.wrap,
                overflow="fold",
                width=column_width if fits or (i == 0 and wrapped_label) else None,
            )
        for row in table.rows:
            out.add_row(*(_cell(row[i]) for i in keep))
        if table.caption and number == len(parts) - 1:
            out.caption, out.caption_justify = inert_markup(table.caption), "left"
        rendered.append(out)
    return rendered


def print_report(console: Console, report: Report) -> None:
    """Every suite's tables, failures and notes, then the cross-suite profile and ranks."""
    for suite in report.suites:
        print_suite_head(console, suite)
        print_suite_notes(console, suite)
        print_sweeps(console, suite)
    print_across(console, report)


def print_suite_head(console: Console, suite: SuiteReport) -> None:
    """The suite's rule, then its tables (sections.PER_SUITE; the folded ones left out)."""
    console.rule(f"[bold]{inert_markup(suite.name)}[/bold]  {inert_markup(f'({suite.task}, {suite.run_count} runs)')}")
    for table, _ in sections.shown(sections.PER_SUITE, suite, foldable=False):
        print_table(console, table)


def print_suite_notes(console: Console, suite: SuiteReport) -> None:
    for note in suite.notes:
        console.print(Text(f"note: {inert(note)}", style="yellow"))
    if len(suite.variants) > len(suite.selected):
        console.print(Text(f"note: --format md or html lists all {len(suite.variants)} settings.", style="yellow"))


def print_across(console: Console, report: Report) -> None:
    """The cross-suite tables (sections.ACROSS; the folded ones left out), the report's notes and claims, and how to
    read it all."""
    across = sections.shown(sections.ACROSS, report, foldable=False)
    if across:
        console.rule("[bold]across suites[/bold]")
    for table, _ in across:
        print_table(console, table)
    for note in report.notes:
        console.print(Text(f"note: {inert(note)}", style="yellow"))
    claims = claims_section.claims_table(claims_section.load(report.stores))
    if claims is not None:
        console.rule(f"[bold]{inert_markup(claims_section.TITLE)}[/bold]")
        print_table(console, claims)
    console.print(Text(HOW_TO_READ, style="dim"))


def print_table(console: Console, table: tables.Table) -> None:
    for rich_table in rich_tables(table, console.width):
        console.print(rich_table)


def print_sweeps(console: Console, suite: SuiteReport) -> None:
    """The suite's Sweeps section: a compact table per swept optimizer and its edge-of-grid warnings."""
    if not suite.sweeps:
        return
    console.print(Text(f"Sweeps — {inert(suite.name)}", style="bold"))
    for sweep in suite.sweeps:
        for rich_table in rich_tables(tables.sweep_table(sweep, captioned=False), console.width):
            console.print(rich_table)
        for warning in sweep.warnings:
            console.print(Text(f"warning: {inert(warning)}", style="bold red"))
    console.print(
        Text(
            "Sweeps: each table's metric column is what selected the setting (validation metric, else training "
            f"loss; never the test split): {tables.SWEEP_RULE} --format md or html plots each sweep.",
            style="dim",
        )
    )


def runs_table(rows: Iterable[Mapping[str, Any]]) -> RichTable:
    """The runs a `run` command stored; a "setting" column (the swept hyperparameters) when a sweep ran, and the
    validation metric beside the evaluation's when the runs hold out a validation split."""
    rows = list(rows)
    swept = any(row.get("setting") for row in rows)
    validated = any(row.get("final_val_metric") is not None for row in rows)
    table = RichTable(title="runs")
    for name in (
        "suite",
        "optim",
        *(("setting",) if swept else ()),
        "seed",
        "status",
        "steps",
        "final eval loss",
        "metric",
        *(("val metric",) if validated else ()),
        "wall",
        "step time",
        "peak mem",
        "state",
    ):
        table.add_column(name, justify="left" if name in ("suite", "optim", "setting", "status") else "right")
    for row in rows:
        style = None if row["status"] == "ok" else "red"
        table.add_row(
            inert_markup(row["suite"]),
            inert_markup(row["optim"]),
            *((inert_markup(row.get("setting") or "-"),) if swept else ()),
            str(row["seed"]),
            inert_markup(row["status"]),
            str(row["steps"]),
            fmt_num(row["final_eval_loss"]),
            inert_markup(f"{fmt_num(row['final_eval_metric'])} {row['eval_metric_name']}"),
            *((fmt_num(row.get("final_val_metric")),) if validated else ()),
            fmt_seconds(row["wall_s"]),
            fmt_seconds(row["step_time_median_s"]),
            fmt_bytes(row["peak_mem_bytes"]),
            fmt_bytes(row["state_bytes"]),
            style=style,
        )
    return table
