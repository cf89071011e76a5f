"""The terminal text typeset in forked workers while the report is built (report/typesetting.py) is the text
terminal.print_report prints; rich tables that fit are given the widths rich would measure."""

from __future__ import annotations

import gc
import io
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from structbench.report import build, parallel
from structbench.report.views import tables, terminal, typesetting
from structbench.store import write as store
from tests.support.paths import ROOT
from tests.support.store import adamw_evals, muon_evals, write_run
from tests.support.workers import kill_once_two_workers_run

SUITES = ("s1", "s2", "s3", "s4", "s5")


@pytest.fixture(scope="module")
def five_suite_store(tmp_path_factory) -> Path:
    """Five suites (enough for workers): muon swept over two learning rates, a diverged sgd run in s2, and no
    adamw (the baseline) in s5, whose note the build adds after every suite is built."""
    out = tmp_path_factory.mktemp("five") / "results"
    store.prepare(out)
    for suite in SUITES:
        for seed in range(2):
            if suite != "s5":
                write_run(out, f"{suite}-adamw-{seed}", "adamw", seed, adamw_evals(seed), suite=suite)
            for lr in (0.01, 0.02):
                run_id = f"{suite}-muon-{lr}-{seed}"
                write_run(out, run_id, "muon", seed, muon_evals(seed), suite=suite, hparams={"lr": lr})
    write_run(out, "s2-sgd-0", "sgd", 0, [(0, 0.0, 2.0, 0.1), (5, 0.5, 1.5, 0.2)], suite="s2", status="diverged")
    return out


def printed(console: Console, report: build.Report) -> str:
    with console.capture() as captured:
        terminal.print_report(console, report)
    return captured.get()


CONSOLES = {
    "pipe, 160 wide": dict(width=160),
    "colour terminal, 100 wide": dict(width=100, color_system="truecolor", force_terminal=True),
    "256 colours, 45 wide (tables split and wrapped)": dict(width=45, color_system="256", force_terminal=True),
    "terminal without colour": dict(width=80, force_terminal=True, no_color=True),
}


@pytest.mark.parametrize("settings", CONSOLES.values(), ids=CONSOLES.keys())
def test_text_typeset_by_forked_workers_is_what_print_report_prints(five_suite_store, monkeypatch, settings):
    """Suites handed to the workers as they are built, each as soon as it is built, with what exists frozen out of
    the collector when the workers are forked, and the text the same as printed here (the note the build adds to
    s5 after handing it over included)."""
    built: list[str] = []
    handed: list[tuple[int, str, bool, int]] = []
    build_suite = build.build_suite
    monkeypatch.setattr(build, "build_suite", lambda *a, **k: built.append(a[0]) or build_suite(*a, **k))
    add = parallel.Workers.add

    def counted(self, task):
        add(self, task)
        handed.append((len(built), task[1].name, self.forked, gc.get_freeze_count()))

    monkeypatch.setattr(parallel.Workers, "add", counted)
    console = Console(file=io.StringIO(), **settings)
    with typesetting.Typesetting(console, workers=2) as typeset:
        report = build.build_report(five_suite_store, listeners=[typeset])
        text = typeset.text(report)
    assert [(n, name, forked) for n, name, forked, _ in handed] == [(i + 1, s, True) for i, s in enumerate(SUITES)]
    assert handed[0][3] > 0 and gc.get_freeze_count() == 0
    assert multiprocessing.active_children() == []
    assert report.suites[-1].notes[0].startswith("the baseline 'adamw' did not run this suite")
    assert text == printed(console, report)


