"""One grid session: `run_grid` runs a planned grid (structbench.plan.grid.plan) on its executor and owns the store
for it.

It prepares the store and removes the debris of crashed runs, writes the grid's manifest (structbench.store.grids),
runs the numerical experiments, dispatches the runs to the executor (inline, local workers, Slurm, or torchrun for a
distributed run on this machine), accounts for a signal that stops the grid, and brings the store's index up to date.
It never prints: what happens is reported to an `Events` object (the command line's draws progress bars). Scripts
plan and run a grid the same way, silently with the base `Events`:

    events = session.Events()
    result = session.run_grid(grid.plan(grid.Request(suite="quadratic", out=Path("results")), events), events)
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structbench import heap
from structbench.errors import DeviceUnusableError, Registry, StoreWriteError, UsageError, did_you_mean
from structbench.execution.job import Elsewhere, Finished, Job

if TYPE_CHECKING:
    from structbench.execution.runner import Progress, RunOutcome
    from structbench.execution.slurm import SlurmOptions
    from structbench.plan.grid import Cell, Notes, Plan, Request
    from structbench.plan.spec import SuiteSpec
    from structbench.store.grids import Tally
    from structbench.store.write import Problem


class Events:
    """What a grid session reports as it runs. This base reports nothing (a script's grid runs silently); the command
    line's subclass prints notes and draws progress bars."""

    def note(self, text: str) -> None:
        """Something planning did (a suite found by another name, a budget shortened for --steps)."""

    def warning(self, text: str) -> None:
        """Something that looks wrong but does not stop the grid."""

    def grid_started(self, plan: Plan) -> None:
        """The grid is about to run (said only when it has cells)."""

    def debris_removed(self, out: Path, description: str) -> None:
        """Files an interrupted or crashed run left in the store were removed."""

    def experiment_done(self, suite: str, seed: int, outcome: RunOutcome) -> None:
        """A numerical experiment ran and was stored."""

    def runs(self, total: int, per_run: bool) -> contextlib.AbstractContextManager[Any]:
        """The span in which the grid's `total` runs go: with `per_run` they run one by one in this process (each
        reports its steps), else they finish in workers."""
        return contextlib.nullcontext()

    def run_started(self, job: Job) -> Callable[[Progress], None] | None:
        """A run starts in this process; what it calls at each log point."""
        return None

    def run_finished(self, job: Job) -> None:
        """A worker is done with a run, stored or not."""

    def run_stored(self, job: Job, row: dict[str, Any], path: Path) -> None:
        """A run's row is in the store, at `path`."""

    def worker_failed(self, job: Job, message: str) -> None:
        """A worker raised instead of storing its run; `message` says so in one line."""

    def run_left(self, job: Job, message: str) -> None:
        """A run was left to another structbench on the store (structbench.store.run_claims); `message` says so."""

    def slurm_submitted(self, count: int, array: str, partition: str | None, folder: Path, out: Path) -> None:
        """The runs went to Slurm as one job array, logging under `folder`."""


@dataclass
class GridResult:
    """How a grid ended: the rows it stored, what failed, and the signal or error that stopped it."""

    plan: Plan
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Runs whose worker failed, then (when no signal stopped the grid) the suite's checks that failed."""
    signum: int | None = None
    stored_statuses: list[str] = field(default_factory=list)
    """After a signal: the status of each run this grid stored."""
    error: str | None = None
    """The error that stopped the grid (the device unusable, the store unwritable), as one line."""
    submitted: bool = False
    """The runs went to Slurm and the grid did not wait for them."""
    left: list[Elsewhere] = field(default_factory=list)
    """Runs left to another structbench on the store: running there, or stored there meanwhile."""

    @property
    def training_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["task"].startswith("experiment:")]

    def left_summary(self) -> list[str]:
        """One line per other structbench that runs some of this grid's runs, and one for runs stored meanwhile."""
        from collections import Counter

        holders = Counter(e.holder for e in self.left if e.holder is not None)
        lines = [
            f"{count} run(s) left to another structbench on this store, {holder}: it is running them"
            for holder, count in sorted(holders.items())
        ]
        stored = sum(e.holder is None for e in self.left)
        if stored:
            lines.append(f"{stored} run(s) stored meanwhile by another structbench on this store: not run again")
        return lines

    def settle(self) -> None:
        """The command is done with the grid and its runs table (signals.settle): a signal received since the grid
        ended (its runs all stored) becomes the grid's, so the command reports it; any later one is ignored."""
        from structbench.execution import signals

        late = signals.settle()
        if self.signum is None and late is not None and not self.submitted:
            self.signum = late
            self.stored_statuses = [row["status"] for row in self.rows]

    def exit_code(self) -> int:
        """0 when every run is fine; the signal's code after one (signals.exit_code); else 1 on any failure."""
        from structbench.execution import signals

        if self.error is not None:
            return 1
        if self.signum is not None:
            return signals.exit_code(self.signum)
        return int(bool(self.failures) or any(r["status"] == "error" for r in self.rows))


