"""The `structbench` command line: thin — it parses, calls library functions, and prints with rich."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from structbench.errors import UsageError

if TYPE_CHECKING:
    from structbench.runner import Progress as RunProgress
    from structbench.runner import RunOutcome

# Modules that load torch (runner, optim, tasks, spec, measure, data) are imported inside the commands that use
# them, so `structbench report`, `--help` and the like start without torch.

app = typer.Typer(
    help="Benchmark structured optimizers: run suites, record measurements to Parquet, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
WIDTH = None if sys.stdout.isatty() else 160
console = Console(width=WIDTH)
err_console = Console(stderr=True, width=WIDTH)

EXIT_RUN_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

F = TypeVar("F", bound=Callable[..., Any])


def usage_errors_exit_2(command: F) -> F:
    """Report a UsageError as one line on stderr and exit 2, with no traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(EXIT_USAGE) from None

    return wrapper  # type: ignore[return-value]


@app.command("list")
@usage_errors_exit_2
def list_cmd(
    what: Annotated[str, typer.Argument(help="suites, optims, or all")] = "all",
) -> None:
    """List the registered suites and optimizers."""
    from structbench import optim, spec

    if what not in ("suites", "optims", "all"):
        raise UsageError(f"list takes suites, optims or all, got {what!r}.")
    if what in ("suites", "all"):
        table = Table(title="suites")
        for column in ("name", "task", "optimizers", "budget", "description"):
            table.add_column(column)
        for name in spec.suite_names():
            _, _, raw = spec.read_suite_file(name)
            budget = raw.get("budget", {})
            table.add_row(
                name,
                raw.get("task")
                or (
                    f"experiment: {raw['experiment']}"
                    if "experiment" in raw
                    else "include: " + ", ".join(raw.get("include", []))
                ),
                ", ".join(raw.get("optims", [])) or "-",
                f"{budget['epochs']} epochs" if budget.get("epochs") else f"{budget.get('steps', '-')} steps",
                raw.get("description", ""),
            )
        console.print(table)
    if what in ("optims", "all"):
        table = Table(title="optimizers")
        for column in ("name", "reference", "description", "defaults"):
            table.add_column(column)
        for name in optim.names():
            entry = optim.get(name)
            defaults = ", ".join(f"{k}={v}" for k, v in entry.defaults.items())
            table.add_row(name, entry.reference, entry.summary, defaults)
        console.print(table)