def test_a_report_of_few_suites_is_typeset_here(five_suite_store, monkeypatch):
    forked: list[bool] = []
    add = parallel.Workers.add
    monkeypatch.setattr(parallel.Workers, "add", lambda self, task: forked.append(self.forked) or add(self, task))
    monkeypatch.setattr(parallel, "usable_cores", lambda: 2)
    console = Console(file=io.StringIO(), width=120)
    few = list(SUITES[: typesetting.MIN_SUITES_FOR_WORKERS - 1])
    with typesetting.Typesetting(console) as typeset:
        report = build.build_report(five_suite_store, few, listeners=[typeset])
        text = typeset.text(report)
    assert forked == [False] * len(few) and gc.get_freeze_count() == 0
    assert text == printed(console, report)


SLOW_REPORT = """
import sys, time
from structbench.report import parallel
from structbench.report.views import terminal
from structbench.cli.app import app

parallel.usable_cores = lambda: 2  # forked workers on a machine of one core too
head = terminal.print_suite_head
terminal.print_suite_head = lambda console, suite: time.sleep(60) or head(console, suite)  # in the forked workers too
sys.argv = ["structbench", "report", "--out", sys.argv[1]]
app()
"""


def test_killing_a_terminal_report_ends_its_typesetting_workers(five_suite_store):
    """kill -9 of `structbench report` while its forked workers lay out tables (each held there for a minute): the
    workers end with it."""
    report = subprocess.Popen(
        [sys.executable, "-c", SLOW_REPORT, str(five_suite_store)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    kill_once_two_workers_run(report)


LOOKS = [
    typesetting.ConsoleLook(80, None, False, False),
    typesetting.ConsoleLook(123, "truecolor", True, False),
    typesetting.ConsoleLook(61, "standard", True, True),
    typesetting.ConsoleLook(200, "256", True, False),
]


@pytest.mark.parametrize("look", LOOKS, ids=str)
def test_a_console_of_a_look_has_that_look(look):
    assert typesetting.ConsoleLook.of(look.console()) == look


def rendered(rich_tables: list, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    with console.capture() as captured:
        for table in rich_tables:
            console.print(table)
    return captured.get()


WIDE = tables.Table(
    "wide characters",
    [tables.Column("optimizer", left=True), tables.Column("説明", wrap=False), tables.Column("loss")],
    [
        [tables.Cell("シャンプー"), tables.Cell("前処理付き勾配法", sub="行列"), tables.Cell("0.125")],
        [tables.Cell("adamw"), tables.Cell("x"), tables.Cell("0.5", sub="0.4 – 0.6")],
    ],
)
LONG = tables.Table(
    "a column too wide on its own",
    [tables.Column("optimizer", left=True), tables.Column("message", group="why"), tables.Column("n", group="why")],
    [[tables.Cell("adamw"), tables.Cell("word " * 30), tables.Cell("3")]],
)


# Whether each printed table fits unwrapped, by hand: a table needs 1 + sum(width + 3) over its columns. WIDE's
# columns are 10 ("シャンプー": 5 characters, 10 cells), 16 and 9 cells wide: 1 + 13 + 19 + 12 = 45, at 80 and at
# exactly 45; at 44 the two columns go to two tables (33 and 26), which fit; at 30 the 説明 table does not, at 20
# neither. LONG's message is 150 wide: 1 + 12 + 153 + 4 = 170 at 200; at 60 it is alone (166) and the n column (17)
# fits.
FITS = [(WIDE, 80, [True]), (WIDE, 45, [True]), (WIDE, 44, [True, True]), (WIDE, 30, [False, True])]
FITS += [(WIDE, 20, [False, False]), (LONG, 60, [False, True]), (LONG, 200, [True])]


@pytest.mark.parametrize(("table", "width", "fits"), FITS)
def test_given_column_widths_are_the_widths_rich_measures(table, width, fits):
    """A table that fits gets its columns' widths, in terminal cells; measured by rich instead (widths removed),
    every table prints the same."""
    given = terminal.rich_tables(table, width)
    assert [all(column.width is not None for column in t.columns) for t in given] == fits
    measured = terminal.rich_tables(table, width)
    for rich_table in measured:
        for column in rich_table.columns:
            column.width = None
    assert rendered(given, width) == rendered(measured, width)