def run_grid(plan: Plan, events: Events) -> GridResult:
    """Run `plan` on its executor into its store (module docstring); a signal or a fatal error ends it early."""
    from structbench.environment import contention_warning
    from structbench.execution import signals
    from structbench.store import grids
    from structbench.store import write as store

    out = plan.request.out
    if plan.cells:
        events.grid_started(plan)
    grid_id = grids.new_grid_id()
    session = _Session(plan, events, GridResult(plan), grid_id, _manifest(plan, grid_id))
    stored_before = store.run_ids(out)
    interrupted = False
    try:
        store.prepare(out)
        debris = store.clean(out)
        if debris.paths():
            events.debris_removed(out, debris.describe())
        for version, count in store.newer_runs(out).items():
            newer = f"{count} run file(s) in {out} {store.newer_message(version)}"
            events.warning(f"{newer}; this command leaves them untouched.")
        busy = contention_warning()
        if busy is not None:
            events.warning(busy)
        grids.write_manifest(out, grid_id, session.manifest)
        with signals.armed():
            session.run_experiments()
            session.dispatch()
            if session.result.submitted:
                return session.result
    except KeyboardInterrupt:
        interrupted = True
    except DeviceUnusableError as exc:
        session.result.error = " ".join(str(exc).splitlines())
        return session.result
    except StoreWriteError as exc:
        stored = len(store.run_ids(out) - stored_before)
        session.result.error = f"{exc}; the {stored} run(s) stored before by this command are intact."
        return session.result
    result = session.result
    result.signum = signals.received() or (signal.SIGINT if interrupted else None)
    if result.signum is None:
        result.signum = index_store(out)
    if result.signum is not None:
        result.stored_statuses = store.run_statuses(out, store.run_ids(out) - stored_before)
    else:
        result.failures += check_runs(result.rows, plan.checks)
    return result


def _manifest(plan: Plan, grid_id: str) -> dict[str, Any]:
    import sys

    return {
        "created": grid_id,
        "command": sys.argv,
        "executor": plan.request.executor,
        "device_kind": plan.device_kind,
        "cells": [
            {"key": c.key, "suite": c.suite.name, "optim": c.optim, "setting": c.setting, "seed": c.seed}
            for c in plan.cells
        ],
    }


