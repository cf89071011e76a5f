"""`structbench report` and `structbench export`: the stored runs compared, or handed to other tools."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from structbench.cli.app import (
    EXIT_RUN_ERROR,
    OutDir,
    console,
    err_console,
    path_value,
    usage_errors_exit_2,
    writable_destination,
)
from structbench.inert import inert, inert_markup

Outs = Annotated[
    list[Path] | None,
    typer.Option(
        "--out", parser=path_value, help="Results directory (repeatable: several stores side by side, each a column)."
    ),
]
Suites = Annotated[list[str] | None, typer.Option("--suite", help="Only these suites (repeatable).")]
KeptOptims = Annotated[
    list[str] | None, typer.Option("--optim", help="Only these optimizers (repeatable); the baseline is kept.")
]
Baseline = Annotated[
    str | None, typer.Option(help="Optimizer that speed-ups and paired comparisons refer to (default adamw).")
]
Format = Annotated[str, typer.Option("--format", help="term, md, html or all.")]
To = Annotated[Path | None, typer.Option(parser=path_value, help="Where md/html reports go (default: OUT/report).")]
Since = Annotated[
    str | None, typer.Option(help="Only runs started at or after this UTC date/time (2025-01-31[T12:00]).")
]
IncludeSmoke = Annotated[
    bool, typer.Option("--include-smoke", help="Count smoke suites in the cross-suite profiles and ranks.")
]


FILE_FORMATS = ("md", "html", "all")
"""The --format values that write files under --to."""


@usage_errors_exit_2
def report(
    outs: Outs = None,
    suites: Suites = None,
    optims: KeptOptims = None,
    baseline: Baseline = None,
    fmt: Format = "term",
    to: To = None,
    since: Since = None,
    include_smoke: IncludeSmoke = False,
) -> None:
    """Compare optimizers per suite and across suites: in the terminal, as Markdown, or as one HTML page."""
    from structbench.report import publish

    stores = list(outs or [Path("results")])
    if fmt in FILE_FORMATS:
        writable_destination(to if to is not None else stores[0] / "report", "the report")
    request = publish.Request(stores, suites or [], optims or [], baseline, fmt, to, since, include_smoke)
    publication = publish.publish(request, console)
    for line in publication.warnings:
        print(inert(line), file=sys.stderr)
    if publication.output is None:
        console.print(inert_markup(f"no runs in {', '.join(str(out) for out in stores)}"))
        return
    if publication.output.term is not None:
        console.file.write(publication.output.term)
        console.file.flush()
    if publication.error is not None:
        print(f"error: {inert(publication.error)}", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)
    for path in publication.output.written:
        console.print(inert_markup(f"wrote {path}"))


@usage_errors_exit_2
def export_cmd(
    dest: Annotated[str, typer.Argument(help="A directory (for mlflow: a tracking URI or SQLite file).")],
    to: Annotated[str, typer.Option("--to", help="tensorboard, mlflow, wandb (offline files) or csv.")],
    out: OutDir = Path("results"),
    suites: Suites = None,
    optims: Annotated[list[str] | None, typer.Option("--optim", help="Only these optimizers (repeatable).")] = None,
    since: Annotated[str | None, typer.Option(help="Only runs started at or after this UTC date/time.")] = None,
    name: Annotated[str, typer.Option(help="The MLflow experiment or W&B project.")] = "structbench",
) -> None:
    """Export stored runs to TensorBoard event files, MLflow, W&B offline runs or CSV; a second export to the same
    place adds only the runs it lacks (CSV rewrites its files)."""
    from structbench import export
    from structbench.report import options, suite_files
    from structbench.store.health import skipped_line

    export.check_target(to)
    writable_destination(export_directory(to, dest), "the export")
    wanted = {suite: suite_files.expand(suite) for suite in suites or []}
    selection = export.select(out, wanted, optims or [], options.since(since))
    for problem in selection.problems:
        print(inert(skipped_line(problem)), file=sys.stderr)
    bar = Progress(TextColumn(f"export to {to}"), BarColumn(), MofNCompleteColumn(), console=err_console)
    try:
        with bar:
            task = bar.add_task("", total=len(selection.runs))
            result = export.export(to, selection, dest, name, lambda _run_id: bar.advance(task))
    except OSError as exc:  # after the bar's last line: the error is the command's last word
        print(inert(f"error: cannot write to {dest}: {exc.strerror or exc}"), file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR) from None
    print(inert(result.message()))


def export_directory(target: str, dest: str) -> Path:
    """The directory an export to `dest` writes in: `dest` itself, or for MLflow given a path (not a tracking URI)
    the SQLite file's directory."""
    if target != "mlflow":
        return Path(dest)
    if "://" in dest or dest.startswith("databricks"):
        return Path(".")
    return Path(dest).parent
