"""The tool commands: `list`, `check`, `doctor`, `data status`, `data fetch`, `env` and `claims`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from structbench import catalogue
from structbench.cli.app import (
    EXIT_RUN_ERROR,
    DataDir,
    Device,
    OptimAliases,
    OutDir,
    console,
    err_console,
    existing_data_dir,
    path_value,
    usage_errors_exit_2,
    without_repeats,
)
from structbench.errors import StoreWriteError, UsageError
from structbench.inert import inert, inert_markup

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.progress import Progress

    from structbench.data.fetch import FetchPlan
    from structbench.store.write import Debris, Problem


@usage_errors_exit_2
def list_cmd(
    what: Annotated[str, typer.Argument(help="suites, optims, or all")] = "all",
    optims: Annotated[
        list[str] | None,
        typer.Option("--optim", help="With `optims`: only this optimizer, with its notes (repeatable)."),
    ] = None,
) -> None:
    """List the registered suites, and the optimizers with each hyperparameter's default, range, tuning and source."""
    from structbench.plan import suite_file, suite_lookup

    if what not in ("suites", "optims", "all"):
        from structbench.errors import unknown_name_message

        raise UsageError(unknown_name_message("list section", what, ["suites", "optims", "all"]))
    if optims and what != "optims":
        raise UsageError("--optim goes with `structbench list optims`.")
    if what in ("suites", "all"):
        table = Table(title="suites")
        for column in ("name", "from", "task", "optimizers", "budget", "description"):
            table.add_column(column)
        for found in suite_lookup.every_suite():
            _, _, raw = suite_file.read_suite_file(found.name)
            budget = raw.get("budget", {})
            table.add_row(
                *map(
                    inert_markup,
                    (
                        found.name,
                        suite_lookup.origin_text(found),
                        raw.get("task")
                        or (
                            f"experiment: {raw['experiment']}"
                            if "experiment" in raw
                            else "include: " + ", ".join(raw.get("include", []))
                        ),
                        ", ".join(raw.get("optims", [])) or "-",
                        f"{budget['epochs']} epochs" if budget.get("epochs") else f"{budget.get('steps', '-')} steps",
                        raw.get("description", ""),
                    ),
                )
            )
        console.print(table)
    if what in ("optims", "all"):
        listings = optimizer_listings(list(dict.fromkeys(optims or [])))
        table = Table(title="optimizers")
        for column in ("name", "reference", "description"):
            table.add_column(column)
        for listing in listings:
            table.add_row(listing.name, escape(listing.reference), escape(listing.summary))
        console.print(table)
        for listing in listings:
            notes = escape(listing.notes) if optims else None
            table = Table(title=f"{listing.name}: hyperparameters", caption=notes, caption_justify="left")
            table.add_column("name", no_wrap=True)
            for column in ("default", "range", "tuning", "source"):
                table.add_column(column)
            for row in listing.hparams:
                table.add_row(*map(escape, row))
            console.print(table)


def optimizer_listings(names: list[str]) -> list[catalogue.Listing]:
    """What `list optims` shows of `names` (every optimizer when empty): structbench's own from the catalogue, without
    importing torch; plugins and `package.module:Class` names from the registry."""
    known = catalogue.builtin()
    if not names:
        names = _registry().names() if catalogue.plugins_installed() else sorted(known)
    return [known[name] if name in known else catalogue.Listing.of(_registry().get(name)) for name in names]


def _registry() -> Any:
    """structbench.optim, imported (with torch) only when a plugin is to be listed."""
    from structbench import optim

    return optim


