"""The HTML report: one self-contained file (figures embedded as data: URIs, no external resources).

Readable offline, in light and dark colour schemes (it follows the reader's preference; figures are
inverted in dark mode so their white backgrounds do not glare). Every table sits in its own horizontally scrolling
container with its first column (the optimizer) kept in view, so a table wider than the page scrolls instead of
widening it, and long prose columns (messages, claims, evidence) wrap to a readable width: every column stays
reachable at any window width. Runs, their specs and environments are listed at the end, collapsed. A small
inline script checks on load that every figure decoded: it records "decoded/total" in the root element's
`data-figures` attribute and shows a warning if any failed.

The page is laid out before its figures exist (`layout`: text, with a slot where each group of figures goes) and
filled in once they are drawn (`fill`), so that the text is written while the figures are drawn.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from html import escape
from pathlib import Path

from structbench.report import sections
from structbench.report.build import Report, SuiteReport
from structbench.report.figures.figure_file import PIXEL_RATIO, FigureFile, figure_links
from structbench.report.views import claims_section, tables
from structbench.report.views.anchors import anchor
from structbench.report.views.glossary import DEFINITIONS
from structbench.store.atomic import write_text_atomic

STYLE = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1b1f24; --muted: #656d76; --line: #d0d7de;
  --card: #f6f8fa; --best: #1a7f37; --good: #1a7f37; --bad: #cf222e; --link: #0969da; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0d1117; --fg: #e6edf3; --muted: #8d96a0; --line: #30363d; --card: #161b22;
    --best: #3fb950; --good: #3fb950; --bad: #f85149; --link: #4493f8; }
  figure img { filter: invert(0.88) hue-rotate(180deg); }
}
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1400px; padding: 1.5rem 2rem 4rem; background: var(--bg); color: var(--fg);
  font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; overflow-wrap: anywhere; }
h1 { font-size: 1.6rem; margin: 0 0 .3rem; }
h4 { margin: 1.2rem 0 .4rem; font-size: .95rem; } h2 { border-bottom: 1px solid var(--line); padding-bottom: .3rem;
  margin-top: 2.5rem; } h3 { margin: 1.5rem 0 .5rem; font-size: 1.05rem; }
a { color: var(--link); text-decoration: none; } a:hover { text-decoration: underline; }
.meta, .caption, figcaption { color: var(--muted); font-size: .85rem; }
.scroll { overflow-x: auto; max-width: 100%; margin: .4rem 0; }
table { border-collapse: separate; border-spacing: 0; font-variant-numeric: tabular-nums; overflow-wrap: normal; }
th, td { border: 1px solid var(--line); border-width: 0 1px 1px 0; padding: .25rem .55rem; text-align: right;
  vertical-align: top; white-space: nowrap; background: var(--bg); }
tr > :first-child { position: sticky; left: 0; z-index: 1; border-left-width: 1px; }
thead th { border-top-width: 1px; }
th { background: var(--card); font-weight: 600; } th.l, td.l { text-align: left; }
th.p, td.p { white-space: normal; min-width: 16em; max-width: 32em; overflow-wrap: anywhere; }
td small { display: block; color: var(--muted); font-size: .78rem; }
td.best span { color: var(--best); font-weight: 700; } td.good span { color: var(--good); }
td.bad span { color: var(--bad); } td.muted span { color: var(--muted); }
.note, .warning { border-left: 3px solid var(--muted); background: var(--card); padding: .4rem .8rem;
  margin: .5rem 0; } .warning { border-color: var(--bad); }
figure.wide { grid-column: 1 / -1; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 640px), 1fr)); gap: 1rem; }
figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: .6rem; }
figure img { display: block; max-width: 100%; height: auto; margin: 0 auto; background: #fff; border-radius: 3px; }
details { margin: .3rem 0; } summary { cursor: pointer; } pre { background: var(--card); padding: .5rem;
  overflow-x: auto; font-size: .8rem; } dt { font-weight: 600; } dd { margin: 0 0 .6rem 1rem; }
nav ul { columns: 3; } #figure-warning { display: none; }
"""

Slot = Callable[[list[FigureFile]], str]
"""Where a group of figures goes: the group's HTML from all of the report's figures."""
Layout = list[str | Slot]

WIDE_FIGURE = 700
"""CSS pixels above which a figure spans the whole row of the figure grid."""

SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var decoded = images.filter(function (img) { return img.complete && img.naturalWidth > 0; }).length;
  document.documentElement.setAttribute("data-figures", decoded + "/" + images.length);
  if (decoded < images.length) {
    var box = document.getElementById("figure-warning");
    box.textContent = (images.length - decoded) + " figure(s) failed to load.";
    box.style.display = "block";
  }
});
"""


def _classes(column: tables.Column) -> str:
    return " ".join(c for c in ("l" if column.left else "", "p" if column.prose else "") if c)


def _cell(cell: tables.Cell, classes: str) -> str:
    """A cell of a column with `classes` (_classes)."""
    if cell.tone:
        classes = f"{classes} {cell.tone}" if classes else cell.tone
    text = escape(cell.text)
    if cell.link:
        text = f'<a href="#{escape(cell.link)}">{text}</a>'
    sub = f"<small>{escape(cell.sub)}</small>" if cell.sub else ""
    title = f' title="{escape(cell.title)}"' if cell.title else ""
    return f'<td class="{classes}"{title}><span>{text}</span>{sub}</td>'


def table(t: tables.Table, heading: str = "h3") -> str:
    classes = [_classes(c) for c in t.columns]
    head = "".join(f'<th class="{k}">{escape(c.name)}</th>' for k, c in zip(classes, t.columns, strict=True))
    body = "".join(
        "<tr>" + "".join(_cell(cell, k) for cell, k in zip(row, classes, strict=True)) + "</tr>" for row in t.rows
    )
    title = f'<{heading} id="{escape(t.key)}">{escape(t.title)}</{heading}>' if heading and t.key else ""
    if heading and not t.key:
        title = f"<{heading}>{escape(t.title)}</{heading}>"
    caption = f'<p class="caption">{escape(t.caption)}</p>' if t.caption else ""
    return (
        f'{title}<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{caption}'
    )


def _figure(figure: FigureFile, report: Report) -> str:
    """A figure at its CSS size; one wider than WIDE_FIGURE takes a whole row of the grid."""
    data = base64.b64encode(figure.png).decode("ascii")
    wide = ' class="wide"' if figure.width // PIXEL_RATIO > WIDE_FIGURE else ""
    links = ", ".join(f'<a href="#{escape(a)}">{escape(label)}</a>' for label, a in figure_links(figure, report))
    size = f'width="{figure.width // PIXEL_RATIO}" height="{figure.height // PIXEL_RATIO}"'
    return (
        f'<figure id="fig-{escape(figure.name)}"{wide}><img src="data:image/png;base64,{data}" '
        f'alt="{escape(figure.title)}" {size}><figcaption><b>{escape(figure.title)}.</b> '
        f"{escape(figure.caption)} Runs ({len(figure.run_ids)}): {links or 'see the run list'}.</figcaption></figure>"
    )


def _figures(figures: list[FigureFile], report: Report) -> str:
    return f'<div class="figures">{"".join(_figure(f, report) for f in figures)}</div>' if figures else ""


def _tables(shown: Iterable[tuple[tables.Table, str | None]]) -> list[str]:
    """The tables of a section list (sections.shown): each under its heading, or folded under its summary line."""
    return [
        table(t)
        if summary is None
        else f'<details id="{escape(t.key)}"><summary>{escape(summary)}</summary>{table(t, heading="")}</details>'
        for t, summary in shown
    ]


def _suite(suite: SuiteReport, report: Report) -> Layout:
    targets = "; ".join(t.describe() for t in suite.targets) or "none"
    baseline = suite.baseline.label if suite.baseline is not None else f"{report.baseline} (no runs here)"
    parts = [
        f'<section id="{anchor("suite", suite.name)}"><h2>{escape(suite.name)}</h2>',
        f'<p class="meta">Task <code>{escape(suite.task)}</code> · {suite.run_count} runs · eval metric '
        f"<code>{escape(suite.metric_name)}</code> ({'lower' if suite.metric_mode == 'min' else 'higher'} is better) "
        f"· target: {escape(targets)} · baseline: {escape(baseline)}</p>",
        *_tables(sections.shown(sections.PER_SUITE, suite)),
    ]
    parts += [f'<p class="note">{escape(note)}</p>' for note in suite.notes]
    sweep_figures = {s.figure_name for s in suite.sweeps}

    def figures_of_suite(figures: list[FigureFile]) -> str:
        return _figures([f for f in figures if f.suite == suite.name and f.name not in sweep_figures], report)

    return [*parts, figures_of_suite, *_sweeps(suite, report), "</section>"]


def _sweeps(suite: SuiteReport, report: Report) -> Layout:
    """The suite's Sweeps section: the figure of every sweep, then per swept optimizer its table and edge-of-grid
    warnings."""
    if not suite.sweeps:
        return []
    names = dict.fromkeys(s.figure_name for s in suite.sweeps)

    def sweep_figures(figures: list[FigureFile]) -> str:
        by_name = {f.name: f for f in figures if f.suite == suite.name}
        return _figures([by_name[name] for name in names if name in by_name], report)

    parts: Layout = [
        f'<h3 id="{anchor("sweeps", suite.name)}">Sweeps</h3><p class="meta">Each optimizer run under several '
        "hyperparameter settings: the metric that selected its setting against each swept hyperparameter (never "
        "the test split).</p>",
        sweep_figures,
    ]
    for sweep in suite.sweeps:
        parts.append(table(tables.sweep_table(sweep), heading="h4"))
        parts += [f'<p class="warning">{escape(w)}</p>' for w in sweep.warnings]
    return parts


def _runs(report: Report) -> str:
    env_of = report.environment_of_runs()
    parts = [
        '<section id="runs"><h2>Runs</h2><p class="meta">Every run in this report by suite and setting, with the '
        "effective spec (of its first run: the others differ only in seed) and the environment it ran in.</p>"
    ]
    for suite in report.suites:
        parts.append(f"<details><summary><b>{escape(suite.name)}</b> ({suite.run_count} runs)</summary>")
        for v in suite.variants:
            superseded = (
                table(tables.runs_of_variant(v.variant, env_of, superseded=True), heading="")
                if len(v.variant.older_rows)
                else ""
            )
            parts.append(
                f'<details id="{escape(v.variant.anchor)}"><summary>{escape(v.label)} ({v.variant.runs_text()})'
                f"</summary>{table(tables.runs_of_variant(v.variant, env_of), heading='')}{superseded}"
                f"<pre>{escape(v.variant.spec_text())}</pre></details>"
            )
        parts.append("</details>")
    environments = table(tables.environment_table(report), heading="")
    parts.append(f"<details><summary><b>Environments</b></summary>{environments}</details>")
    return "".join(parts) + "</section>"


OPEN_TARGET = """
function openTarget() {
  var node = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  for (; node; node = node.parentElement) { if (node.tagName === "DETAILS") { node.open = true; } }
}
window.addEventListener("hashchange", openTarget);
window.addEventListener("load", openTarget);
"""


def layout(report: Report) -> Layout:
    """The page without its figures: text, and a slot where each group of figures goes (module docstring)."""
    meta = (
        f"Generated {report.generated:%Y-%m-%d %H:%M} UTC from <code>{escape(str(report.out))}</code> · "
        f"{len(report.suites)} suite(s) · {len(report.runs)} run(s) · "
        f"baseline <code>{escape(report.baseline)}</code> · "
        f"suites: {escape(report.filters['suites'])} · optimizers: {escape(report.filters['optimizers'])} · "
        f"since: {escape(report.filters['since'])}"
    )
    warnings = "".join(
        f'<p class="warning">skipped unreadable file {escape(str(p.path))}: {escape(p.reason)}</p>'
        for p in report.problems
    )
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in report.notes)
    nav = "".join(f'<li><a href="#{anchor("suite", s.name)}">{escape(s.name)}</a></li>' for s in report.suites)
    across = _tables(sections.shown(sections.ACROSS, report))
    claims = claims_section.claims_table(claims_section.load(report.stores))
    claims_html = (
        f'<section id="papers-claims"><h2>{escape(claims_section.TITLE)}</h2>{table(claims, heading="")}</section>'
        if claims is not None
        else ""
    )
    if claims is not None:
        nav += f'<li><a href="#papers-claims">{escape(claims_section.TITLE)}</a></li>'
    glossary = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in DEFINITIONS)
    title = f"structbench report — {len(report.suites)} suite(s), {len(report.runs)} run(s)"

    def across_figures(figures: list[FigureFile]) -> str:
        return _figures([f for f in figures if f.suite is None], report)

    return [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>"
        f'<h1>structbench report</h1><p class="meta">{meta}</p><p class="warning" id="figure-warning"></p>'
        f'{warnings}{notes}<nav><ul><li><a href="#across-suites">Across suites</a></li>{nav}'
        '<li><a href="#how-to-read">How to read</a></li><li><a href="#runs">Runs</a></li></ul></nav>'
        '<section id="across-suites"><h2>Across suites</h2>',
        across_figures,
        f"{''.join(across)}</section>",
        *(part for s in report.suites for part in _suite(s, report)),
        f'{claims_html}<section id="how-to-read"><h2>How to read</h2><dl>{glossary}</dl></section>{_runs(report)}'
        f"<script>{SCRIPT}{OPEN_TARGET}</script></body></html>\n",
    ]


def fill(page: Layout, figures: list[FigureFile]) -> str:
    """The page of `layout` with its figures in their slots."""
    return "".join(part if isinstance(part, str) else part(figures) for part in page)


def render(report: Report, figures: list[FigureFile]) -> str:
    return fill(layout(report), figures)


def write(page: Layout, figures: list[FigureFile], directory: Path) -> Path:
    """Write report.html (the page of `layout`, with `figures`), replaced whole (atomic.py): a failed write leaves the
    previous report as it was."""
    path = directory / "report.html"
    write_text_atomic(path, fill(page, figures))
    return path
