"""`structbench run` and `structbench status`: plan a grid, run it in a grid session, print what it stored."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from structbench.cli.app import (
    DataDir,
    Device,
    OptimAliases,
    OutDir,
    console,
    err_console,
    existing_data_dir,
    usage_errors_exit_2,
    without_repeats,
)
from structbench.errors import UsageError
from structbench.execution.session import Events
from structbench.inert import inert, inert_markup

if TYPE_CHECKING:
    from structbench.execution.job import Job
    from structbench.execution.runner import Progress as RunProgress
    from structbench.execution.runner import RunOutcome
    from structbench.execution.session import GridResult
    from structbench.plan.grid import Cell, Plan

Optims = Annotated[list[str] | None, typer.Option("--optim", help="Optimizer (repeatable); default: the suite's list.")]
Seeds = Annotated[list[int] | None, typer.Option("--seed", help="Seed (repeatable); default: the suite's seeds.")]
Steps = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Override budget.steps (and drop budget.epochs); shortens eval_every and log_every in proportion "
        "when the suite's would leave fewer than 5 evaluations.",
    ),
]
Overrides = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a spec field: section.key=value; a list, log(a,b,n) or lin(a,b,n) sweeps it; "
        "hparams.*.key sets every optimizer's key.",
    ),
]
Sweep = Annotated[
    bool,
    typer.Option(
        "--sweep",
        help="Sweep the suite's [sweep.<optim>] search spaces (else each optimizer's declared tuning ranges).",
    ),
]
Search = Annotated[
    str | None, typer.Option(help="halton:N[:SEED] — N quasi-random settings per optimizer from the swept ranges.")
]
Rerun = Annotated[bool, typer.Option("--rerun", help="Run every cell, even those already in the store.")]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Print the expanded grid and which cells are cached; run nothing.")
]
Executor = Annotated[str, typer.Option(help="inline (this process), local (worker processes) or slurm.")]
Jobs = Annotated[int | None, typer.Option(help="Worker processes for --executor local (default: cores).")]
Partition = Annotated[str | None, typer.Option(help="Slurm partition.")]
Time = Annotated[str | None, typer.Option(help="Time limit per run: minutes or [D-]HH:MM:SS.")]
Gpus = Annotated[int | None, typer.Option(help="GPUs per run.")]
Cpus = Annotated[int | None, typer.Option(help="CPU cores per run (its torch threads).")]
Mem = Annotated[str | None, typer.Option(help="Memory per run, as sbatch --mem takes it (e.g. 8G).")]
ArrayParallelism = Annotated[int | None, typer.Option(help="At most this many runs of the array at once.")]
Extra = Annotated[
    list[str] | None, typer.Option("--slurm-extra", help="Any other sbatch option as key=value (repeatable).")
]
Wait = Annotated[bool, typer.Option("--wait", help="With slurm: wait for the runs and print them.")]
NprocPerNode = Annotated[
    int | None,
    typer.Option(
        help="Run each run as one torch.distributed (DDP) job of this many processes per node: torchrun here, "
        "srun with --executor slurm (gloo on CPU, nccl on CUDA)."
    ),
]
Nnodes = Annotated[int | None, typer.Option(help="Nodes per distributed run (--executor slurm).")]
CreateDataDir = Annotated[
    bool, typer.Option("--create-data-dir", help="Create the --data-dir directory when it does not exist.")
]
Quiet = Annotated[bool, typer.Option("--quiet", help="No progress bars or per-run lines.")]


@usage_errors_exit_2
def run(
    suite: Annotated[str, typer.Option("--suite", help="Suite name (see `structbench list suites`) or a .toml path.")],
    optims: Optims = None,
    seeds: Seeds = None,
    steps: Steps = None,
    overrides: Overrides = None,
    sweep: Sweep = False,
    search: Search = None,
    rerun: Rerun = False,
    dry_run: DryRun = False,
    executor: Executor = "inline",
    jobs: Jobs = None,
    slurm_partition: Partition = None,
    slurm_time: Time = None,
    slurm_gpus_per_run: Gpus = None,
    slurm_cpus_per_run: Cpus = None,
    slurm_mem: Mem = None,
    slurm_array_parallelism: ArrayParallelism = None,
    slurm_extra: Extra = None,
    wait: Wait = False,
    nproc_per_node: NprocPerNode = None,
    nnodes: Nnodes = None,
    device: Device = "auto",
    out: OutDir = Path("results"),
    data_dir: DataDir = None,
    create_data_dir: CreateDataDir = False,
    optim_aliases: OptimAliases = None,
    quiet: Quiet = False,
) -> None:
    """Run a suite's grid (optimizers x settings x seeds), skipping runs already stored, on the chosen executor."""
    from structbench.execution import session
    from structbench.plan import grid

    slurm = {"partition": slurm_partition, "time": slurm_time, "gpus_per_run": slurm_gpus_per_run}
    slurm |= {"cpus_per_run": slurm_cpus_per_run, "mem": slurm_mem, "array_parallelism": slurm_array_parallelism}
    optims, seeds = without_repeats("--optim", optims), without_repeats("--seed", seeds)
    request = grid.Request(
        suite, optims or [], seeds or [], steps, overrides or [], sweep, search, rerun, dry_run, executor, jobs,
        {**slurm, "extra": slurm_extra or []}, wait, nproc_per_node, nnodes, device, out,
        existing_data_dir(data_dir, create_data_dir), optim_aliases or [],
    )  # fmt: skip
    events = RichEvents(quiet)
    plan = grid.plan(request, events)
    if dry_run:
        console.print(grid_table(plan.cells, plan.cached, rerun))
        done = len(plan.cells) - len(plan.todo)
        console.print(f"{len(plan.cells)} runs: {done} cached, {len(plan.todo)} to run; nothing was run.")
        return
    code = print_result(session.run_grid(plan, events))
    if code:
        raise typer.Exit(code)