@usage_errors_exit_2
def claims(
    paper: Annotated[str, typer.Option(help="4bit-shampoo, racs-alice, asgo, sumo, fismo or all.")] = "all",
    scale: Annotated[str, typer.Option(help="ci (seconds), cpu (minutes per paper) or gpu (a CUDA device).")] = "cpu",
    out: OutDir = Path("results"),
    device: Device = "auto",
    data_dir: DataDir = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No per-run progress lines.")] = False,
) -> None:
    """Check the papers' claims at small scale: each claim's verdict (holds, does not hold at this scale, not
    testable here) with its numbers beside the paper's, stored in OUT/claims/ and printed as a table."""
    from structbench.claims import claims_of
    from structbench.claims.base import SCALES, UNTESTABLE, Context
    from structbench.claims.check import check_claims

    if scale not in SCALES:
        raise UsageError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}.")
    selected = claims_of(paper)
    from structbench import measure
    from structbench.data.root import resolve_data_root
    from structbench.report.views import claims_section, terminal
    from structbench.store import write as store

    context = Context(
        device=measure.resolve_device(device),
        data_root=resolve_data_root(data_dir),
        progress=None if quiet else lambda line: err_console.print(inert_markup(f"  {line}"), highlight=False),
    )

    def announce(row: dict[str, Any]) -> None:
        why = f": {row['reason']}" if row["verdict"] == UNTESTABLE and row["reason"] else ""
        console.print(inert_markup(f"{row['paper']}/{row['claim_id']}: {row['verdict']}{why} ({row['wall_s']:.1f} s)"))

    try:
        store.prepare(out)
        rows = check_claims(selected, scale, context, out, announce)
    except StoreWriteError as exc:  # a full disk: the claims stored before it are intact
        print(f"error: {inert(str(exc))}", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR) from None
    import pandas as pd

    table = claims_section.claims_table(pd.DataFrame(rows))
    if table is not None:
        terminal.print_table(console, table)
    failed = [f"{row['paper']}/{row['claim_id']}" for row in rows if row["error"]]
    if failed:
        print(f"error: the experiments of {', '.join(failed)} failed (recorded as not testable).", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)


@usage_errors_exit_2
def doctor(
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("results"),
    repair: Annotated[
        bool, typer.Option("--repair", help="Remove the debris and move unreadable files to OUT/.quarantine/.")
    ] = False,
) -> None:
    """Check a results store: leftover temporaries, curve files without their run, checkpoints of runs already
    stored, unreadable files. Exit 1 when something is wrong and --repair was not given, or when --repair could not
    remove or move everything. Files a newer structbench wrote are reported and never touched."""
    from structbench.store import health
    from structbench.store import write as store

    if not out.is_dir():
        raise UsageError(f"results directory {out} does not exist.")
    debris = store.find_debris(out)
    survey = store.survey_files(out)
    survey.unreadable += health.damage_beyond(out, survey.unreadable)
    for problem in survey.newer:
        _say("newer", problem.path, problem.reason)
    if not debris.paths() and not survey.unreadable:
        _say_healthy(out, len(store.run_ids(out)), len(survey.newer))
        return
    if not repair:
        for path in debris.paths():
            _say("found", path)
        for problem in survey.unreadable:
            _say("unreadable", problem.path, problem.reason)
        print(inert(f"run `structbench doctor --out {out} --repair` to fix this."), file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)
    failures = _repair(out, debris, survey.unreadable)
    if failures:
        for problem in failures:
            print(inert(f"not removed: {problem.path}: {problem.reason}"), file=sys.stderr)
        print(inert(f"error: {len(failures)} file(s) of {out} could not be repaired."), file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)


def _repair(out: Path, found: Debris, unreadable: list[Problem]) -> list[Problem]:
    """Remove the debris and quarantine the unreadable files, saying each done; return what could not be done."""
    from structbench.errors import StoreWriteError
    from structbench.store import write as store

    try:
        removed = store.clean(out)
    except StoreWriteError as exc:  # the store's lock file cannot be created: nothing can be removed
        removed = store.Debris(failures=[store.Problem(path, str(exc)) for path in found.paths()])
    for path in removed.paths():
        _say("removed", path)
    moved, not_moved = store.quarantine(out, [problem.path for problem in unreadable])
    reasons = {problem.path: problem.reason for problem in unreadable}
    for path in moved:
        _say("quarantined", path, reasons[path])
    return [*removed.failures, *not_moved]