@app.command()
@usage_errors_exit_2
def run(
    suite: Annotated[str, typer.Option("--suite", help="Suite name (see `structbench list suites`) or a .toml path.")],
    optims: Annotated[
        list[str] | None, typer.Option("--optim", help="Optimizer (repeatable); default: the suite's list.")
    ] = None,
    seeds: Annotated[
        list[int] | None, typer.Option("--seed", help="Seed (repeatable); default: the suite's seeds.")
    ] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Override budget.steps (and drop budget.epochs).")] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a spec field: section.key=value.")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("results"),
    data_dir: Annotated[
        Path | None, typer.Option(help="Data root (else $STRUCTBENCH_DATA, else ~/.cache/structbench/data).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars or per-run lines.")] = False,
) -> None:
    """Run a suite over optimizers x seeds and store every run in the results directory."""
    from structbench import measure, spec, store
    from structbench.data.root import resolve_data_root
    from structbench.report import terminal
    from structbench.runner import execute_experiment
    from structbench.tasks import get_task

    all_overrides = list(overrides or []) + ([f"budget.steps={steps}", "budget.epochs=0"] if steps is not None else [])
    suites, checks = spec.load_suites(suite, all_overrides, optims or [], seeds or [])
    torch_device = measure.resolve_device(device)
    data_root = resolve_data_root(data_dir)
    for suite_spec in suites:
        if suite_spec.experiment is not None:
            continue
        task_def = get_task(suite_spec.task)
        if task_def.preflight is not None:
            task_def.preflight(suite_spec.task_args, data_root)
    store.prepare(out)
    rows: list[dict[str, Any]] = []
    interrupted = False
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[rate]} steps/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=quiet,
    )
    try:
        with progress:
            for suite_spec in suites:
                if suite_spec.experiment is not None:
                    for seed in suite_spec.seeds:
                        outcome = execute_experiment(suite_spec, seed, torch_device)
                        store.write_run(out, outcome.row, outcome.curves, table=outcome.table)
                        rows.append(outcome.row)
                        show_experiment(suite_spec.name, seed, outcome)
                        if outcome.interrupted:
                            raise KeyboardInterrupt
                    continue
                for optim_name in suite_spec.optims:
                    for seed in suite_spec.seeds:
                        label = f"{suite_spec.name} {optim_name} seed={seed}"
                        bar = progress.add_task(label, total=suite_spec.budget["steps"], loss="-", rate="-")

                        def report(p: RunProgress, bar: Any = bar) -> None:
                            progress.update(
                                bar,
                                completed=p.step,
                                total=p.total,
                                loss=terminal.fmt_num(p.loss),
                                rate=terminal.fmt_num(p.steps_per_s, 3),
                            )

                        outcome = execute(suite_spec, optim_name, seed, torch_device, data_root, report)
                        store.write_run(out, outcome.row, outcome.curves)
                        rows.append(outcome.row)
                        if not quiet:
                            progress.console.print(
                                f"{label}: {outcome.row['status']} -> {out / 'runs' / outcome.row['run_id']}.parquet"
                            )
                        if outcome.interrupted:
                            raise KeyboardInterrupt
    except KeyboardInterrupt:
        interrupted = True
    training = [r for r in rows if not r["task"].startswith("experiment:")]
    if training:
        console.print(terminal.runs_table(training))
    if interrupted:
        print("interrupted: the partial run was stored with status 'interrupted'.", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED)
    failures = check_runs(rows, checks)
    for line in failures:
        print(f"check failed: {line}", file=sys.stderr)
    if failures or any(r["status"] == "error" for r in rows):
        raise typer.Exit(EXIT_RUN_ERROR)


def execute(*args: Any, **kwargs: Any) -> RunOutcome:
    """One training run: structbench.runner.execute, imported on first use (`run` calls it by this name)."""
    from structbench.runner import execute as execute_run

    return execute_run(*args, **kwargs)


def show_experiment(suite: str, seed: int, outcome: RunOutcome) -> None:
    """Print an experiment's table and its verdict on each claim."""
    from structbench.report import terminal

    if outcome.table is not None:
        table = Table(title=f"{suite} (seed {seed}) — run {outcome.row['run_id']}")
        for column in outcome.table.columns:
            table.add_column(str(column))
        for values in outcome.table.itertuples(index=False):
            table.add_row(*(terminal.fmt_num(v) if isinstance(v, float) else str(v) for v in values))
        console.print(table)
    for claim in outcome.claims:
        mark = "[green]holds[/green]" if claim.holds else "[red]does not hold[/red]"
        console.print(f"{mark}: {escape(claim.statement)} {escape(f'[{claim.source}]')} — {escape(claim.evidence)}")
    if outcome.row["status"] != "ok":
        print(f"{suite}: experiment ended {outcome.row['status']}: {outcome.row['error']}", file=sys.stderr)


def check_runs(rows: list[dict[str, Any]], checks: dict[str, Any]) -> list[str]:
    """The suite's checks (the smoke suite: every run ok, every eval loss fell) as failure messages."""
    failures = []
    for row in rows:
        name = f"{row['suite']}/{row['optim']}/seed {row['seed']}"
        if checks["require_ok"] and row["status"] != "ok":
            failures.append(f"{name} ended {row['status']}: {(row['error'] or '').strip().splitlines()[-1:]}")
        elif checks["require_loss_decrease"] and row["status"] == "ok":
            before, after = row["initial_eval_loss"], row["final_eval_loss"]
            if not (math.isfinite(after) and after < before):
                failures.append(f"{name}: eval loss did not fall ({before:.4g} -> {after:.4g})")
    return failures


