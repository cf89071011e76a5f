"""The `structbench` command line: thin — it parses, calls library functions, and prints with rich."""

from __future__ import annotations

import contextlib
import functools
import math
import signal
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
from typer.core import TyperGroup

from structbench.errors import DeviceUnusableError, StoreWriteError, UsageError, did_you_mean

if TYPE_CHECKING:
    import pandas as pd

    from structbench.execution.runner import Progress as RunProgress
    from structbench.execution.runner import RunOutcome
    from structbench.report.output_cache import Output

# Modules that load torch (runner, optim, tasks, spec, measure, data) are imported inside the commands that use
# them, so `structbench report`, `--help` and the like start without torch.

EXIT_RUN_ERROR = 1
EXIT_USAGE = 2


def one_line(message: str) -> str:
    """A message with its line breaks (those of str.splitlines) turned into spaces: an error is one line on stderr,
    whatever text of the user's (a key, a path) it quotes."""
    return " ".join(message.splitlines())


class OneLineErrors(TyperGroup):
    """The root command: a command-line error (unknown option, bad or missing value) is reported like any other
    usage error, as one `error: ...` line on stderr with click's exit code (2), instead of a framed help box."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as exc:
            if type(exc).__name__ != "NoArgsIsHelpError":  # its message, the help, is already printed
                print(f"error: {one_line(exc.format_message())}", file=sys.stderr)
            code = exc.exit_code
        except typer.Abort:  # click's name for a KeyboardInterrupt that reached it
            print("interrupted.", file=sys.stderr)
            code = 128 + signal.SIGINT
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    help="Benchmark structured optimizers: run suites, record measurements to Parquet, report.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
WIDTH = None if sys.stdout.isatty() else 160
console = Console(width=WIDTH)
err_console = Console(stderr=True, width=WIDTH)


def show_version(value: bool) -> None:
    if value:
        import structbench

        print(f"structbench {structbench.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass

F = TypeVar("F", bound=Callable[..., Any])


def path_value(text: str | Path) -> Path:
    """A path option's value; an empty one is a usage error (it would silently mean the current directory). Typer
    passes an option's default (a Path) through the parser too."""
    if not str(text).strip():
        raise typer.BadParameter("an empty path is not a directory; give one, or leave the option out.")
    return Path(text)


T = TypeVar("T")


def without_repeats(option: str, values: list[T] | None) -> list[T] | None:
    """The values of a repeatable option, each once (in the order first given); a note names those given twice."""
    if not values:
        return values
    unique = list(dict.fromkeys(values))
    if len(unique) < len(values):
        repeated = ", ".join(str(v) for v in unique if values.count(v) > 1)
        print(f"note: {option} {repeated} given more than once; each runs once.", file=sys.stderr)
    return unique


def existing_data_dir(data_dir: Path | None, create: bool) -> Path | None:
    """--data-dir as given, which must be a directory: created when `create` (--create-data-dir), else a missing
    one is a usage error (a typo would otherwise read as "dataset not on disk")."""
    if data_dir is None or data_dir.expanduser().is_dir():
        return data_dir
    if data_dir.expanduser().exists():
        raise UsageError(f"--data-dir {data_dir} is not a directory.")
    if not create:
        raise UsageError(
            f"--data-dir {data_dir} does not exist; check the path, or add --create-data-dir to create it."
        )
    data_dir.expanduser().mkdir(parents=True)
    return data_dir


