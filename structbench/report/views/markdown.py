"""The Markdown report: `report.md` with the tables, and its figures as PNG files in `figures/` beside it.

The text is laid out before the figures exist (`layout`: parts, with a slot where each group of figures goes) and
filled in once they are drawn (`fill`), so that it is written while the figures are drawn.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from structbench.report import sections
from structbench.report.build import Report, SuiteReport
from structbench.report.figures.figure_file import FigureFile, figure_links
from structbench.report.views import claims_section, tables
from structbench.report.views.anchors import anchor
from structbench.report.views.glossary import DEFINITIONS
from structbench.store.atomic import write_bytes_atomic, write_text_atomic

FIGURE_DIR = "figures"
Slot = Callable[[list[FigureFile]], list[str]]
"""Where a group of figures goes: the group's parts (one per figure) from all of the report's figures."""
Layout = list[str | Slot]


SYNTAX = re.compile(
    r"""[\\`*|~$]"""  # always syntax: escapes, code spans, emphasis, table cells, strikethrough, maths
    r"|(?<![^\W_])_|_(?![^\W_])"  # emphasis, unless between two letters or digits (rel_subopt stays as it is)
    r"|<(?=[A-Za-z/!?])"  # a tag, an autolink or a comment (not "<=")
    r"|&(?=[#A-Za-z0-9])"  # a character reference
    r"|\](?=[(\[])|\[(?=\^)"  # a link, an image or a footnote
    r"|(?<!\S)#(?=#*(?:\s|$))"  # a heading's closing sequence
)
"""What Markdown (CommonMark, GitHub's tables, strikethrough, footnotes and maths) could read as syntax in the middle of
a line: only these characters are escaped, so the rest of report.md reads as plain text."""


def escape(text: object) -> str:
    """Text from the store (or the command line) as Markdown that any viewer shows literally, and that reads as
    itself in a text editor.

    Line breaks become spaces (a line break could end a table row or start a block), and each character that
    SYNTAX finds gets a backslash (CommonMark's escape of ASCII punctuation). Not for HTML blocks, where Markdown
    is not read (html_text), nor for code spans or fenced code, which show escapes as typed.
    """
    return SYNTAX.sub(lambda match: "\\" + match.group(), " ".join(str(text).splitlines()))


def html_text(text: object) -> str:
    """Store text inside one of the report's HTML blocks (`<details><summary>`), where Markdown is not read: line
    breaks become spaces and `&`, `<` and `>` their HTML references."""
    return html.escape(" ".join(str(text).splitlines()), quote=False)


def _code(text: object) -> str:
    return f"<code>{escape(text)}</code>"


def _cell(cell: tables.Cell) -> str:
    text = escape(cell.text)
    if cell.link:
        text = f"[{text}](#{cell.link})"
    if cell.tone == "best":
        text = f"**{text}**"
    return f"{text} {escape(cell.sub)}" if cell.sub else text


def table(t: tables.Table, heading: str = "###") -> str:
    lines = [f"{heading} {escape(t.title)}", ""] if heading else []
    lines.append("| " + " | ".join(escape(c.name) for c in t.columns) + " |")
    lines.append("|" + "|".join(":---" if c.left else "---:" for c in t.columns) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    if t.caption:
        lines += ["", f"*{escape(t.caption)}*"]
    return "\n".join(lines) + "\n"


def _figure(figure: FigureFile, links: Iterable[tuple[str, str]]) -> str:
    runs = ", ".join(f"[{escape(label)}](#{target})" for label, target in links)
    return (
        f"![{escape(figure.title)}]({FIGURE_DIR}/{figure.name}.png)\n\n*{escape(figure.caption)}* "
        f"Runs ({len(figure.run_ids)}): {runs or 'see the run list'}.\n"
    )


def _tables(shown: Iterable[tuple[tables.Table, str | None]]) -> list[str]:
    """The tables of a section list (sections.shown): each under its heading, or folded under its summary line."""
    return [
        table(t)
        if summary is None
        else f"<details><summary>{html_text(summary)}</summary>\n\n{table(t, heading='')}\n</details>\n"
        for t, summary in shown
    ]


def _suite(suite: SuiteReport, report: Report) -> Layout:
    targets = "; ".join(t.describe() for t in suite.targets) or "none"
    baseline = suite.baseline.label if suite.baseline is not None else f"{report.baseline} (no runs here)"
    parts: Layout = [
        f'<a id="{anchor("suite", suite.name)}"></a>\n\n## {escape(suite.name)}\n',
        f"Task {_code(suite.task)} · {suite.run_count} runs · eval metric {_code(suite.metric_name)} "
        f"({'lower' if suite.metric_mode == 'min' else 'higher'} is better) · target: {escape(targets)} · "
        f"baseline: {escape(baseline)}\n",
        *_tables(sections.shown(sections.PER_SUITE, suite)),
    ]
    parts += [f"> note: {escape(note)}\n" for note in suite.notes]
    sweep_figures = {s.figure_name for s in suite.sweeps}

    def figures_of_suite(figures: list[FigureFile]) -> list[str]:
        return [
            _figure(f, figure_links(f, report))
            for f in figures
            if f.suite == suite.name and f.name not in sweep_figures
        ]

    return [*parts, figures_of_suite, *_sweeps(suite, report)]


def _sweeps(suite: SuiteReport, report: Report) -> Layout:
    """The suite's Sweeps section: the figure of every sweep, then per swept optimizer its table and edge-of-grid
    warnings."""
    if not suite.sweeps:
        return []
    names = dict.fromkeys(s.figure_name for s in suite.sweeps)

    def sweep_figures(figures: list[FigureFile]) -> list[str]:
        by_name = {f.name: f for f in figures if f.suite == suite.name}
        return [_figure(by_name[name], figure_links(by_name[name], report)) for name in names if name in by_name]

    parts: Layout = [
        f'<a id="{anchor("sweeps", suite.name)}"></a>\n\n### {escape(suite.name)}: sweeps\n',
        "Each optimizer run under several hyperparameter settings: the metric that selected its setting against "
        "each swept hyperparameter (never the test split).\n",
        sweep_figures,
    ]
    for sweep in suite.sweeps:
        parts.append(table(tables.sweep_table(sweep), heading="####"))
        parts += [f"> warning: {escape(w)}\n" for w in sweep.warnings]
    return parts


def _runs(report: Report) -> list[str]:
    env_of = report.environment_of_runs()
    parts = [
        '<a id="runs"></a>\n\n## Runs\n',
        "Every run in this report, by suite and setting, with its effective spec.\n",
    ]
    for suite in report.suites:
        for v in suite.variants:
            body = table(tables.runs_of_variant(v.variant, env_of), heading="")
            if len(v.variant.older_rows):
                body += "\n" + table(tables.runs_of_variant(v.variant, env_of, superseded=True), heading="")
            parts.append(
                f'<a id="{v.variant.anchor}"></a>\n<details><summary>{html_text(suite.name)} — {html_text(v.label)} '
                f"({v.variant.runs_text()})</summary>\n\n{body}\n"
                f"```json\n{v.variant.spec_text()}\n```\n</details>\n"
            )
    parts.append(table(tables.environment_table(report), heading="##"))
    return parts


def layout(report: Report) -> Layout:
    """The report's parts without its figures, and a slot where each group of figures goes (module docstring)."""
    runs = len(report.runs)
    header = [
        "# structbench report\n",
        f"Generated {report.generated:%Y-%m-%d %H:%M} UTC from {_code(report.out)} · {len(report.suites)} suite(s) · "
        f"{runs} run(s) · baseline {_code(report.baseline)} · suites: {escape(report.filters['suites'])} · "
        f"optimizers: {escape(report.filters['optimizers'])} · since: {escape(report.filters['since'])}\n",
    ]
    header += [f"> warning: skipped unreadable file {_code(p.path)}: {escape(p.reason)}\n" for p in report.problems]
    header += [f"> note: {escape(note)}\n" for note in report.notes]
    contents = ["- [Across suites](#across-suites)"]
    contents += [f"- [{escape(s.name)}](#{anchor('suite', s.name)})" for s in report.suites]
    claims = claims_section.claims_table(claims_section.load(report.stores))
    if claims is not None:
        contents.append(f"- [{escape(claims_section.TITLE)}](#papers-claims)")
    header.append("\n".join([*contents, "- [How to read](#how-to-read)", "- [Runs](#runs)"]) + "\n")

    def across_figures(figures: list[FigureFile]) -> list[str]:
        return [_figure(f, figure_links(f, report)) for f in figures if f.suite is None]

    across: Layout = [
        '<a id="across-suites"></a>\n\n## Across suites\n',
        across_figures,
        *_tables(sections.shown(sections.ACROSS, report)),
    ]
    suites = [part for s in report.suites for part in _suite(s, report)]
    if claims is not None:
        suites += [f'<a id="papers-claims"></a>\n\n## {escape(claims_section.TITLE)}\n', table(claims, heading="")]
    glossary = ['<a id="how-to-read"></a>\n\n## How to read\n'] + [f"- **{k}.** {v}" for k, v in DEFINITIONS]
    return [*header, *across, *suites, "\n".join(glossary) + "\n", *_runs(report)]


def fill(page: Layout, figures: list[FigureFile]) -> str:
    """The text of `layout` with its figures in their slots."""
    return "\n".join(text for part in page for text in ([part] if isinstance(part, str) else part(figures)))


def render(report: Report, figures: list[FigureFile]) -> str:
    return fill(layout(report), figures)


def write(page: Layout, figures: list[FigureFile], directory: Path) -> Path:
    """Write report.md (the text of `layout`, with `figures`) and its PNGs, each replaced whole (atomic.py); then
    remove the PNGs of an earlier report in the same place that this one does not have."""
    text = fill(page, figures)
    figure_dir = directory / FIGURE_DIR
    figure_dir.mkdir(parents=True, exist_ok=True)
    for figure in figures:
        write_bytes_atomic(figure_dir / f"{figure.name}.png", figure.png)
    path = directory / "report.md"
    write_text_atomic(path, text)
    current = {f"{figure.name}.png" for figure in figures}
    for old in figure_dir.glob("*.png"):
        if old.name not in current:
            old.unlink()
    return path