@app.command()
@usage_errors_exit_2
def report(
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("results"),
    suites: Annotated[list[str] | None, typer.Option("--suite", help="Only these suites (repeatable).")] = None,
    optims: Annotated[
        list[str] | None, typer.Option("--optim", help="Only these optimizers (repeatable); the baseline is kept.")
    ] = None,
    baseline: Annotated[str, typer.Option(help="Optimizer that speed-ups and paired comparisons refer to.")] = "adamw",
    fmt: Annotated[str, typer.Option("--format", help="term, md, html or all.")] = "term",
    to: Annotated[Path | None, typer.Option(help="Where md/html reports go (default: OUT/report).")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only runs started at or after this UTC date/time (2025-01-31[T12:00]).")
    ] = None,
) -> None:
    """Compare optimizers per suite and across suites: in the terminal, as Markdown, or as one HTML page."""
    from structbench.report import build, options, terminal

    if not out.is_dir():
        raise UsageError(f"results directory {out} does not exist; run `structbench run` first.")
    formats = options.formats(fmt)
    wanted = [name for s in suites or [] for name in options.expand_suite(s)]
    plotted = bool(formats & {"md", "html"})
    result = build.build_report(out, wanted, optims or [], baseline, options.since(since), plotted)
    for problem in result.problems:
        print(f"warning: skipped unreadable file {problem.path}: {problem.reason}", file=sys.stderr)
    if not result.suites and result.experiments.empty:
        console.print(f"no runs in {out}" + (f" for suite(s) {', '.join(wanted)}" if wanted else ""))
        return
    if "term" in formats:
        terminal.print_report(console, result)
    if plotted:
        from structbench.report import html, markdown, render

        target = to if to is not None else out / "report"
        figures = render.render_figures(result)
        try:
            target.mkdir(parents=True, exist_ok=True)
            written = []
            if "md" in formats:
                written.append(markdown.write(result, figures, target))
            if "html" in formats:
                written.append(html.write(result, figures, target))
        except OSError as exc:
            raise UsageError(f"cannot write the report to {target}: {exc.strerror or exc}.") from None
        for path in written:
            console.print(f"wrote {path}")


@app.command()
@usage_errors_exit_2
def check(
    optims: Annotated[list[str] | None, typer.Option("--optim", help="Optimizer (repeatable); default: all.")] = None,
) -> None:
    """Run the conformance kit and print a pass/fail table; exit 1 if any check fails."""
    from structbench import optim
    from structbench.optim import conformance

    names = optims or optim.names()
    for name in names:
        optim.get(name)
    table = Table(title="conformance")
    for column in ("optimizer", "check", "result", "detail"):
        table.add_column(column)
    failed = 0
    for name in names:
        for result in conformance.run_checks(name):
            failed += not result.passed
            verdict = "[green]pass[/green]" if result.passed else "[red]FAIL[/red]"
            table.add_row(name, result.check, verdict, result.message)
    console.print(table)
    if failed:
        print(f"{failed} check(s) failed.", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)


data_app = typer.Typer(help="Datasets: where structbench looks and what it finds.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("status")
@usage_errors_exit_2
def data_status(
    data_dir: Annotated[Path | None, typer.Option(help="Data root (else $STRUCTBENCH_DATA, else default).")] = None,
) -> None:
    """List which datasets, corpora and vocabularies are present under the data root, and where."""
    from structbench.data import dataset_status
    from structbench.data.root import resolve_data_root
    from structbench.data.text import corpus_status

    root = resolve_data_root(data_dir)
    table = Table(title=f"datasets under {root}")
    for column in ("dataset", "present", "where", "note"):
        table.add_column(column)
    for row in dataset_status(root):
        present = "[green]yes[/green]" if row["present"] else "[red]no[/red]"
        table.add_row(str(row["name"]), present, str(row["where"] or "-"), str(row["note"] or ""))
    for row in corpus_status(root):
        present = "[green]yes[/green]" if row["present"] else "[red]no[/red]"
        note = "" if row["present"] else str(row["how_to_get"])
        table.add_row(str(row["name"]), present, str(row["where"] or "-"), note)
    console.print(table)


@app.command()
def env() -> None:
    """Show the device, versions, CPU/GPU and the memory probe a run would use."""
    from structbench import measure

    table = Table(title="structbench environment", show_header=False)
    for key, value in measure.environment_report().items():
        table.add_row(key, value)
    console.print(table)