def _say(what: str, path: Path, reason: str | None = None) -> None:
    """One line of doctor's findings on stdout: what, the path, and why (control characters in a stored name shown
    escaped)."""
    print(inert(f"{what}: {path}{f': {reason}' if reason else ''}"))


def _say_healthy(out: Path, runs: int, newer: int) -> None:
    """The line of a store with nothing to repair."""
    readable = f"every file readable but {newer} written by a newer structbench" if newer else "every file readable"
    print(inert(f"{out}: {runs} runs, no debris, {readable}."))


@usage_errors_exit_2
def check(
    optims: Annotated[
        list[str] | None,
        typer.Option("--optim", help="Optimizer or package.module:ClassName (repeatable); default: all registered."),
    ] = None,
    optim_aliases: OptimAliases = None,
    checks: Annotated[
        list[str] | None, typer.Option("--check", help="Check (repeatable); default: all of the conformance kit.")
    ] = None,
    device: Device = "auto",
) -> None:
    """Run the conformance kit on the device (auto: CUDA where torch sees one) and print a pass/skip/fail table;
    exit 1 if any check fails.

    The compile check says, per optimizer part, how many graphs torch.compile produced, how many graph breaks, and
    dynamo's warnings in one line; a part that runs eagerly by declaration, or an optimizer that declares compilation
    unsupported, is a SKIP with the reason."""
    from structbench import measure, optim
    from structbench.optim import conformance, plugins

    on = measure.resolve_device(device)
    plugins.parse_aliases(optim_aliases or [])
    names = without_repeats("--optim", optims) or optim.names()
    for name in names:
        optim.get(name)
    unknown = sorted(set(checks or ()) - set(conformance.check_names()))
    if unknown:
        from structbench.errors import unknown_name_message

        raise UsageError(unknown_name_message("check", unknown[0], conformance.check_names()))
    table = Table(title=f"conformance on {on}", caption=measure.device_name(on))
    for column in ("optimizer", "check", "result", "detail"):
        table.add_column(column)
    verdicts = {"pass": "[green]pass[/green]", "skip": "[yellow]SKIP[/yellow]", "fail": "[red]FAIL[/red]"}
    failed = 0
    for name in names:
        for result in conformance.run_checks(name, checks or (), on):
            failed += not result.passed
            table.add_row(name, result.check, verdicts[result.outcome], escape(result.message))
    console.print(table)
    if failed:
        print(f"{failed} check(s) failed.", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)


data_app = typer.Typer(help="Datasets: where structbench looks and what it finds.", no_args_is_help=True)


@data_app.command("status")
@usage_errors_exit_2
def data_status(
    data_dir: Annotated[
        Path | None, typer.Option(parser=path_value, help="Data root (else $STRUCTBENCH_DATA, else default).")
    ] = None,
) -> None:
    """List which datasets, corpora and vocabularies are present under the data root, and where."""
    from structbench.data import dataset_status
    from structbench.data.fetch import GPT2_NAME
    from structbench.data.registry import fetch_command
    from structbench.data.root import resolve_data_root
    from structbench.data.text import corpus_status

    root = resolve_data_root(_status_data_dir(data_dir))
    table = Table(title=escape(f"datasets under {root}"))
    table.add_column("dataset")
    table.add_column("present")
    for column in ("where", "note"):
        table.add_column(column, overflow="fold")  # paths and commands in full, to copy: folded, never cut
    for row in dataset_status(root):
        present = "[green]yes[/green]" if row["present"] else "[red]no[/red]"
        get = [f"get it: {fetch_command(str(row['name']), root)}", "or by hand:", *row["fetch"]] if row["fetch"] else []  # type: ignore[misc]
        note = "\n".join([*([str(row["note"])] if row["note"] else []), *get])
        table.add_row(escape(str(row["name"])), present, escape(str(row["where"] or "-")), escape(note))
    for row in corpus_status(root):
        present = "[green]yes[/green]" if row["present"] else "[red]no[/red]"
        note = "" if row["present"] else str(row["how_to_get"])
        if row["name"] == "gpt2 vocabulary" and not row["present"]:
            note = f"get it: {fetch_command(GPT2_NAME, root)}\nor: {note}"
        table.add_row(escape(str(row["name"])), present, escape(str(row["where"] or "-")), escape(note))
    console.print(table)



