"""One run of a grid as a job any executor can place: the `Job` it needs, `run_job` that trains and stores it, and
`finish`, the one way a finished run enters the store (a local run and a distributed run's rank 0 alike).

The store is the only coordination between workers: each run is written by atomic rename, so runs placed in this
process, in worker processes, on Slurm or across torch.distributed ranks never need to talk to each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structbench.environment import command_line
from structbench.store.run_claims import Commander

if TYPE_CHECKING:
    from structbench.execution.runner import RunOutcome
    from structbench.plan.grid import Cell


@dataclass(frozen=True)
class Job:
    """Everything a worker needs for one run (picklable: it crosses process and machine boundaries)."""

    cell: Cell
    device: str
    data_root: str
    out: str
    executor: str
    parallel_runs: int
    threads: int | None
    supersede: tuple[str, ...] = ()
    """Run ids of earlier final runs of this key (a forced rerun): removed once this run has stored a final row."""
    time_limit_s: float | None = None
    """The cluster's time limit of the job running this run (Slurm), which tells a time-limit warning apart."""
    nproc_per_node: int = 0
    """Ranks per node of the torch.distributed job this run is (`structbench.execution.torchrun`); 0: one process, no
    torch.distributed."""
    nnodes: int = 1
    """Nodes of that job (Slurm only: torchrun here runs on this machine alone)."""
    command: str = field(default_factory=command_line)
    """The command line that planned the run (a worker's own command line is the executor's, not the user's)."""
    commander: Commander = field(default_factory=Commander.this_process)
    """The command that planned the run, named in its key's claim (structbench.store.run_claims)."""


@dataclass(frozen=True)
class Elsewhere:
    """A run this command left to another structbench on its store: its key was claimed by a live process of
    `holder` (a command's pid and host), or a final run of it, `stored_as`, was stored meanwhile."""

    holder: str | None = None
    stored_as: str | None = None

    def describe(self) -> str:
        if self.holder is not None:
            return f"left to another structbench on this store ({self.holder}), which is running it"
        return f"stored meanwhile by another structbench on this store (run {self.stored_as})"


@dataclass
class Finished:
    """A run that ended in a worker: its stored row, or the one-line reason the worker raised."""

    job: Job
    row: dict[str, Any] | None
    failure: str | None = None
    fatal: bool = False
    """The failure was the store's (StoreWriteError): the runs after it would fail to store too."""
    worker_died: bool = False
    """The pool broke (a worker was killed or crashed) before this run finished: it may start again."""
    elsewhere: Elsewhere | None = None
    """The run was left to another structbench on the store (run_job returned an Elsewhere)."""

    @classmethod
    def of(cls, job: Job, result: dict[str, Any] | Elsewhere) -> Finished:
        """What `run_job` returned for `job`: a stored row, or the run left to another structbench."""
        if isinstance(result, Elsewhere):
            return cls(job, None, elsewhere=result)
        return cls(job, result)


def finish(out: Path, job: Job, outcome: RunOutcome) -> None:
    """Store a finished run, with the command line that planned it; once its row is final, its checkpoint goes, and
    so do the earlier final runs of its key that it supersedes (a forced rerun)."""
    from structbench.execution import checkpoint
    from structbench.store import write as store

    outcome.row["command"] = job.command
    store.write_run(out, outcome.row, outcome.curves)
    if outcome.row["status"] in store.FINAL_STATUSES:
        checkpoint.remove(out, job.cell.key)
        if job.supersede:
            store.remove_runs(out, job.supersede)


def run_job(job: Job, on_progress: Callable[[Any], None] | None = None) -> dict[str, Any] | Elsewhere:
    """Train one cell, store it, and return the stored row with `interrupted` and the cell's `setting` added; or,
    when another structbench on the store runs the cell's key or has stored it meanwhile, leave it and say so
    (`Elsewhere`). The key is claimed while the run trains and is stored (structbench.store.run_claims).

    SIGINT and SIGTERM (and on Slurm the time-limit warning) interrupt the training only: the run is stored with
    status `interrupted` (or `timeout`) and a signal arriving while it is being stored waits until the write is done.
    The run continues from its checkpoint in the store if it has one; the checkpoint goes once a final row is stored.

    The garbage of the process is collected first and what survives is frozen out of the collector for the run
    (`structbench.heap`): the memory probe's collections then walk only what the run made, not torch's whole heap.
    """
    from structbench.execution import signals
    from structbench.optim import plugins

    plugins.ensure(job.cell.optim, job.cell.suite.plugins.get(job.cell.optim))
    signals.install(job.time_limit_s)
    with signals.armed(False), claimed(job) as elsewhere:
        if elsewhere is not None:
            return elsewhere
        outcome = _train_and_store(job, Path(job.out), on_progress)
    interrupted = outcome.interrupted or signals.received() is not None
    return {**outcome.row, "interrupted": interrupted, "setting": job.cell.setting}


@contextmanager
def claimed(job: Job) -> Iterator[Elsewhere | None]:
    """Hold the claim of the job's key for the block (structbench.store.run_claims): the block gets None, or, when
    another structbench runs the key or has stored a final run of it meanwhile, why the run is left to it."""
    from structbench.store import run_claims
    from structbench.store import write as store

    out = Path(job.out)
    claim = run_claims.claim(out, job.cell.key, job.commander)
    if isinstance(claim, run_claims.Held):
        yield Elsewhere(holder=claim.holder.describe())
        return
    with claim:
        stored = store.stored_final(out, job.cell.key, run_name_part(job), job.supersede)
        yield None if stored is None else Elsewhere(stored_as=stored)


def _train_and_store(job: Job, out: Path, on_progress: Callable[[Any], None] | None) -> RunOutcome:
    """Train the job's cell in this process (its garbage collected first, what survives frozen out of the collector
    for the run) and store it."""
    import gc

    import torch

    from structbench import heap, measure
    from structbench.execution.runner import execute

    if job.threads is not None:
        torch.set_num_threads(job.threads)
    device = measure.resolve_device(job.device)
    gc.collect()
    with heap.frozen():
        outcome = execute(
            job.cell.suite,
            job.cell.optim,
            job.cell.seed,
            device,
            Path(job.data_root),
            on_progress,
            run_key=job.cell.key,
            executor=job.executor,
            parallel_runs=job.parallel_runs,
            checkpoints=out,
        )
    finish(out, job, outcome)
    return outcome


def run_name_part(job: Job) -> str:
    """What the file name of every run of the job's cell holds (runner.new_run_id): `-<suite>-<optimizer>-s<seed>-`."""
    cell = job.cell
    return f"-{cell.suite.name}-{cell.optim}-s{cell.seed}-"


def one_line(error: BaseException) -> str:
    """A worker's exception as one line: its type and the last line of its message."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"
