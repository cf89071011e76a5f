"""A report published: built from the stores and written in the formats asked for (the terminal text, report.md with
its figures, report.html), or taken from the output cache when the stores and the request are unchanged.

It returns what to show and never prints: the caller prints the warnings, the terminal text and the files written.
The figures are drawn (report.figures.render) and the terminal tables typeset (report.views.typesetting) in forked
workers as the suites are built.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from structbench.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console

    from structbench.report.output_cache import Output


@dataclass(frozen=True)
class Publication:
    """What a report command shows: warnings (on stderr), then the output's terminal text and files written."""

    output: Output | None
    """None when the stores hold no runs."""
    warnings: list[str] = field(default_factory=list)
    """Unreadable files skipped, then the stores' debris (the output's own warnings)."""
    error: str | None = None
    """Why the md/html report could not be written."""


@dataclass(frozen=True)
class Request:
    """What a report asks for, as the command line gives it."""

    stores: list[Path]
    suites: list[str]
    optims: list[str]
    baseline: str | None
    fmt: str
    to: Path | None
    since: str | None
    include_smoke: bool


def publish(request: Request, console: Console) -> Publication:
    """The report of `request`: the cached output when there is one, else built and written (and then cached,
    unless files were unreadable: their warnings come from reading). `console` typesets the terminal text."""
    from structbench.report import options, output_cache, suite_files

    stores = request.stores
    for out in stores:
        if not out.is_dir():
            raise UsageError(f"results directory {out} does not exist; run `structbench run` first.")
    if len({str(out) for out in stores}) < len(stores):
        raise UsageError("--out names the same results directory twice.")
    formats = options.formats(request.fmt)
    wanted = {name: suite_files.expand(name) for name in request.suites}
    cutoff = options.since(request.since)
    target = request.to if request.to is not None else stores[0] / "report"
    key_request = {
        "suites": wanted,
        "optims": sorted(request.optims),
        "baseline": request.baseline,
        "since": cutoff.isoformat() if cutoff is not None else None,
        "include_smoke": request.include_smoke,
        "formats": sorted(formats),
        "console": [console.width, console.color_system, console.is_terminal],
    }
    entry_key = output_cache.key(stores, target, key_request)
    output = output_cache.load(stores[0], entry_key)
    if output is not None:
        return Publication(output, list(output.warnings))
    publication, keep = compute(request, wanted, cutoff, formats, target, console)
    if publication.output is not None and publication.error is None and keep:
        output_cache.store(stores[0], entry_key, publication.output)
    return publication


def debris_warnings(stores: list[Path]) -> list[str]:
    """A warning line for each store that holds debris."""
    from structbench.store import write as store

    lines = []
    for out in stores:
        debris = store.find_debris(out)
        if debris.paths():
            lines.append(
                f"warning: {out} holds {debris.describe()}; `structbench doctor --out {out} --repair` removes them."
            )
    return lines


def compute(
    request: Request,
    wanted: dict[str, list[str]],
    cutoff: pd.Timestamp | None,
    formats: set[str],
    target: Path,
    console: Console,
) -> tuple[Publication, bool]:
    """Build the report and write what `formats` asks for (md/html to `target`); return it and whether to keep it
    (not when files were unreadable)."""
    from structbench.report import build, output_cache
    from structbench.report.views import claims_section, typesetting
    from structbench.store.health import skipped_line

    stores = request.stores
    with contextlib.ExitStack() as stack:
        drawing = None
        if formats & {"md", "html"}:
            from structbench.report.figures import render  # here: a terminal report does not load matplotlib

            drawing = stack.enter_context(render.Drawing(stores[0]))
        typeset = stack.enter_context(typesetting.Typesetting(console)) if "term" in formats else None
        result = build.build_report(
            stores,
            wanted,
            request.optims,
            request.baseline or "adamw",
            cutoff,
            drawing is not None,
            baseline_given=request.baseline is not None,
            include_smoke=request.include_smoke,
            listeners=[listener for listener in (typeset, drawing) if listener is not None],
        )
        problems = [skipped_line(problem) for problem in result.problems]
        warnings = debris_warnings(stores)
        if not result.suites and result.experiments.empty and claims_section.load(stores).empty:
            return Publication(None, problems + warnings), False
        term = typeset.text(result) if typeset is not None else None
        written: list[Path] = []
        files: list[Path] = []
        error = None
        if drawing is not None:
            from structbench.report.views import html, markdown

            md_page = markdown.layout(result) if "md" in formats else None
            html_page = html.layout(result) if "html" in formats else None
            figures = drawing.figures(result)
            try:
                target.mkdir(parents=True, exist_ok=True)
                if md_page is not None:
                    written.append(markdown.write(md_page, figures, target))
                    files += sorted((target / markdown.FIGURE_DIR).glob("*.png"))
                if html_page is not None:
                    written.append(html.write(html_page, figures, target))
            except OSError as exc:
                error = f"cannot write the report to {target}: {exc.strerror or exc}"
        output = output_cache.Output(term, warnings, written, [*written, *files])
        return Publication(output, problems + warnings, error), not result.problems