def _status_data_dir(data_dir: Path | None) -> Path | None:
    """--data-dir as `data status` takes it: an existing directory. `data status` creates nothing, so a missing one
    is a usage error that names the command that creates it (`data fetch`), not run's --create-data-dir."""
    if data_dir is not None and not data_dir.expanduser().exists():
        raise UsageError(
            f"--data-dir {data_dir} does not exist; check the path, or create it by fetching a dataset into it: "
            f"structbench data fetch NAME --data-dir {data_dir}"
        )
    return existing_data_dir(data_dir, create=False)


@data_app.command("fetch")
@usage_errors_exit_2
def data_fetch(
    names: Annotated[
        list[str],
        typer.Argument(
            metavar="NAME...", help="Datasets to fetch: cifar10, cifar100, mnist, fashion-mnist, digits, gpt2."
        ),
    ],
    data_dir: Annotated[
        Path | None, typer.Option(parser=path_value, help="Data root (else $STRUCTBENCH_DATA, else default).")
    ] = None,
) -> None:
    """Download datasets' public files into the data root, resuming partial downloads and verifying checksums.

    The only command that downloads: `run` never does. Exit 1 when a download fails (a rerun resumes it).
    """
    from structbench.data.fetch import fetch_plan, present_at

    plans = [fetch_plan(name) for name in without_repeats("NAME", names) or ()]
    root = _fetch_root(data_dir)
    for plan in plans:
        where = present_at(plan.name, root)
        if where is not None:
            console.print(escape(f"{plan.name}: already present at {where}; nothing fetched."))
            continue
        _fetch_one(plan, root)
        console.print(escape(f"{plan.name}: fetched and verified under {root}."))


def _fetch_root(data_dir: Path | None) -> Path:
    """The data root to fetch into, created if missing; a path that cannot be a directory is a usage error."""
    from structbench.data.root import resolve_data_root

    root = resolve_data_root(data_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot use {root} as the data root: {exc.strerror or exc}") from None
    return root


def _fetch_one(plan: FetchPlan, root: Path) -> None:
    """Fetch one plan with a progress bar on stderr; any failure is one `error:` line and exit 1."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from structbench.cli.app import one_line
    from structbench.data.fetch import FetchError, fetch

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    try:
        with Progress(*columns, console=err_console) as progress:
            fetch(plan, root, lambda remote: _progress_callback(progress, remote.destination))
    except (FetchError, OSError) as exc:
        print(f"error: {plan.name}: {one_line(str(exc))}", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR) from None
    except KeyboardInterrupt:
        print(f"error: {plan.name}: interrupted; rerun the same command to resume.", file=sys.stderr)
        raise typer.Exit(130) from None


def _progress_callback(progress: Progress, label: str) -> Callable[[int, int | None], None]:
    """A new progress bar for ``label`` and the callback that moves it."""
    task = progress.add_task(escape(label), total=None)
    return lambda done, total: progress.update(task, completed=done, total=total)

def env() -> None:
    """Show the device, versions, CPU/GPU and the memory probe a run would use."""
    from structbench import measure

    table = Table(title="structbench environment", show_header=False)
    for key, value in measure.environment_report().items():
        table.add_row(key, value)
    console.print(table)