class RichEvents(Events):
    """A grid session's events as the terminal shows them: notes, progress bars (one per run in this process, one
    over the grid for workers), a line per stored run (unless quiet), and what went wrong."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.progress: Progress | None = None
        self.bar: Any = None

    def note(self, text: str) -> None:
        console.print(inert_markup(text))

    def warning(self, text: str) -> None:
        print(f"warning: {inert(text)}", file=sys.stderr)

    def grid_started(self, plan: Plan) -> None:
        request, cached = plan.request, len(plan.cells) - len(plan.todo)
        console.print(
            f"grid: {len(plan.cells)} runs — {cached} already stored, {len(plan.todo)} to run "
            f"({request.executor}{f', {plan.workers} workers' if request.executor == 'local' else ''}"
            f"{f', {plan.world_size} processes per run' if request.nproc_per_node is not None else ''})"
        )

    def debris_removed(self, out: Path, description: str) -> None:
        message = f"removed from {out}: {description} (left by an interrupted or crashed run)"
        print(inert(message), file=sys.stderr)

    def experiment_done(self, suite: str, seed: int, outcome: RunOutcome) -> None:
        show_experiment(suite, seed, outcome)

    @contextlib.contextmanager
    def runs(self, total: int, per_run: bool) -> Iterator[None]:
        columns = [TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} steps/s")] if per_run else []
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            *columns,
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            disable=self.quiet,
        )
        with progress:
            self.progress, self.bar = progress, None if per_run else progress.add_task("runs", total=total)
            yield

    def run_started(self, job: Job) -> Callable[[RunProgress], None]:
        from structbench.report.views import terminal

        progress = self.progress
        assert progress is not None
        label = inert_markup(job.cell.label)
        bar = progress.add_task(label, total=job.cell.suite.budget["steps"], loss="-", rate="-")

        def report(p: RunProgress) -> None:
            if p.evaluating is not None:
                progress.update(bar, completed=p.step, total=p.total, description=evaluating_label(label, p.evaluating))
                return
            loss, rate = terminal.fmt_num(p.loss), terminal.fmt_num(p.steps_per_s, 3)
            progress.update(bar, completed=p.step, total=p.total, loss=loss, rate=rate, description=label)

        return report

    def run_finished(self, job: Job) -> None:
        assert self.progress is not None
        self.progress.advance(self.bar)

    def run_stored(self, job: Job, row: dict[str, Any], path: Path) -> None:
        if not self.quiet and self.progress is not None:
            self.progress.console.print(inert_markup(f"{job.cell.label}: {row['status']} -> {path}"))

    def worker_failed(self, job: Job, message: str) -> None:
        assert self.progress is not None
        self.progress.console.print(inert_markup(message))

    def run_left(self, job: Job, message: str) -> None:
        if not self.quiet and self.progress is not None:
            self.progress.console.print(inert_markup(message))

    def slurm_submitted(self, count: int, array: str, partition: str | None, folder: Path, out: Path) -> None:
        console.print(
            f"submitted {count} runs as Slurm job array {array}"
            f"{f' to partition {partition}' if partition else ''}; logs under {inert_markup(folder)}; "
            f"`structbench status --out {inert_markup(out)}` shows progress."
        )


def evaluating_label(label: str, examples: int) -> str:
    """A run's progress label while it evaluates: with the examples evaluated, when the task says how many."""
    return f"{label} evaluating {examples:,} examples" if examples > 0 else f"{label} evaluating"


