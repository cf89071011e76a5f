"""One run: build its task, optimizer and schedule, train it (structbench.execution.loop), record its row
(structbench.execution.record) (docs/measurement.md).

One call of `execute` trains one (suite, optimizer, seed) and returns the run's row and curve points;
it never raises for what happens inside the run: a non-finite loss ends it `diverged`, an out-of-memory
error `oom`, a solver failure `solver_error`, training past `budget.max_time_s` `timeout` (the curves so far
kept), any other exception `error` (with the traceback; a CUDA error's message included), and Ctrl-C
`interrupted` — the partial record is returned and the interrupt re-raised by the caller. The row's
`device_usable` is False when the device cannot run more work (a CUDA error poisons the process's context).

Before the first run of a process, `measure.warm_up` does the process's one-off device setup outside every run's
clock (`setup_s`), so the first run of a process is timed like the others; before each run's clock, its own first
steps run once untimed and are undone (`structbench.execution.warmup`, `warmup_s`), so the first launches of its
kernels stay out of its training time and time to target.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pandas as pd
import torch

from structbench import measure, optim
from structbench.errors import SolverError, UsageError
from structbench.execution import checkpoint, loop, record, resume, signals, warmup
from structbench.execution.distributed import SINGLE, Comm
from structbench.execution.loop import NoSync, Progress, RunState
from structbench.experiments import Claim, get_experiment
from structbench.optim import Routing, build_with_routing
from structbench.plan.schedule import make_scheduler
from structbench.plan.spec import SuiteSpec
from structbench.tasks import EvalResult, Task, TaskContext, get_task
from structbench.tasks.base import Shard


@dataclass
class RunOutcome:
    row: dict[str, Any]
    curves: list[dict[str, Any]]
    interrupted: bool = False
    table: pd.DataFrame | None = None
    claims: list[Claim] = field(default_factory=list)


SHARED_OUTCOMES = frozenset({"ok", "diverged", "timeout"})
"""Statuses every rank of a distributed run reaches together (from all-reduced losses and a shared time-limit
decision); any other ends one rank alone, which then takes part in no further collective."""


@dataclass
class _Run:
    """One training run as it goes: what it is, and what it has built and measured so far (a failure at any point
    leaves the row the pieces built before it)."""

    suite: SuiteSpec
    optim_name: str
    seed: int
    device: torch.device
    comm: Comm
    spec: dict[str, Any]
    state: RunState = field(default_factory=RunState)
    task: Task | None = None
    optimizer: torch.optim.Optimizer | None = None
    routing: dict[str, Any] | None = None
    analytic_bytes: int | None = None
    initial: EvalResult | None = None
    final: EvalResult | None = None
    setup_s: float = 0.0
    warmup_s: float = 0.0
    interrupted: bool = False
    checkpoint_discarded: str | None = None


def new_run_id(suite: str, optim_name: str, seed: int) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{suite}-{optim_name}-s{seed}-{uuid4().hex[:6]}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def execute(
    suite: SuiteSpec,
    optim_name: str,
    seed: int,
    device: torch.device,
    data_root: Path,
    on_progress: Callable[[Progress], None] | None = None,
    run_key: str | None = None,
    executor: str = "inline",
    parallel_runs: int = 1,
    checkpoints: Path | None = None,
    comm: Comm = SINGLE,
    run_id: str | None = None,
) -> RunOutcome:
    """Train one run and measure it; see the module docstring for how failures are recorded.

    With `comm` a rank of a torch.distributed job (see `_distribute`), every rank calls this with the same `run_id`;
    each trains its share of every batch, and all but rank 0 skip the evaluations (rank 0's result is broadcast).

    `run_key` (the grid's content key), `executor` and `parallel_runs` (how many runs shared this machine's cores
    while it ran) are stored with the row. With `checkpoints` (a store) and a run key, the run continues from the
    key's checkpoint there if one exists, and saves one every `budget.checkpoint_every` steps.
    """
    started = datetime.now(UTC)
    load = record.LoadProbe.start()
    run_id = run_id or new_run_id(suite.name, optim_name, seed)
    probe = measure.MemoryProbe(device)
    seed_everything(seed)
    ctx = _context(suite, seed, device, data_root, comm)
    run = _Run(suite, optim_name, seed, device, comm, suite.run_spec(optim_name, seed))
    try:
        with signals.armed():
            no_sync, scheduler = _build(run, ctx, probe)
            _train(run, scheduler, no_sync, on_progress, checkpoints, run_key)
    except UsageError:
        raise
    except (KeyboardInterrupt, Exception) as exc:
        run.interrupted = _ended_early(run.state, exc)
    state = run.state
    usable = measure.device_usable(device)
    if not usable and state.status == "ok":
        state.status, state.error = "error", f"the {device.type} device failed after the run (its context is unusable)"
    per_rank = _per_rank(comm, state, probe.peak_bytes() if usable else None, run.optimizer)
    finished = datetime.now(UTC)
    row = record.run_row(
        identity=record.identity(run_id, run.suite, optim_name, seed, run.suite.hparams[optim_name], run.spec),
        outcome=record.outcome(state.status, state.error, started, finished),
        training=record.training(state, run.task, run.suite.budget),
        evaluations=record.evaluations(run.task, run.initial, run.final),
        optimizer=record.optimizer_facts(run.optimizer, run.routing, run.analytic_bytes),
        memory=record.memory(probe, per_rank, comm),
        environment=measure.environment(device),
        load=load.columns(),
        placement={
            "run_key": run_key,
            "executor": executor,
            "parallel_runs": parallel_runs,
            "setup_s": run.setup_s,
            "warmup_s": run.warmup_s,
            "checkpoint_discarded": run.checkpoint_discarded,
            "device_usable": usable,
        },
    )
    return RunOutcome(row=row, curves=state.curves, interrupted=run.interrupted)


def _context(suite: SuiteSpec, seed: int, device: torch.device, data_root: Path, comm: Comm) -> TaskContext:
    """What the task is built with: each micro-batch's size, and this process's share of every batch."""
    micro_batch = suite.budget["batch_size"] // suite.budget["grad_accum"]
    return TaskContext(
        seed=seed, device=device, data_root=data_root, batch_size=micro_batch, shard=Shard(comm.rank, comm.world_size)
    )


def _build(
    run: _Run, ctx: TaskContext, probe: measure.MemoryProbe
) -> tuple[NoSync, torch.optim.lr_scheduler.LRScheduler]:
    """Build the run's task (its epochs resolved into steps, its resolved arguments added to the spec), its optimizer
    and learning-rate schedule; the run's warm-up steps (structbench.execution.warmup) run before its clock and its
    memory probe start (the probe starts from the built, warmed task). Returns the gradient-sync switch for
    the micro-batches before the last (DDP's `no_sync` in a distributed run) and the schedule."""
    run.setup_s = measure.warm_up(run.device)
    run.task = task = get_task(run.suite.task).build(dict(run.suite.task_args), ctx)
    run.suite = suite = resolve_epochs(run.suite, task)
    run.spec = suite.run_spec(run.optim_name, run.seed)
    resolved_args = getattr(task, "resolved_args", None)
    if resolved_args is not None:
        run.spec["task_args_resolved"] = resolved_args
    _check_target_metric(suite, task)
    no_sync = _distribute(task, run.device) if run.comm.active else contextlib.nullcontext
    hparams = suite.hparams[run.optim_name]

    def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        return make_scheduler(optimizer, suite.budget["steps"], suite.schedule)

    def throwaway_optimizer() -> torch.optim.Optimizer:
        return build_with_routing(run.optim_name, task.model, hparams)[0]

    run.warmup_s = warmup.warm_up_run(task, throwaway_optimizer, schedule, suite.budget, run.device, no_sync)
    probe.reset(empty_cache=suite.budget["empty_cache"])
    run.optimizer, route = build_with_routing(run.optim_name, task.model, hparams)
    run.routing = route.as_record()
    run.analytic_bytes = analytic_state_bytes(run.optim_name, task.model, route, hparams)
    return no_sync, schedule(run.optimizer)


def _train(
    run: _Run,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    no_sync: NoSync,
    on_progress: Callable[[Progress], None] | None,
    checkpoints: Path | None,
    run_key: str | None,
) -> None:
    """Start the built run (from its checkpoint, or with the initial evaluation at step 0) and train it."""
    assert run.task is not None and run.optimizer is not None
    task, optimizer, device, comm = run.task, run.optimizer, run.device, run.comm
    if not _resume(run, scheduler, checkpoints, run_key):
        loop.announce_evaluation(on_progress, task, 0, run.suite.budget["steps"])
        run.initial = loop.evaluate(task, device, run.state, comm)
        run.state.curves += loop.eval_points(0, 0.0, run.initial)
    saver = None
    if checkpoints is not None and run_key is not None and run.suite.budget["checkpoint_every"] > 0:
        saver = loop.checkpoint_saver(checkpoints, run_key, task, optimizer, scheduler, device, run.initial)
    run.final = loop.train(task, optimizer, scheduler, run.suite, device, run.state, on_progress, saver, comm, no_sync)


def _ended_early(state: RunState, exc: BaseException) -> bool:
    """Record in `state` how an exception ended the run; whether it was an interrupt (the caller re-raises it)."""
    if isinstance(exc, signals.Interrupted):
        state.status = "timeout" if exc.timed_out else "interrupted"
        if exc.timed_out:
            state.error = "the cluster's time-limit warning (SIGUSR2) arrived; the job was near its time limit"
        return True
    if isinstance(exc, KeyboardInterrupt):
        state.status = "interrupted"
        return True
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        state.status, state.error = "oom", (str(exc).splitlines() or [type(exc).__name__])[0]
    elif isinstance(exc, SolverError):
        state.status, state.error = "solver_error", str(exc)
    else:
        state.status, state.error = "error", "".join(traceback.format_exception(exc))
    return False


def _per_rank(comm: Comm, state: RunState, peak: int | None, optimizer: torch.optim.Optimizer | None) -> record.PerRank:
    """Gather each rank's peak memory and state bytes; a rank whose peers have failed keeps its own figures and
    ends `error` (the launcher reports the failing rank's traceback)."""
    mine = measure.state_bytes(optimizer) if optimizer is not None else None
    if not comm.active or state.status not in SHARED_OUTCOMES:
        return record.PerRank([peak], [mine])
    try:
        pairs = comm.gather((peak, mine))
    except Exception:
        state.status, state.error = "error", traceback.format_exc()
        return record.PerRank([peak], [mine])
    return record.PerRank([p for p, _ in pairs], [s for _, s in pairs])


def _distribute(task: Task, device: torch.device) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """Wrap the task's model in DistributedDataParallel (its training forward pass goes through the wrapper; rank 0's
    parameters are broadcast to all); return the wrapper's `no_sync`, for the micro-batches before the last."""
    from torch.nn.parallel import DistributedDataParallel

    if not hasattr(task, "distribute"):
        raise TypeError(f"task {type(task).__name__} cannot train under torch.distributed")
    ddp = DistributedDataParallel(
        task.model, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False
    )
    task.distribute(ddp)
    return ddp.no_sync


def _resume(
    run: _Run, scheduler: torch.optim.lr_scheduler.LRScheduler, out: Path | None, run_key: str | None
) -> bool:
    """Put the built run into the state of its key's checkpoint in the store, when the run checkpoints
    (`budget.checkpoint_every` > 0) and the checkpoint exists; whether it did. A checkpoint that does not load or
    does not fit the run is reported (on standard error and in the row's `checkpoint_discarded`) and the run,
    untouched, starts over from step 0 (structbench.execution.checkpoint)."""
    if out is None or run_key is None or run.suite.budget["checkpoint_every"] <= 0:
        return False
    assert run.task is not None and run.optimizer is not None
    try:
        saved = checkpoint.load(out, run_key)
        if saved is None:
            return False
        where = checkpoint.directory(out, run_key) / checkpoint.FILE
        run.state, run.initial = resume.resume_or_start_over(
            saved, run.task, run.optimizer, scheduler, run.device, str(where)
        )
    except checkpoint.Unusable as exc:
        run.checkpoint_discarded = str(exc)
        print(f"warning: {exc}; the run starts from step 0.", file=sys.stderr)
        return False
    return True


def _check_target_metric(suite: SuiteSpec, task: Task) -> None:
    target_metric = suite.target["metric"]
    if target_metric and target_metric not in (task.metric_name, "loss"):
        raise UsageError(
            f"target metric {target_metric!r} is not reported by task {suite.task!r}; "
            f"use {task.metric_name!r} or 'loss'."
        )


def resolve_epochs(suite: SuiteSpec, task: Task) -> SuiteSpec:
    """The suite with `budget.epochs` turned into optimizer steps (and per-epoch evaluation) for this task."""
    budget = suite.budget
    if budget["epochs"] <= 0:
        return suite
    micro_per_epoch = getattr(task, "steps_per_epoch", None)
    if micro_per_epoch is None:
        raise UsageError(f"task {suite.task!r} has no notion of an epoch; set budget.steps instead of budget.epochs.")
    per_epoch = max(1, micro_per_epoch // budget["grad_accum"])
    steps = max(1, round(budget["epochs"] * per_epoch))
    eval_every = budget["eval_every"] or per_epoch
    return dataclasses.replace(suite, budget={**budget, "steps": steps, "eval_every": eval_every})


def execute_experiment(suite: SuiteSpec, seed: int, device: torch.device) -> RunOutcome:
    """Run a numerical experiment once; its table and claims come back beside the run row."""
    started = datetime.now(UTC)
    definition = get_experiment(suite.experiment or "")
    seed_everything(seed)
    status, error, result, interrupted = "ok", None, None, False
    clock = time.perf_counter()
    try:
        result = definition.run(dict(suite.task_args), seed, device)
    except KeyboardInterrupt:
        status, interrupted = "interrupted", True
    except UsageError:
        raise
    except Exception:
        status, error = "error", traceback.format_exc()
    elapsed = time.perf_counter() - clock
    claims = json.dumps([{**vars(c), "holds": bool(c.holds)} for c in result.claims]) if result else None
    row = record.run_row(
        identity=record.identity(
            new_run_id(suite.name, "experiment", seed), suite, "-", seed, {}, {**suite.run_spec_base(), "seed": seed}
        ),
        outcome=record.outcome(status, error, started, datetime.now(UTC)),
        work={"steps": 0, "wall_s": elapsed, "train_s": elapsed, "eval_s": 0.0},
        result={"claims": claims, "data_source": "computed (numerical experiment)"},
        environment=measure.environment(device),
    )
    return RunOutcome(
        row=row,
        curves=[],
        interrupted=interrupted,
        table=result.table if result else None,
        claims=result.claims if result else [],
    )


def analytic_state_bytes(
    optim_name: str, model: torch.nn.Module, routing: Routing, hparams: dict[str, Any]
) -> int | None:
    """The registry's analytic state size for this model, when it gives one; formulas assume float32 parameters."""
    formula = optim.get(optim_name).state_bytes
    params = dict(model.named_parameters())
    if formula is None or any(p.dtype != torch.float32 for p in params.values()):
        return None
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    return int(formula([shapes[n] for n in routing.structured], [shapes[n] for n in routing.fallback], hparams))