@dataclass
class _Session:
    """A grid being run: its plan, where it reports, what it has stored so far."""

    plan: Plan
    events: Events
    result: GridResult
    grid_id: str
    manifest: dict[str, Any]

    def run_experiments(self) -> None:
        """Numerical-experiment suites run in this process (seconds each)."""
        from structbench import measure
        from structbench.execution.runner import execute_experiment
        from structbench.store import write as store

        request = self.plan.request
        device = measure.resolve_device(request.device) if request.executor == "inline" else None
        for suite in self.plan.suites:
            if suite.experiment is None:
                continue
            for seed in suite.seeds:
                outcome = execute_experiment(suite, seed, device or measure.resolve_device("auto"))
                store.write_run(request.out, outcome.row, outcome.curves, table=outcome.table)
                self.result.rows.append(outcome.row)
                self.events.experiment_done(suite.name, seed, outcome)
                if outcome.interrupted:
                    raise KeyboardInterrupt

    def dispatch(self) -> None:
        """The runs on the plan's executor."""
        EXECUTORS.lookup(self.plan.request.executor)(self)

    def inline(self) -> None:
        """Each run in this process, one after another; a distributed run as a torchrun job on this machine. What
        exists before the first run is frozen out of the garbage collector until the last (`structbench.heap`), so
        each run's collections walk only what the runs made."""
        from structbench.execution import job as job_module
        from structbench.execution import torchrun

        jobs = self.plan.jobs
        if self.plan.request.nproc_per_node is not None:
            self.collect(torchrun.run_torchrun_jobs(jobs))
            return
        with heap.frozen(), self.events.runs(len(jobs), per_run=True):
            for index, job in enumerate(jobs):
                row = job_module.run_job(job, self.events.run_started(job))
                if isinstance(row, Elsewhere):
                    self.leave(job, row)
                    continue
                self.result.rows.append(row)
                self.events.run_stored(job, row, _run_file(job, row))
                if row["interrupted"]:
                    raise KeyboardInterrupt
                if row["device_usable"] is False:
                    rest = [j.cell.label for j in jobs[index + 1 :]]
                    raise DeviceUnusableError(
                        f"the {job.device} device is unusable in this process after {job.cell.label} (stored as "
                        f"{row['status']}); {len(rest)} run(s) not done{': ' + ', '.join(rest) if rest else ''}. "
                        "Repeat the command to run them (the run cache skips the rest); --executor local runs each "
                        "run in a fresh process."
                    )

    def local(self) -> None:
        from structbench.execution import local

        self.collect(local.run_local(self.plan.jobs, self.plan.workers))

    def slurm(self) -> None:
        """Submit the runs as one job array and record the job ids in the grid's manifest; with --wait, collect
        them."""
        from structbench.execution import slurm
        from structbench.store import grids

        jobs, options, out = self.plan.jobs, self.plan.slurm, self.plan.request.out
        if not jobs:
            return
        assert options is not None
        folder = out.resolve() / ".submitit" / self.grid_id
        try:
            submitted = slurm.submit_slurm(jobs, options, folder)
        except UsageError:
            grids.remove_manifest(out, self.grid_id)
            raise
        ids = {job.cell.key: sub.job_id for job, sub in zip(jobs, submitted, strict=True)}
        self.manifest["submitit_folder"] = str(folder / "%j")
        for cell in self.manifest["cells"]:
            cell["job_id"] = ids.get(cell["key"])
        grids.write_manifest(out, self.grid_id, self.manifest)
        self.events.slurm_submitted(len(jobs), submitted[0].job_id.split("_")[0], options.partition, folder, out)
        if not self.plan.request.wait:
            self.result.submitted = True
            return
        self.collect(slurm.collect_slurm(jobs, submitted))

    def collect(self, finished: Iterable[Finished]) -> None:
        """Take runs as workers finish them."""
        with self.events.runs(len(self.plan.jobs), per_run=False):
            for one in finished:
                self.events.run_finished(one.job)
                if one.fatal:
                    raise StoreWriteError(one.failure)
                if one.elsewhere is not None:
                    self.leave(one.job, one.elsewhere)
                    continue
                if one.row is None:
                    self.result.failures.append(f"{one.job.cell.label}: the worker failed: {one.failure}")
                    self.events.worker_failed(one.job, self.result.failures[-1])
                    continue
                self.result.rows.append(one.row)
                self.events.run_stored(one.job, one.row, _run_file(one.job, one.row))

    def leave(self, job: Job, elsewhere: Elsewhere) -> None:
        """A run left to another structbench on the store: kept for the summary, and reported."""
        self.result.left.append(elsewhere)
        self.events.run_left(job, f"{job.cell.label}: {elsewhere.describe()}")


EXECUTORS: Registry[Callable[[_Session], None]] = Registry(
    "executor", (("inline", _Session.inline), ("local", _Session.local), ("slurm", _Session.slurm)), sort=False
)
"""The executors `run --executor` takes, each with how it runs a grid's jobs."""


def _run_file(job: Job, row: dict[str, Any]) -> Path:
    from structbench.store import write as store

    return store.runs_dir(Path(job.out)) / f"{row['run_id']}.parquet"


def grid_progress(out: Path) -> tuple[dict[tuple[str, str], Tally], list[Problem]]:
    """Per suite and optimizer of the grids recorded in `out`: runs done, failed, queued and running on Slurm (when
    `squeue` is on PATH), and missing; and the run files and manifests that could not be read (skipped)."""
    import shutil

    from structbench.execution import slurm
    from structbench.store import grids, read

    states = slurm.slurm_states if shutil.which("squeue") else None
    runs, problems = read.load_runs(out)
    tallies = grids.grid_status(out, runs[runs["run_key"].notna()], states)
    return tallies, problems + grids.read_manifests(out)[1]