def print_result(result: GridResult) -> int:
    """Print the runs table, then what stopped the grid or the checks that failed; return the exit code the README
    promises."""
    from structbench.report.views import terminal

    if result.error is not None:
        print(f"error: {inert(result.error)}", file=sys.stderr)
        return result.exit_code()
    if result.submitted:
        return 0
    if result.training_rows:
        console.print(terminal.runs_table(result.training_rows))
    for line in result.left_summary():
        print(inert(line), file=sys.stderr)
    result.settle()
    if result.signum is not None:
        print(inert(interruption_summary(result.signum, result.stored_statuses, result.plan.planned)), file=sys.stderr)
    else:
        for line in result.failures:
            print(f"check failed: {inert(line)}", file=sys.stderr)
    return result.exit_code()


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


def grid_table(cells: list[Cell], cached: dict[str, str], rerun: bool) -> Table:
    table = Table(title="grid")
    for column in ("suite", "optimizer", "setting", "seed", "run key", "state"):
        table.add_column(column)
    for cell in cells:
        stored = cell.key in cached
        state = ("rerun (stored)" if rerun else "stored") if stored else "to run"
        table.add_row(
            inert_markup(cell.suite.name),
            inert_markup(cell.optim),
            inert_markup(cell.setting or "-"),
            str(cell.seed),
            cell.key,
            state,
        )
    return table


def show_experiment(suite: str, seed: int, outcome: RunOutcome) -> None:
    """Print an experiment's table (split into tables that fit the terminal, as the report's are) and its verdict on
    each claim."""
    from structbench.report.views import tables, terminal

    if outcome.table is not None:
        title = f"{suite} (seed {seed}) — run {outcome.row['run_id']}"
        terminal.print_table(console, tables.frame_table(outcome.table, title))
    for claim in outcome.claims:
        mark = "[green]holds[/green]" if claim.holds else "[red]does not hold[/red]"
        console.print(
            f"{mark}: {inert_markup(claim.statement)} {inert_markup(f'[{claim.source}]')} — "
            f"{inert_markup(claim.evidence)}"
        )
    if outcome.row["status"] != "ok":
        print(inert(f"{suite}: experiment ended {outcome.row['status']}: {outcome.row['error']}"), file=sys.stderr)


@usage_errors_exit_2
def status(out: OutDir = Path("results")) -> None:
    """Per suite and optimizer: runs done, failed (by status), queued and running on Slurm, and missing."""
    from structbench.execution import session

    if not out.is_dir():
        raise UsageError(f"results directory {out} does not exist; run `structbench run` first.")
    from structbench.store.health import skipped_line

    tallies, problems = session.grid_progress(out)
    for problem in problems:
        print(inert(skipped_line(problem)), file=sys.stderr)
    if not tallies:
        console.print(f"no grids or keyed runs in {inert_markup(out)}")
        return
    table = Table(title=f"status of {inert_markup(out)}")
    for column in ("suite", "optimizer", "done", "failed", "queued", "running", "missing"):
        table.add_column(column, justify="left" if column in ("suite", "optimizer", "failed") else "right")
    for (suite, optim_name), tally in tallies.items():
        failed = ", ".join(f"{status} {n}" for status, n in sorted(tally.failed.items())) or "0"
        row = (str(tally.done), inert_markup(failed), str(tally.queued), str(tally.running), str(tally.missing))
        table.add_row(inert_markup(suite), inert_markup(optim_name), *row)
    console.print(table)