def usage_errors_exit_2(command: F) -> F:
    """Report a UsageError as one line on stderr and exit 2, with no traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UsageError as exc:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
            raise typer.Exit(EXIT_USAGE) from None

    return wrapper  # type: ignore[return-value]


@app.command("list")
@usage_errors_exit_2
def list_cmd(
    what: Annotated[str, typer.Argument(help="suites, optims, or all")] = "all",
    optims: Annotated[
        list[str] | None,
        typer.Option("--optim", help="With `optims`: only this optimizer, with its notes (repeatable)."),
    ] = None,
) -> None:
    """List the registered suites, and the optimizers with each hyperparameter's default, range, tuning and source."""
    from structbench import optim
    from structbench.plan import spec, suite_lookup

    if what not in ("suites", "optims", "all"):
        from structbench.optim.registry import unknown_name_message

        raise UsageError(unknown_name_message("list section", what, ["suites", "optims", "all"]))
    if optims and what != "optims":
        raise UsageError("--optim goes with `structbench list optims`.")
    if what in ("suites", "all"):
        table = Table(title="suites")
        for column in ("name", "from", "task", "optimizers", "budget", "description"):
            table.add_column(column)
        for found in suite_lookup.every_suite():
            _, _, raw = spec.read_suite_file(found.name)
            budget = raw.get("budget", {})
            table.add_row(
                escape(found.name),
                escape(suite_lookup.origin_text(found)),
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
        names = list(dict.fromkeys(optims or optim.names()))
        entries = [optim.get(name) for name in names]
        table = Table(title="optimizers")
        for column in ("name", "reference", "description"):
            table.add_column(column)
        for entry in entries:
            table.add_row(entry.name, escape(entry.reference), escape(entry.summary))
        console.print(table)
        for entry in entries:
            notes = escape(entry.notes) if optims else None
            table = Table(title=f"{entry.name}: hyperparameters", caption=notes, caption_justify="left")
            table.add_column("name", no_wrap=True)
            for column in ("default", "range", "tuning", "source"):
                table.add_column(column)
            for row in entry.hparams.rows():
                table.add_row(*map(escape, row))
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
    steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Override budget.steps (and drop budget.epochs); shortens eval_every and log_every in proportion "
            "when the suite's would leave fewer than 5 evaluations.",
        ),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a spec field: section.key=value; a list, log(a,b,n) or lin(a,b,n) sweeps it; "
            "hparams.*.key sets every optimizer's key.",
        ),
    ] = None,
    sweep: Annotated[
        bool,
        typer.Option(
            "--sweep",
            help="Sweep the suite's [sweep.<optim>] search spaces (else each optimizer's declared tuning ranges).",
        ),
    ] = False,
    search: Annotated[
        str | None,
        typer.Option(help="halton:N[:SEED] — N quasi-random settings per optimizer from the swept ranges."),
    ] = None,
    rerun: Annotated[bool, typer.Option("--rerun", help="Run every cell, even those already in the store.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the expanded grid and which cells are cached; run nothing.")
    ] = False,
    executor: Annotated[str, typer.Option(help="inline (this process), local (worker processes) or slurm.")] = "inline",
    jobs: Annotated[int | None, typer.Option(help="Worker processes for --executor local (default: cores).")] = None,
    slurm_partition: Annotated[str | None, typer.Option(help="Slurm partition.")] = None,
    slurm_time: Annotated[str | None, typer.Option(help="Time limit per run: minutes or [D-]HH:MM:SS.")] = None,
    slurm_gpus_per_run: Annotated[int | None, typer.Option(help="GPUs per run.")] = None,
    slurm_cpus_per_run: Annotated[int | None, typer.Option(help="CPU cores per run (its torch threads).")] = None,
    slurm_mem: Annotated[str | None, typer.Option(help="Memory per run, as sbatch --mem takes it (e.g. 8G).")] = None,
    slurm_array_parallelism: Annotated[
        int | None, typer.Option(help="At most this many runs of the array at once.")
    ] = None,
    slurm_extra: Annotated[
        list[str] | None, typer.Option("--slurm-extra", help="Any other sbatch option as key=value (repeatable).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With slurm: wait for the runs and print them.")] = False,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            help="Run each run as one torch.distributed (DDP) job of this many processes per node: torchrun here, "
            "srun with --executor slurm (gloo on CPU, nccl on CUDA)."
        ),
    ] = None,
    nnodes: Annotated[int | None, typer.Option(help="Nodes per distributed run (--executor slurm).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    out: Annotated[Path, typer.Option(parser=path_value, help="Results directory.")] = Path("results"),
    data_dir: Annotated[
        Path | None,
        typer.Option(parser=path_value, help="Data root (else $STRUCTBENCH_DATA, else ~/.cache/structbench/data)."),
    ] = None,
    create_data_dir: Annotated[
        bool, typer.Option("--create-data-dir", help="Create the --data-dir directory when it does not exist.")
    ] = False,
    optim_aliases: Annotated[
        list[str] | None,
        typer.Option("--optim-alias", help="NAME=package.module:ClassName: a short name for a plugin optimizer."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars or per-run lines.")] = False,
) -> None:
    """Run a suite's grid (optimizers x settings x seeds), skipping runs already stored, on the chosen executor."""
    from structbench.execution import executors, signals

    signals.install()
    optims, seeds = without_repeats("--optim", optims), without_repeats("--seed", seeds)
    data_dir = existing_data_dir(data_dir, create_data_dir)

    slurm_given = {
        "partition": slurm_partition,
        "time": slurm_time,
        "gpus_per_run": slurm_gpus_per_run,
        "cpus_per_run": slurm_cpus_per_run,
        "mem": slurm_mem,
        "array_parallelism": slurm_array_parallelism,
        "extra": slurm_extra or [],
    }
    check_executor_options(executor, jobs, wait, slurm_given)
    world_size = check_distributed_options(executor, nproc_per_node, nnodes)
    if executor == "local" and not dry_run:
        from structbench.execution.executors import start_worker_server

        start_worker_server()
    from structbench import measure
    from structbench.data.root import resolve_data_root
    from structbench.optim import plugins
    from structbench.plan import grid, spec, suite_lookup
    from structbench.plan import sweep as sweeps
    from structbench.store import write as store
    from structbench.tasks import get_task

    plugins.parse_aliases(optim_aliases or [])
    all_overrides = list(overrides or []) + ([f"budget.steps={steps}", "budget.epochs=0"] if steps is not None else [])
    search_spec = sweeps.parse_search(search)
    suites, checks = spec.load_suites(suite, all_overrides, optims or [], seeds or [], sweep, search_spec)
    for note in suite_lookup.notes(suite):
        console.print(escape(note))
    if steps is not None:
        from structbench.plan import short_budget

        suites, shortened = short_budget.apply(suites, steps, overrides or [])
        for note in shortened:
            console.print(escape(note))
    slurm = None
    if executor == "slurm":
        slurm = executors.slurm_options(spec.read_suite_file(suite)[2].get("resources", {}), slurm_given)
        risk = executors.early_warning_risk(slurm)
        if risk is not None:
            print(f"warning: {risk}", file=sys.stderr)
        if not dry_run:
            executors.require_sbatch()
    device_kind = resolve_device_kind(device, slurm)
    if nproc_per_node is not None:
        check_distributed_suites(suites, world_size, nproc_per_node, device_kind, executor)
    data_root = resolve_data_root(data_dir)
    for suite_spec in suites:
        if suite_spec.experiment is None:
            task_def = get_task(suite_spec.task)
            if task_def.preflight is not None:
                budget = suite_spec.budget
                task_def.preflight(suite_spec.task_args, data_root, budget["batch_size"] // budget["grad_accum"])
    cells = grid.build_grid([s for s in suites if s.experiment is None], device_kind, world_size)
    cached = store.final_run_keys(out) if out.is_dir() else {}
    todo = cells if rerun else [c for c in cells if c.key not in cached]
    if dry_run:
        console.print(grid_table(cells, cached, rerun))
        console.print(f"{len(cells)} runs: {len(cells) - len(todo)} cached, {len(todo)} to run; nothing was run.")
        return
    workers = jobs or executors.available_cores() if executor == "local" else 1
    threads = executors.threads_per_worker(workers) if executor == "local" else None
    if nproc_per_node is not None:
        threads = executors.threads_per_worker(nproc_per_node)
    if slurm is not None:
        threads = slurm.cpus_per_run
    job_list = [
        executors.Job(
            cell=cell,
            device=device_kind,
            data_root=str(data_root),
            out=str(out.resolve()),
            executor="torchrun" if nproc_per_node is not None and executor == "inline" else executor,
            parallel_runs=min(workers, len(todo)) if executor == "local" else 1,
            threads=threads,
            supersede=(cached[cell.key],) if cell.key in cached else (),
            time_limit_s=slurm.time_min * 60.0 if slurm is not None else None,
            nproc_per_node=nproc_per_node or 0,
            nnodes=nnodes or 1,
        )
        for cell in todo
    ]
    if cells:
        console.print(
            f"grid: {len(cells)} runs — {len(cells) - len(todo)} already stored, {len(todo)} to run "
            f"({executor}{f', {workers} workers' if executor == 'local' else ''}"
            f"{f', {world_size} processes per run' if nproc_per_node is not None else ''})"
        )
    from structbench.store import grids as grid_status

    grid_id = grid_status.new_grid_id()
    manifest = {
        "created": grid_id,
        "command": sys.argv,
        "executor": executor,
        "device_kind": device_kind,
        "cells": [
            {"key": c.key, "suite": c.suite.name, "optim": c.optim, "setting": c.setting, "seed": c.seed} for c in cells
        ],
    }
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    stored_before = store.run_ids(out)
    planned = len(job_list) + sum(len(s.seeds) for s in suites if s.experiment is not None)
    interrupted = False
    try:
        store.prepare(out)
        debris = store.clean(out)
        if debris.paths():
            print(f"removed from {out}: {debris.describe()} (left by an interrupted or crashed run)", file=sys.stderr)
        grid_status.write_manifest(out, grid_id, manifest)
        with signals.armed():
            run_experiments(suites, measure.resolve_device(device) if executor == "inline" else None, out, rows)
            if executor == "inline" and nproc_per_node is not None:
                from structbench.execution import torchrun as launch

                run_workers(launch.run_torchrun_jobs(job_list), len(job_list), rows, failures, quiet)
            elif executor == "inline":
                run_inline(job_list, rows, quiet)
            elif executor == "local":
                run_workers(executors.run_local(job_list, workers), len(job_list), rows, failures, quiet)
            elif job_list:
                assert slurm is not None
                submitted = submit_to_slurm(job_list, slurm, out, grid_id, manifest)
                if not wait:
                    return
                run_workers(submitted, len(job_list), rows, failures, quiet)
    except KeyboardInterrupt:
        interrupted = True
    except DeviceUnusableError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR) from None
    except StoreWriteError as exc:
        stored = len(store.run_ids(out) - stored_before)
        print(f"error: {exc}; the {stored} run(s) stored before by this command are intact.", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR) from None
    signum = signals.received() or (signal.SIGINT if interrupted else None)
    if signum is None:
        signum = index_store(out)
    finish_run_command(rows, failures, checks, signum, out, stored_before, planned)


def index_store(out: Path) -> int | None:
    """Bring the store index up to date at the end of a grid (errors are ignored: the index is an optimisation); a
    signal stops it at once. Returns the signal received meanwhile, or None."""
    from structbench.execution import signals
    from structbench.store.read import refresh_index

    with contextlib.suppress(signals.Interrupted), signals.armed():
        refresh_index(out)
    return signals.received()


def check_executor_options(executor: str, jobs: int | None, wait: bool, slurm_given: dict[str, Any]) -> None:
    """Usage errors for executor options that do not fit together, before anything is resolved or written."""
    from structbench.execution import executors

    if executor not in executors.EXECUTORS:
        raise UsageError(
            f"--executor takes {', '.join(executors.EXECUTORS)}, got {executor!r}."
            + did_you_mean(executor, executors.EXECUTORS)
        )
    if jobs is not None and executor != "local":
        raise UsageError("--jobs sets the worker count of --executor local.")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {jobs}.")
    given = [f"--slurm-{k.replace('_', '-')}" for k, v in slurm_given.items() if v not in (None, [])]
    if given and executor != "slurm":
        raise UsageError(f"{', '.join(given)} need(s) --executor slurm.")
    if wait and executor != "slurm":
        raise UsageError("--wait is for --executor slurm (the other executors always wait).")


def check_distributed_options(executor: str, nproc_per_node: int | None, nnodes: int | None) -> int:
    """Usage errors for --nproc-per-node / --nnodes; return the world size of each run (1 without them)."""
    if nproc_per_node is None:
        if nnodes is not None:
            raise UsageError("--nnodes needs --nproc-per-node.")
        return 1
    if nproc_per_node < 1 or (nnodes is not None and nnodes < 1):
        raise UsageError("--nproc-per-node and --nnodes must be >= 1.")
    if executor == "local":
        raise UsageError(
            "--nproc-per-node runs each run on several processes itself: use --executor inline (torchrun on this "
            "machine) or slurm, not local."
        )
    if executor == "inline" and (nnodes or 1) > 1:
        raise UsageError("--nnodes > 1 needs --executor slurm (torchrun here runs on this machine alone).")
    return nproc_per_node * (nnodes or 1)


def check_distributed_suites(
    suites: list[Any], world_size: int, nproc_per_node: int, device_kind: str, executor: str
) -> None:
    """Usage errors for suites a distributed run cannot train, before anything runs."""
    import torch

    from structbench.tasks import get_task

    if device_kind == "cuda" and executor == "inline" and nproc_per_node > torch.cuda.device_count():
        raise UsageError(
            f"--nproc-per-node {nproc_per_node} on cuda needs as many GPUs; torch sees {torch.cuda.device_count()}."
        )
    for suite_spec in suites:
        if suite_spec.experiment is not None:
            raise UsageError(
                f"suite {suite_spec.name} is a numerical experiment: it does not run under --nproc-per-node."
            )
        if not get_task(suite_spec.task).distributable:
            raise UsageError(
                f"task {suite_spec.task!r} of suite {suite_spec.name} cannot train under --nproc-per-node."
            )
        budget = suite_spec.budget
        micro = budget["batch_size"] // budget["grad_accum"]
        if micro % world_size:
            raise UsageError(
                f"suite {suite_spec.name}: the batch of each training call (batch_size / grad_accum = {micro}) must "
                f"divide evenly among the {world_size} processes of a run."
            )
        if budget["checkpoint_every"] > 0:
            raise UsageError(
                f"suite {suite_spec.name}: budget.checkpoint_every is not supported under --nproc-per-node "
                "(set it to 0)."
            )


def resolve_device_kind(device: str, slurm: Any) -> str:
    """The device kind the runs will use (part of every run key): on Slurm, cuda when runs get GPUs."""
    from structbench import measure

    if slurm is None:
        return measure.resolve_device(device).type
    if device == "auto":
        return "cuda" if slurm.gpus_per_run > 0 else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device takes auto, cpu or cuda, got {device!r}.")
    return device


def grid_table(cells: list[Any], cached: dict[str, str], rerun: bool) -> Table:
    table = Table(title="grid")
    for column in ("suite", "optimizer", "setting", "seed", "run key", "state"):
        table.add_column(column)
    for cell in cells:
        stored = cell.key in cached
        state = ("rerun (stored)" if rerun else "stored") if stored else "to run"
        table.add_row(
            escape(cell.suite.name), escape(cell.optim), escape(cell.setting or "-"), str(cell.seed), cell.key, state
        )
    return table


def run_experiments(suites: list[Any], device: Any, out: Path, rows: list[dict[str, Any]]) -> None:
    """Numerical-experiment suites run in this process (seconds each)."""
    from structbench import measure
    from structbench.execution.runner import execute_experiment
    from structbench.store import write as store

    for suite_spec in suites:
        if suite_spec.experiment is None:
            continue
        for seed in suite_spec.seeds:
            outcome = execute_experiment(suite_spec, seed, device or measure.resolve_device("auto"))
            store.write_run(out, outcome.row, outcome.curves, table=outcome.table)
            rows.append(outcome.row)
            show_experiment(suite_spec.name, seed, outcome)
            if outcome.interrupted:
                raise KeyboardInterrupt


def run_inline(job_list: list[Any], rows: list[dict[str, Any]], quiet: bool) -> None:
    """Each run in this process, with a progress bar per run."""
    from structbench.report.views import terminal

    progress = run_progress(quiet)
    with progress:
        for index, job in enumerate(job_list):
            label = job.cell.label
            bar = progress.add_task(escape(label), total=job.cell.suite.budget["steps"], loss="-", rate="-")

            def report(p: RunProgress, bar: Any = bar) -> None:
                progress.update(
                    bar,
                    completed=p.step,
                    total=p.total,
                    loss=terminal.fmt_num(p.loss),
                    rate=terminal.fmt_num(p.steps_per_s, 3),
                )

            row = execute(job, report)
            rows.append(row)
            if not quiet:
                path = Path(job.out) / "runs" / f"{row['run_id']}.parquet"
                progress.console.print(escape(f"{label}: {row['status']} -> {path}"))
            if row["interrupted"]:
                raise KeyboardInterrupt
            if row["device_usable"] is False:
                rest = [j.cell.label for j in job_list[index + 1 :]]
                raise DeviceUnusableError(
                    f"the {job.device} device is unusable in this process after {label} (stored as "
                    f"{row['status']}); {len(rest)} run(s) not done{': ' + ', '.join(rest) if rest else ''}. "
                    "Repeat the command to run them (the run cache skips the rest); --executor local runs each run "
                    "in a fresh process."
                )


def run_progress(quiet: bool) -> Progress:
    return Progress(
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


def run_workers(finished: Any, total: int, rows: list[dict[str, Any]], failures: list[str], quiet: bool) -> None:
    """Collect runs as workers finish them, with one progress bar over the grid."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=quiet,
    )
    with progress:
        bar = progress.add_task("runs", total=total)
        for one in finished:
            progress.advance(bar)
            if one.fatal:
                raise StoreWriteError(one.failure)
            if one.row is None:
                failures.append(f"{one.job.cell.label}: the worker failed: {one.failure}")
                progress.console.print(escape(failures[-1]))
                continue
            rows.append(one.row)
            if not quiet:
                path = Path(one.job.out) / "runs" / f"{one.row['run_id']}.parquet"
                progress.console.print(escape(f"{one.job.cell.label}: {one.row['status']} -> {path}"))


def submit_to_slurm(job_list: list[Any], slurm: Any, out: Path, grid_id: str, manifest: dict[str, Any]) -> Any:
    """Submit the runs as one job array, record the job ids in the grid's manifest; return a lazy iterator of
    finished runs (used with --wait)."""
    from structbench.execution import executors
    from structbench.store import grids as grid_status

    folder = out.resolve() / ".submitit" / grid_id
    submitted = executors.submit_slurm(job_list, slurm, folder)
    ids = {job.cell.key: sub.job_id for job, sub in zip(job_list, submitted, strict=True)}
    manifest["submitit_folder"] = str(folder / "%j")
    for cell in manifest["cells"]:
        cell["job_id"] = ids.get(cell["key"])
    grid_status.write_manifest(out, grid_id, manifest)
    array = submitted[0].job_id.split("_")[0]
    console.print(
        f"submitted {len(job_list)} runs as Slurm job array {array}"
        f"{f' to partition {slurm.partition}' if slurm.partition else ''}; logs under {escape(str(folder))}; "
        f"`structbench status --out {escape(str(out))}` shows progress."
    )
    return executors.collect_slurm(job_list, submitted)


def finish_run_command(
    rows: list[dict[str, Any]],
    failures: list[str],
    checks: dict[str, Any],
    signum: int | None,
    out: Path,
    stored_before: set[str],
    planned: int,
) -> None:
    """Print the runs table and exit with the code the README promises; after a signal, say what the store holds."""
    from structbench.execution import signals
    from structbench.report.views import terminal
    from structbench.store import write as store

    training = [r for r in rows if not r["task"].startswith("experiment:")]
    if training:
        console.print(terminal.runs_table(training))
    if signum is not None:
        print(
            interruption_summary(signum, store.run_statuses(out, store.run_ids(out) - stored_before), planned),
            file=sys.stderr,
        )
        raise typer.Exit(signals.exit_code(signum))
    failures = failures + check_runs(rows, checks)
    for line in failures:
        print(f"check failed: {line}", file=sys.stderr)
    if failures or any(r["status"] == "error" for r in rows):
        raise typer.Exit(EXIT_RUN_ERROR)


def interruption_summary(signum: int, statuses: list[str], planned: int) -> str:
    """One line from what the store holds: the runs this command stored, by status, and the runs it never started."""
    from collections import Counter

    counts = Counter(statuses)
    training = sum(counts.values())
    stored = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"
    return (
        f"interrupted by {signal.Signals(signum).name}: this command stored {training} run(s) ({stored}); "
        f"{max(planned - training, 0)} of the {planned} planned run(s) were not stored and run again next time."
    )


def execute(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """One run, trained and stored: structbench.execution.executors.run_job, imported on first use (`run` calls it by
    this name)."""
    from structbench.execution.executors import run_job

    return run_job(*args, **kwargs)


def show_experiment(suite: str, seed: int, outcome: RunOutcome) -> None:
    """Print an experiment's table and its verdict on each claim."""
    from structbench.report.views import terminal

    if outcome.table is not None:
        table = Table(title=escape(f"{suite} (seed {seed}) — run {outcome.row['run_id']}"))
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
def status(
    out: Annotated[Path, typer.Option(parser=path_value, help="Results directory.")] = Path("results"),
) -> None:
    """Per suite and optimizer: runs done, failed (by status), queued and running on Slurm, and missing."""
    import shutil

    from structbench.execution import executors
    from structbench.store import grids as grid_status
    from structbench.store import write as store

    if not out.is_dir():
        raise UsageError(f"results directory {out} does not exist; run `structbench run` first.")
    states = executors.slurm_states if shutil.which("squeue") else None
    tallies = grid_status.grid_status(out, store.run_keys(out), states)
    if not tallies:
        console.print(f"no grids or keyed runs in {escape(str(out))}")
        return
    table = Table(title=f"status of {escape(str(out))}")
    for column in ("suite", "optimizer", "done", "failed", "queued", "running", "missing"):
        table.add_column(column, justify="left" if column in ("suite", "optimizer", "failed") else "right")
    for (suite, optim_name), tally in tallies.items():
        failed = ", ".join(f"{status} {n}" for status, n in sorted(tally.failed.items())) or "0"
        table.add_row(
            escape(suite),
            escape(optim_name),
            str(tally.done),
            failed,
            str(tally.queued),
            str(tally.running),
            str(tally.missing),
        )
    console.print(table)


@app.command()
@usage_errors_exit_2
def report(
    outs: Annotated[
        list[Path] | None,
        typer.Option(
            "--out",
            parser=path_value,
            help="Results directory (repeatable: several stores side by side, each a column).",
        ),
    ] = None,
    suites: Annotated[list[str] | None, typer.Option("--suite", help="Only these suites (repeatable).")] = None,
    optims: Annotated[
        list[str] | None, typer.Option("--optim", help="Only these optimizers (repeatable); the baseline is kept.")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="Optimizer that speed-ups and paired comparisons refer to (default adamw).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="term, md, html or all.")] = "term",
    to: Annotated[
        Path | None, typer.Option(parser=path_value, help="Where md/html reports go (default: OUT/report).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Only runs started at or after this UTC date/time (2025-01-31[T12:00]).")
    ] = None,
    include_smoke: Annotated[
        bool, typer.Option("--include-smoke", help="Count smoke suites in the cross-suite profiles and ranks.")
    ] = False,
) -> None:
    """Compare optimizers per suite and across suites: in the terminal, as Markdown, or as one HTML page."""
    from structbench.report import options, output_cache, suite_files

    stores = list(outs or [Path("results")])
    for out in stores:
        if not out.is_dir():
            raise UsageError(f"results directory {out} does not exist; run `structbench run` first.")
    if len({str(out) for out in stores}) < len(stores):
        raise UsageError("--out names the same results directory twice.")
    formats = options.formats(fmt)
    wanted = {name: suite_files.expand(name) for name in suites or []}
    cutoff = options.since(since)
    target = to if to is not None else stores[0] / "report"
    request = {
        "suites": wanted,
        "optims": sorted(optims or []),
        "baseline": baseline,
        "since": cutoff.isoformat() if cutoff is not None else None,
        "include_smoke": include_smoke,
        "formats": sorted(formats),
        "console": [console.width, console.color_system, console.is_terminal],
    }
    entry_key = output_cache.key(stores, target, request)
    output = output_cache.load(stores[0], entry_key)
    if output is None:
        output, keep = _compute_report(stores, wanted, optims or [], baseline, cutoff, include_smoke, formats, target)
        if output is not None and keep:
            output_cache.store(stores[0], entry_key, output)
    else:
        for line in output.warnings:
            print(line, file=sys.stderr)
        _write_term(output.term)
    for path in output.written if output is not None else []:
        console.print(escape(f"wrote {path}"))


def _write_term(text: str | None) -> None:
    """Terminal text rendered by `console` (captured), written as the console would have written it."""
    if text is not None:
        console.file.write(text)
        console.file.flush()


def _warn_debris(stores: list[Path]) -> list[str]:
    """Print (on stderr) and return a warning line for each store that holds debris."""
    from structbench.store import write as store

    lines = []
    for out in stores:
        debris = store.find_debris(out)
        if debris.paths():
            lines.append(
                f"warning: {out} holds {debris.describe()}; `structbench doctor --out {out} --repair` removes them."
            )
            print(lines[-1], file=sys.stderr)
    return lines


def _compute_report(
    stores: list[Path],
    wanted: dict[str, list[str]],
    optims: list[str],
    baseline: str | None,
    cutoff: pd.Timestamp | None,
    include_smoke: bool,
    formats: set[str],
    target: Path,
) -> tuple[Output | None, bool]:
    """Build the report, print its terminal text and write what `formats` asks for (md/html to `target`): the
    output (output_cache.Output; None when there are no runs) and whether to keep it (not when files were
    unreadable: their warnings come from reading). The figures are drawn (report/render.py) and the terminal tables
    typeset (report/typesetting.py) in forked workers as the suites are built and while this process writes the text
    around them."""
    from structbench.report import build, output_cache
    from structbench.report.views import claims_section, typesetting

    with contextlib.ExitStack() as stack:
        drawing = None
        if formats & {"md", "html"}:
            from structbench.report import render  # here: a terminal report does not load matplotlib

            drawing = stack.enter_context(render.Drawing(stores[0]))
        typeset = stack.enter_context(typesetting.Typesetting(console)) if "term" in formats else None
        result = build.build_report(
            stores,
            wanted,
            optims,
            baseline or "adamw",
            cutoff,
            drawing is not None,
            baseline_given=baseline is not None,
            include_smoke=include_smoke,
            listeners=[listener for listener in (typeset, drawing) if listener is not None],
        )
        for problem in result.problems:
            print(f"warning: skipped unreadable file {problem.path}: {problem.reason}", file=sys.stderr)
        if not result.suites and result.experiments.empty and claims_section.load(stores).empty:
            _warn_debris(stores)
            console.print(escape(f"no runs in {', '.join(str(out) for out in stores)}"))
            return None, False
        warnings = _warn_debris(stores)
        term = typeset.text(result) if typeset is not None else None
        _write_term(term)
        written: list[Path] = []
        files: list[Path] = []
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
                print(f"error: cannot write the report to {target}: {exc.strerror or exc}", file=sys.stderr)
                raise typer.Exit(EXIT_RUN_ERROR) from None
        return output_cache.Output(term, warnings, written, [*written, *files]), not result.problems


@app.command("export")
@usage_errors_exit_2
def export_cmd(
    dest: Annotated[str, typer.Argument(help="A directory (for mlflow: a tracking URI or SQLite file).")],
    to: Annotated[str, typer.Option("--to", help="tensorboard, mlflow, wandb (offline files) or csv.")],
    out: Annotated[Path, typer.Option(parser=path_value, help="Results directory.")] = Path("results"),
    suites: Annotated[list[str] | None, typer.Option("--suite", help="Only these suites (repeatable).")] = None,
    optims: Annotated[list[str] | None, typer.Option("--optim", help="Only these optimizers (repeatable).")] = None,
    since: Annotated[str | None, typer.Option(help="Only runs started at or after this UTC date/time.")] = None,
    name: Annotated[str, typer.Option(help="The MLflow experiment or W&B project.")] = "structbench",
) -> None:
    """Export stored runs to TensorBoard event files, MLflow, W&B offline runs or CSV; a second export to the same
    place adds only the runs it lacks (CSV rewrites its files)."""
    from structbench import export
    from structbench.report import options, suite_files

    export.check_target(to)
    wanted = {suite: suite_files.expand(suite) for suite in suites or []}
    selection = export.select(out, wanted, optims or [], options.since(since))
    for problem in selection.problems:
        print(f"warning: skipped unreadable file {problem.path}: {problem.reason}", file=sys.stderr)
    bar = Progress(TextColumn(f"export to {to}"), BarColumn(), MofNCompleteColumn(), console=err_console)
    with bar:
        task = bar.add_task("", total=len(selection.runs))
        try:
            result = export.export(to, selection, dest, name, lambda _run_id: bar.advance(task))
        except OSError as exc:
            print(f"error: cannot write to {dest}: {exc.strerror or exc}", file=sys.stderr)
            raise typer.Exit(EXIT_RUN_ERROR) from None
    print(result.message())


@app.command()
@usage_errors_exit_2
def claims(
    paper: Annotated[str, typer.Option(help="4bit-shampoo, racs-alice, asgo, sumo, fismo or all.")] = "all",
    scale: Annotated[str, typer.Option(help="ci (seconds), cpu (minutes per paper) or gpu (a CUDA device).")] = "cpu",
    out: Annotated[Path, typer.Option(parser=path_value, help="Results directory.")] = Path("results"),
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    data_dir: Annotated[
        Path | None,
        typer.Option(parser=path_value, help="Data root (else $STRUCTBENCH_DATA, else ~/.cache/structbench/data)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No per-run progress lines.")] = False,
) -> None:
    """Check the papers' claims at small scale: each claim's verdict (holds, does not hold at this scale, not
    testable here) with its numbers beside the paper's, stored in OUT/claims/ and printed as a table."""
    from structbench.claims import claims_of
    from structbench.claims.base import SCALES, Context
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
        progress=None if quiet else lambda line: err_console.print(escape(f"  {line}"), highlight=False),
    )
    store.prepare(out)

    def announce(row: dict[str, Any]) -> None:
        console.print(escape(f"{row['paper']}/{row['claim_id']}: {row['verdict']} ({row['wall_s']:.1f} s)"))

    rows = check_claims(selected, scale, context, out, announce)
    import pandas as pd

    table = claims_section.claims_table(pd.DataFrame(rows))
    if table is not None:
        terminal.print_table(console, table)
    failed = [f"{row['paper']}/{row['claim_id']}" for row in rows if row["error"]]
    if failed:
        print(f"error: the experiments of {', '.join(failed)} failed (recorded as not testable).", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)


@app.command()
@usage_errors_exit_2
def doctor(
    out: Annotated[Path, typer.Option(help="Results directory.")] = Path("results"),
    repair: Annotated[
        bool, typer.Option("--repair", help="Remove the debris and move unreadable files to OUT/.quarantine/.")
    ] = False,
) -> None:
    """Check a results store: leftover temporaries, curve files without their run, checkpoints of runs already
    stored, unreadable files. Exit 1 when something is wrong and --repair was not given."""
    from structbench.store import write as store

    if not out.is_dir():
        raise UsageError(f"results directory {out} does not exist.")
    debris = store.find_debris(out)
    unreadable = store.unreadable_files(out)
    for path in debris.paths():
        print(f"{'removed' if repair else 'found'}: {path}")
    for problem in unreadable:
        print(f"{'quarantined' if repair else 'unreadable'}: {problem.path}: {problem.reason}")
    if not debris.paths() and not unreadable:
        print(f"{out}: {len(store.run_ids(out))} runs, no debris, every file readable.")
        return
    if not repair:
        print(f"run `structbench doctor --out {out} --repair` to fix this.", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)
    store.clean(out)
    if unreadable:
        store.quarantine(out, [problem.path for problem in unreadable])


@app.command()
@usage_errors_exit_2
def check(
    optims: Annotated[
        list[str] | None,
        typer.Option("--optim", help="Optimizer or package.module:ClassName (repeatable); default: all registered."),
    ] = None,
    optim_aliases: Annotated[
        list[str] | None,
        typer.Option("--optim-alias", help="NAME=package.module:ClassName: a short name for a plugin optimizer."),
    ] = None,
    checks: Annotated[
        list[str] | None, typer.Option("--check", help="Check (repeatable); default: all of the conformance kit.")
    ] = None,
) -> None:
    """Run the conformance kit and print a pass/skip/fail table; exit 1 if any check fails.

    The compile check says, per optimizer part, how many graphs torch.compile produced, how many graph breaks, and
    dynamo's warnings in one line; a part that runs eagerly by declaration, or an optimizer that declares compilation
    unsupported, is a SKIP with the reason."""
    from structbench import optim
    from structbench.optim import conformance, plugins

    plugins.parse_aliases(optim_aliases or [])
    names = without_repeats("--optim", optims) or optim.names()
    for name in names:
        optim.get(name)
    unknown = sorted(set(checks or ()) - set(conformance.check_names()))
    if unknown:
        from structbench.optim.registry import unknown_name_message

        raise UsageError(unknown_name_message("check", unknown[0], conformance.check_names()))
    table = Table(title="conformance")
    for column in ("optimizer", "check", "result", "detail"):
        table.add_column(column)
    verdicts = {"pass": "[green]pass[/green]", "skip": "[yellow]SKIP[/yellow]", "fail": "[red]FAIL[/red]"}
    failed = 0
    for name in names:
        for result in conformance.run_checks(name, checks or ()):
            failed += not result.passed
            table.add_row(name, result.check, verdicts[result.outcome], escape(result.message))
    console.print(table)
    if failed:
        print(f"{failed} check(s) failed.", file=sys.stderr)
        raise typer.Exit(EXIT_RUN_ERROR)


data_app = typer.Typer(help="Datasets: where structbench looks and what it finds.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("status")
@usage_errors_exit_2
def data_status(
    data_dir: Annotated[
        Path | None, typer.Option(parser=path_value, help="Data root (else $STRUCTBENCH_DATA, else default).")
    ] = None,
) -> None:
    """List which datasets, corpora and vocabularies are present under the data root, and where."""
    from structbench.data import dataset_status
    from structbench.data.root import resolve_data_root
    from structbench.data.text import corpus_status

    root = resolve_data_root(existing_data_dir(data_dir, create=False))
    table = Table(title=escape(f"datasets under {root}"))
    for column in ("dataset", "present", "where", "note"):
        table.add_column(column)
    for row in dataset_status(root):
        present = "[green]yes[/green]" if row["present"] else "[red]no[/red]"
        note = "\n".join([*([str(row["note"])] if row["note"] else []), *row["fetch"]])  # type: ignore[misc]
        table.add_row(escape(str(row["name"])), present, escape(str(row["where"] or "-")), escape(note))
    for row in corpus_status(root):
        present = "[green]yes[/green]" if row["present"] else "[red]no[/red]"
        note = "" if row["present"] else str(row["how_to_get"])
        table.add_row(escape(str(row["name"])), present, escape(str(row["where"] or "-")), escape(note))
    console.print(table)


@app.command()
def env() -> None:
    """Show the device, versions, CPU/GPU and the memory probe a run would use."""
    from structbench import measure

    table = Table(title="structbench environment", show_header=False)
    for key, value in measure.environment_report().items():
        table.add_row(key, value)
    console.print(table)
