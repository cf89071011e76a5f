"""The report's sections: the terminal, Markdown and HTML writers show a suite's tables and the cross-suite tables in
one order, the one sections.py lists, and render whatever that list holds."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from structbench.report import build, sections
from structbench.report.views import html, markdown, tables, terminal
from structbench.store import write as store
from tests.support.store import adamw_evals, muon_evals, write_experiment_run, write_run

WIDTH = 400
"""Wide enough that the terminal prints every table whole, its title on one line."""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> build.Report:
    """One suite with every per-suite table (sgd at two learning rates, failed runs, a baseline to pair with) and
    an experiment run, so that every cross-suite table is there too."""
    out = tmp_path_factory.mktemp("sections") / "results"
    store.prepare(out)
    for seed in range(3):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed))
        write_run(out, f"muon-{seed}", "muon", seed, muon_evals(seed))
        write_run(out, f"sgd-{seed}", "sgd", seed, adamw_evals(seed), hparams={"lr": 0.01})
    write_run(out, "sgd-failed", "sgd", 3, [(0, 0.0, 2.0, 0.1)], status="diverged")
    write_run(out, "sgd-fast-0", "sgd", 0, muon_evals(0), hparams={"lr": 0.1})
    write_experiment_run(out, "error falls")
    return build.build_report(out)


def pages(report: build.Report) -> dict[str, str]:
    """The report as each writer renders it (Markdown and HTML without figures)."""
    console = Console(file=io.StringIO(), width=WIDTH, record=True)
    terminal.print_report(console, report)
    return {"term": console.export_text(), "md": markdown.render(report, []), "html": html.render(report, [])}


def assert_in_order(text: str, markers: list[str]) -> None:
    positions = [text.find(marker) for marker in markers]
    assert -1 not in positions, [m for m, p in zip(markers, positions, strict=True) if p == -1]
    assert positions == sorted(positions), markers


def test_every_writer_shows_the_tables_in_the_reports_order(report):
    """Per suite: results, every setting (folded; not in the terminal), paired comparison, failures. Across suites:
    the profiles on time and on steps, the ranks, the numerical experiments."""
    text = pages(report)
    assert_in_order(
        text["term"],
        [
            "hand: results per optimizer",
            "hand: paired comparison with the baseline",
            "hand: runs that did not end ok",
            "Performance profile: time to target",
            "Performance profile: steps to target",
            "Rank across suites",
            "Numerical experiments",
        ],
    )
    assert "hand: every setting" not in text["term"] and "lists all 4 settings" in text["term"]
    assert_in_order(
        text["md"],
        [
            "### Performance profile: time to target",
            "### Performance profile: steps to target",
            "### Rank across suites",
            "### Numerical experiments",
            "### hand: results per optimizer",
            "<details><summary>Every setting (4)</summary>",
            "### hand: paired comparison with the baseline",
            "### hand: runs that did not end ok",
        ],
    )
    assert_in_order(
        text["html"],
        [
            '<h3 id="profile-time">',
            '<h3 id="profile-steps">',
            '<h3 id="ranks">',
            '<h3 id="experiments">',
            '<h3 id="suite-hand">',
            '<details id="settings-hand"><summary>Every setting (4)</summary>',
            '<h3 id="paired-hand">',
            '<h3 id="failures-hand">',
        ],
    )


def marker(title: str) -> sections.Section:
    """A section whose one-cell table is titled `title` (its key too), whatever it is built from."""
    columns = [tables.Column("optimizer", left=True), tables.Column("value")]
    table = tables.Table(title, columns, [[tables.Cell("adamw"), tables.Cell(f"cell of {title}")]], key=title)
    return sections.Section(lambda _: table)


def test_the_writers_render_exactly_the_listed_sections_in_their_order(report, monkeypatch):
    """With the lists replaced, each writer shows the new sections in their order and none of the usual tables; a
    folded section is collapsed under its summary in Markdown and HTML and left out of the terminal."""
    folded = sections.Section(marker("folded-b").table, summary=lambda _: "Folded b")
    monkeypatch.setattr(sections, "PER_SUITE", (marker("suite-c"), folded, marker("suite-a")))
    monkeypatch.setattr(sections, "ACROSS", (marker("across-z"), marker("across-y")))
    text = pages(report)
    assert_in_order(text["term"], ["suite-c", "suite-a", "across-z", "across-y"])
    assert "folded-b" not in text["term"] and "Folded b" not in text["term"]
    assert_in_order(
        text["md"],
        [
            "### across-z",
            "### across-y",
            "### suite-c",
            "<details><summary>Folded b</summary>\n\n| optimizer |",
            "### suite-a",
        ],
    )
    assert_in_order(
        text["html"],
        [
            '<h3 id="across-z">',
            '<h3 id="across-y">',
            '<h3 id="suite-c">',
            '<details id="folded-b"><summary>Folded b</summary><div class="scroll">',
            '<h3 id="suite-a">',
        ],
    )
    for page in text.values():
        for title in (
            "hand: results per optimizer",
            "hand: paired comparison with the baseline",
            "hand: runs that did not end ok",
            "Performance profile: time to target",
            "Performance profile: steps to target",
            "Rank across suites",
            "Numerical experiments",
        ):
            assert title not in page