def index_store(out: Path) -> int | None:
    """Bring the store index up to date at the end of a grid (errors are ignored: the index is an optimisation); a
    signal stops it at once. Returns the signal received meanwhile, or None."""
    from structbench.execution import signals
    from structbench.store.read import refresh_index

    with contextlib.suppress(signals.Interrupted), signals.armed():
        refresh_index(out)
    return signals.received()


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


def check_request(request: Request) -> int:
    """Install the signal handlers, check the executor options, and start the local workers' server early (its
    imports overlap with planning); return the world size of each run (1 without --nproc-per-node)."""
    from structbench.execution import signals

    signals.install()
    check_executor_options(request.executor, request.jobs, request.wait, request.slurm)
    world_size = check_distributed_options(request.executor, request.nproc_per_node, request.nnodes)
    if request.executor == "local" and not request.dry_run:
        from structbench.execution.local import start_worker_server

        start_worker_server()
    return world_size


def check_executor_options(executor: str, jobs: int | None, wait: bool, slurm_given: dict[str, Any]) -> None:
    """Usage errors for executor options that do not fit together, before anything is resolved or written."""
    if executor not in EXECUTORS:
        raise UsageError(
            f"--executor takes {', '.join(EXECUTORS)}, got {executor!r}." + did_you_mean(executor, EXECUTORS)
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
    suites: list[SuiteSpec], world_size: int, nproc_per_node: int, device_kind: str, executor: str
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


def slurm_placement(request: Request, notes: Notes) -> SlurmOptions | None:
    """With --executor slurm: the resources of each run, from the suite's `[resources]` and the command line; a
    warning when the time limit is too short to warn a run in time. Checks that sbatch is there, unless a dry run."""
    if request.executor != "slurm":
        return None
    from structbench.execution import slurm
    from structbench.plan import suite_file

    options = slurm.slurm_options(suite_file.read_suite_file(request.suite)[2].get("resources", {}), request.slurm)
    risk = slurm.early_warning_risk(options)
    if risk is not None:
        notes.warning(risk)
    if not request.dry_run:
        slurm.require_sbatch()
    return options


def resolve_device_kind(device: str, slurm: SlurmOptions | None) -> str:
    """The device kind the runs will use (part of every run key): on Slurm, cuda when runs get GPUs."""
    from structbench import measure

    if slurm is None:
        return measure.resolve_device(device).type
    if device == "auto":
        return "cuda" if slurm.gpus_per_run > 0 else "cpu"
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device takes auto, cpu or cuda, got {device!r}.")
    return device


def jobs_for(
    request: Request,
    todo: list[Cell],
    cached: dict[str, str],
    device_kind: str,
    data_root: Path,
    slurm: SlurmOptions | None,
) -> tuple[int, list[Job]]:
    """The worker count of the executor and a job for each cell to run, with the torch threads each run gets: the
    cores divided among the local workers or a distributed run's ranks, or the CPUs Slurm grants a run."""
    from structbench.environment import usable_cores
    from structbench.execution.local import threads_per_worker

    local = request.executor == "local"
    workers = request.jobs or usable_cores() if local else 1
    threads = threads_per_worker(workers) if local else None
    if request.nproc_per_node is not None:
        threads = threads_per_worker(request.nproc_per_node)
    if slurm is not None:
        threads = slurm.cpus_per_run
    torchrun = request.nproc_per_node is not None and request.executor == "inline"
    jobs = [
        Job(
            cell=cell,
            device=device_kind,
            data_root=str(data_root),
            out=str(request.out.resolve()),
            executor="torchrun" if torchrun else request.executor,
            parallel_runs=min(workers, len(todo)) if local else 1,
            threads=threads,
            supersede=(cached[cell.key],) if cell.key in cached else (),
            time_limit_s=slurm.time_min * 60.0 if slurm is not None else None,
            nproc_per_node=request.nproc_per_node or 0,
            nnodes=request.nnodes or 1,
        )
        for cell in todo
    ]
    return workers, jobs
