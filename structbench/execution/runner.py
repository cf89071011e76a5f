"""The training loop and its measurements (docs/measurement.md).

One call of `execute` trains one (suite, optimizer, seed) and returns the run's row and curve points;
it never raises for what happens inside the run: a non-finite loss ends it `diverged`, an out-of-memory
error `oom`, a solver failure `solver_error`, training past `budget.max_time_s` `timeout` (the curves so far
kept), any other exception `error` (with the traceback; a CUDA error's message included), and Ctrl-C
`interrupted` — the partial record is returned and the interrupt re-raised by the caller. The row's
`device_usable` is False when the device cannot run more work (a CUDA error poisons the process's context).

Before the first run of a process, `measure.warm_up` does the process's one-off device setup outside every run's
clock (`setup_s`), so the first run of a process is timed like the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import statistics
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
from structbench.execution import checkpoint, signals
from structbench.execution.distributed import SINGLE, Comm
from structbench.experiments import Claim, get_experiment
from structbench.optim import Routing, build_with_routing
from structbench.plan.schedule import make_scheduler
from structbench.plan.spec import SuiteSpec
from structbench.store import write as store
from structbench.tasks import EvalResult, Task, TaskContext, get_task
from structbench.tasks.base import Shard


@dataclass
class Progress:
    """What the runner reports at each log point."""

    step: int
    total: int
    loss: float
    steps_per_s: float


@dataclass
class RunOutcome:
    row: dict[str, Any]
    curves: list[dict[str, Any]]
    interrupted: bool = False
    table: pd.DataFrame | None = None
    claims: list[Claim] = field(default_factory=list)


@dataclass
class _RunState:
    """Mutable measurements accumulated while a run trains."""

    steps_done: int = 0
    status: str = "ok"
    error: str | None = None
    step_times: list[float] = field(default_factory=list)
    optim_times: list[float] = field(default_factory=list)
    compile_s: float = math.nan
    wall_s: float = 0.0
    eval_s: float = 0.0
    last_train_loss: float = math.nan
    target_step: int | None = None
    target_s: float | None = None
    curves: list[dict[str, Any]] = field(default_factory=list)
    loop_s: float = 0.0
    """Seconds the training loop ran (steps, evaluations; checkpoints excluded) up to the last step boundary."""
    checkpoint_s: float = 0.0
    resumed_from_step: int | None = None


def new_run_id(suite: str, optim_name: str, seed: int) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{suite}-{optim_name}-s{seed}-{uuid4().hex[:6]}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _reached(value: float, target: float, mode: str) -> bool:
    return value <= target if mode == "min" else value >= target


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
    run_id = run_id or new_run_id(suite.name, optim_name, seed)
    probe = measure.MemoryProbe(device)
    state = _RunState()
    task: Task | None = None
    optimizer: torch.optim.Optimizer | None = None
    routing: dict[str, Any] | None = None
    analytic_bytes: int | None = None
    initial: Any = None
    final: Any = None
    interrupted = False
    setup_s = 0.0

    seed_everything(seed)
    micro_batch = suite.budget["batch_size"] // suite.budget["grad_accum"]
    ctx = TaskContext(
        seed=seed,
        device=device,
        data_root=data_root,
        batch_size=micro_batch,
        shard=Shard(comm.rank, comm.world_size),
    )
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    spec = suite.run_spec(optim_name, seed)
    try:
        with signals.armed():
            setup_s = measure.warm_up(device)
            task = get_task(suite.task).build(dict(suite.task_args), ctx)
            suite = resolve_epochs(suite, task)
            spec = suite.run_spec(optim_name, seed)
            resolved_args = getattr(task, "resolved_args", None)
            if resolved_args is not None:
                spec["task_args_resolved"] = resolved_args
            _check_target_metric(suite, task)
            if comm.active:
                no_sync = _distribute(task, device)
            probe.reset()
            optimizer, route = build_with_routing(optim_name, task.model, suite.hparams[optim_name])
            routing = route.as_record()
            analytic_bytes = analytic_state_bytes(optim_name, task.model, route, suite.hparams[optim_name])
            scheduler = make_scheduler(optimizer, suite.budget["steps"], suite.schedule)
            saved = _load_checkpoint(checkpoints, run_key)
            if saved is not None:
                state, initial = _resume(saved, task, optimizer, scheduler)
            else:
                initial = _evaluate(task, device, state, comm)
                state.curves += _eval_points(0, 0.0, initial)
            saver = None
            if checkpoints is not None and run_key is not None and suite.budget["checkpoint_every"] > 0:
                saver = _checkpoint_saver(checkpoints, run_key, task, optimizer, scheduler, device, initial)
            final = _train(task, optimizer, scheduler, suite, device, state, on_progress, saver, comm, no_sync)
    except signals.Interrupted as exc:
        state.status, interrupted = ("timeout" if exc.timed_out else "interrupted"), True
        if exc.timed_out:
            state.error = "the cluster's time-limit warning (SIGUSR2) arrived; the job was near its time limit"
    except KeyboardInterrupt:
        state.status, interrupted = "interrupted", True
    except (torch.OutOfMemoryError, MemoryError) as exc:
        state.status, state.error = "oom", (str(exc).splitlines() or [type(exc).__name__])[0]
    except SolverError as exc:
        state.status, state.error = "solver_error", str(exc)
    except UsageError:
        raise
    except Exception:
        state.status, state.error = "error", traceback.format_exc()
    usable = measure.device_usable(device)
    if not usable and state.status == "ok":
        state.status, state.error = "error", f"the {device.type} device failed after the run (its context is unusable)"

    per_rank = _per_rank(comm, state, probe.peak_bytes() if usable else None, optimizer)
    finished = datetime.now(UTC)
    train_times = state.step_times
    row = {
        "run_id": run_id,
        "schema_version": store.SCHEMA_VERSION,
        "suite": suite.name,
        "task": suite.task,
        "optim": optim_name,
        "seed": seed,
        "hparams": json.dumps(suite.hparams[optim_name], sort_keys=True),
        "spec": json.dumps(spec, sort_keys=True, default=str),
        "status": state.status,
        "error": state.error,
        "started_at": started,
        "finished_at": finished,
        "steps": state.steps_done,
        "wall_s": state.wall_s,
        "train_s": state.wall_s - (0.0 if math.isnan(state.compile_s) else state.compile_s),
        "eval_s": state.eval_s,
        "compile_s": state.compile_s,
        "step_time_median_s": statistics.median(train_times) if train_times else math.nan,
        "optim_time_median_s": statistics.median(state.optim_times) if state.optim_times else math.nan,
        "peak_mem_bytes": per_rank.peak_mem_bytes,
        "peak_mem_source": probe.source,
        "state_bytes": per_rank.state_bytes,
        "param_count": sum(p.numel() for p in task.model.parameters()) if task is not None else None,
        "final_train_loss": state.last_train_loss,
        "final_eval_loss": final.loss if final else None,
        "final_eval_metric": final.metric if final else None,
        "final_val_loss": final.val_loss if final else None,
        "final_val_metric": final.val_metric if final else None,
        "eval_metric_name": task.metric_name if task is not None else None,
        "target_step": state.target_step,
        "target_s": state.target_s,
        **measure.environment(device),
        "eval_metric_mode": task.metric_mode if task is not None else None,
        "initial_eval_loss": initial.loss if initial else None,
        "initial_eval_metric": initial.metric if initial else None,
        "nvml_mem_bytes": probe.nvml_used_bytes(),
        "solver_failures": int(getattr(optimizer, "solver_failures", 0)),
        "root_fallbacks": int(getattr(optimizer, "root_fallbacks", 0)),
        "routing": json.dumps(routing),
        "data_source": task.data_source if task is not None else None,
        "analytic_state_bytes": analytic_bytes,
        "claims": None,
        **_throughput(task, suite.budget, state),
        "run_key": run_key,
        "executor": executor,
        "parallel_runs": parallel_runs,
        "checkpoint_s": state.checkpoint_s,
        "resumed_from_step": state.resumed_from_step,
        "setup_s": setup_s,
        "device_usable": usable,
        **per_rank.columns(comm),
    }
    return RunOutcome(row=row, curves=state.curves, interrupted=interrupted)


@dataclass
class _PerRank:
    """A run's memory and optimizer-state figures over its ranks (one rank outside a torch.distributed job)."""

    peak_mem: list[int | None]
    state: list[int | None]

    @property
    def peak_mem_bytes(self) -> int | None:
        """The largest rank's peak: the memory each device must have."""
        known = [value for value in self.peak_mem if value is not None]
        return max(known) if known else None

    @property
    def state_bytes(self) -> int | None:
        """The largest rank's optimizer state: what one device holds (the whole state unless it is sharded)."""
        known = [value for value in self.state if value is not None]
        return max(known) if known else None

    def columns(self, comm: Comm) -> dict[str, Any]:
        known = [value for value in self.state if value is not None]
        return {
            "world_size": comm.world_size,
            "distributed_backend": comm.backend,
            "peak_mem_bytes_per_rank": json.dumps(self.peak_mem) if comm.active else None,
            "state_bytes_per_rank": json.dumps(self.state) if comm.active else None,
            "state_bytes_total": sum(known) if len(known) == len(self.state) == comm.world_size else None,
        }


SHARED_OUTCOMES = frozenset({"ok", "diverged", "timeout"})
"""Statuses every rank of a distributed run reaches together (from all-reduced losses and a shared time-limit
decision); any other ends one rank alone, which then takes part in no further collective."""


def _per_rank(comm: Comm, state: _RunState, peak: int | None, optimizer: torch.optim.Optimizer | None) -> _PerRank:
    """Gather each rank's peak memory and state bytes; a rank whose peers have failed keeps its own figures and
    ends `error` (the launcher reports the failing rank's traceback)."""
    mine = measure.state_bytes(optimizer) if optimizer is not None else None
    if not comm.active or state.status not in SHARED_OUTCOMES:
        return _PerRank([peak], [mine])
    try:
        pairs = comm.gather((peak, mine))
    except Exception:
        state.status, state.error = "error", traceback.format_exc()
        return _PerRank([peak], [mine])
    return _PerRank([p for p, _ in pairs], [s for _, s in pairs])


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


def _load_checkpoint(out: Path | None, run_key: str | None) -> dict[str, Any] | None:
    """The run key's checkpoint in the store, if any; one that does not load is reported and the run starts over."""
    if out is None or run_key is None:
        return None
    try:
        return checkpoint.load(out, run_key)
    except ValueError as exc:
        print(f"warning: {exc}; the run starts from step 0.", file=sys.stderr)
        return None


def _resume(
    saved: dict[str, Any],
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[_RunState, EvalResult]:
    """Put a freshly built run into the checkpointed one's state; return its measurements and initial evaluation."""
    task.model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    task.load_stream_state(saved["stream"])
    checkpoint.restore_rng(saved["rng"])
    state = _RunState(**saved["state"])
    state.resumed_from_step = saved["step"]
    return state, EvalResult(*saved["initial"])


def _checkpoint_saver(
    out: Path,
    run_key: str,
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
    initial: EvalResult,
) -> Callable[[int, _RunState], None]:
    """A function that checkpoints the run at a step boundary (signals deferred until the file is in place)."""

    def save(step: int, state: _RunState) -> None:
        measure.synchronize(device)
        start = time.perf_counter()
        with signals.deferred():
            payload = {
                "step": step,
                "model": task.model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": checkpoint.rng_state(device),
                "stream": task.stream_state(),
                "state": dataclasses.asdict(state),
                "initial": dataclasses.astuple(initial),
            }
            checkpoint.save(out, run_key, payload)
            state.checkpoint_s += time.perf_counter() - start

    return save


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


def _throughput(task: Task | None, budget: dict[str, Any], state: _RunState) -> dict[str, Any]:
    """Items (tokens, images) per second of training, over the timed steps (the first, warm-up step excluded)."""
    items_per_call = getattr(task, "items_per_call", None) if task is not None else None
    if items_per_call is None or not state.step_times:
        return {"throughput_per_s": None, "throughput_unit": None}
    items = items_per_call * budget["grad_accum"] * len(state.step_times)
    return {"throughput_per_s": items / sum(state.step_times), "throughput_unit": f"{task.item_unit}/s"}


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
    row = {column.name: None for column in store.RUN_SCHEMA}
    row.update(
        run_id=new_run_id(suite.name, "experiment", seed),
        schema_version=store.SCHEMA_VERSION,
        suite=suite.name,
        task=suite.task,
        optim="-",
        seed=seed,
        hparams="{}",
        spec=json.dumps({**suite.run_spec_base(), "seed": seed}, sort_keys=True, default=str),
        status=status,
        error=error,
        started_at=started,
        finished_at=datetime.now(UTC),
        steps=0,
        wall_s=elapsed,
        train_s=elapsed,
        eval_s=0.0,
        claims=json.dumps([{**vars(c), "holds": bool(c.holds)} for c in result.claims]) if result else None,
        data_source="computed (numerical experiment)",
        **measure.environment(device),
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


def _evaluate(task: Task, device: torch.device, state: _RunState, comm: Comm = SINGLE) -> Any:
    """The task's evaluation; in a distributed run rank 0's alone (on the full evaluation splits, as a single-process
    run evaluates), broadcast to the other ranks, which wait for it."""
    measure.synchronize(device)
    start = time.perf_counter()
    result = None
    if comm.is_main:
        was_training = task.model.training
        task.model.eval()
        with torch.no_grad():
            result = task.evaluate()
        task.model.train(was_training)
    result = comm.broadcast(result)
    state.eval_s += time.perf_counter() - start
    return result


def _eval_points(step: int, wall_s: float, result: EvalResult) -> list[dict[str, Any]]:
    """The evaluation's curve points: split "eval" (the test split) and, where the task holds one out, "val"."""
    splits: list[tuple[str, float | None, float | None]] = [("eval", result.loss, result.metric)]
    if result.validated:
        splits.append(("val", result.val_loss, result.val_metric))
    return [
        {
            "step": step,
            "wall_s": wall_s,
            "split": split,
            "loss": loss,
            "metric": metric,
            "lr": None,
            "step_time_s": None,
            "optim_time_s": None,
            "grad_norm": None,
        }
        for split, loss, metric in splits
    ]


def _train(
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    suite: SuiteSpec,
    device: torch.device,
    state: _RunState,
    on_progress: Callable[[Progress], None] | None,
    save_checkpoint: Callable[[int, _RunState], None] | None = None,
    comm: Comm = SINGLE,
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Any:
    """Run the budget's steps (from the step a resumed `state` reached); return the final evaluation, or None when
    the run diverged or timed out.

    In a distributed run the ranks start and stop the clock together (barriers), the logged losses are the mean over
    ranks (the global batch's loss) and the time-limit decision is taken once for all ranks, so every rank leaves
    the loop at the same step with the same status."""
    budget = suite.budget
    total, log_every, eval_every = budget["steps"], budget["log_every"], budget["eval_every"]
    checkpoint_every = budget["checkpoint_every"] if save_checkpoint is not None else 0
    target_metric, target_value = suite.target["metric"], suite.target["value"]
    clock = measure.StepClock(device)
    pending_losses: list[torch.Tensor] = []
    pending_lrs: list[float] = []
    task.model.train()
    measure.synchronize(device)
    comm.barrier()
    loop_start = time.perf_counter()
    wall_before, loop_before = state.wall_s, state.loop_s
    eval_at_start, checkpoint_at_start = state.eval_s, state.checkpoint_s

    def loop_time() -> float:
        return loop_before + time.perf_counter() - loop_start - (state.checkpoint_s - checkpoint_at_start)

    def train_wall() -> float:
        return wall_before + loop_time() - loop_before - (state.eval_s - eval_at_start)

    accum, clip = budget["grad_accum"], budget["grad_clip"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    pending_norms: list[torch.Tensor] = []
    time_limit = budget["max_time_s"]
    timed_out = False
    for step in range(state.steps_done, total):
        clock.step_start()
        optimizer.zero_grad(set_to_none=True)
        loss = _accumulate_gradients(task, step, accum, no_sync)
        if clip > 0:
            pending_norms.append(torch.nn.utils.clip_grad_norm_(params, clip))
        clock.optim_start()
        optimizer.step()
        clock.step_end()
        pending_lrs.append(float(optimizer.param_groups[0]["lr"]))
        scheduler.step()
        pending_losses.append(loss.detach())
        done = step + 1
        timed_out = time_limit > 0 and comm.any(loop_time() > time_limit, device)
        checkpoint_due = checkpoint_every > 0 and done % checkpoint_every == 0 and done != total
        if (
            done % log_every
            and done != total
            and (not eval_every or done % eval_every)
            and not timed_out
            and not checkpoint_due
        ):
            continue
        losses = comm.mean(torch.stack(pending_losses).double()).cpu().tolist()
        norms = torch.stack(pending_norms).double().cpu().tolist() if pending_norms else [None] * len(losses)
        timings = clock.drain()
        wall = train_wall()
        first = done - len(losses) + 1
        for offset, (value, (step_s, optim_s), lr, grad_norm) in enumerate(
            zip(losses, timings, pending_lrs, norms, strict=True)
        ):
            index = first + offset
            if not math.isfinite(value):
                state.status, state.steps_done, state.wall_s = "diverged", index, wall
                state.error = f"non-finite training loss ({value}) at step {index}"
                return None
            if index == 1:
                state.compile_s = step_s
            else:
                state.step_times.append(step_s)
                state.optim_times.append(optim_s)
            if index % log_every == 0 or index == total or (timed_out and index == done):
                state.curves.append(
                    {
                        "step": index,
                        "wall_s": wall,
                        "split": "train",
                        "loss": value,
                        "metric": None,
                        "lr": lr,
                        "step_time_s": step_s,
                        "optim_time_s": optim_s,
                        "grad_norm": grad_norm,
                    }
                )
        state.last_train_loss = losses[-1]
        state.steps_done, state.wall_s = done, wall
        pending_losses, pending_lrs, pending_norms = [], [], []
        if on_progress is not None:
            on_progress(Progress(done, total, losses[-1], done / wall if wall > 0 else math.nan))
        if timed_out:
            state.status = "timeout"
            state.error = (
                f"ran {loop_time():.3g} s (training and evaluation), past budget.max_time_s = {time_limit:g} s"
            )
            return None
        if eval_every and done % eval_every == 0 and done != total:
            result = _evaluate(task, device, state, comm)
            state.curves += _eval_points(done, wall, result)
            if _diverged_at_eval(state, done, result):
                return None
            _check_target(state, done, wall, result, task, target_metric, target_value)
        state.loop_s = loop_time()
        if checkpoint_due:
            assert save_checkpoint is not None
            save_checkpoint(done, state)
    measure.synchronize(device)
    comm.barrier()
    state.wall_s = train_wall()
    final = _evaluate(task, device, state, comm)
    state.curves += _eval_points(total, state.wall_s, final)
    if _diverged_at_eval(state, total, final):
        return None
    _check_target(state, total, state.wall_s, final, task, target_metric, target_value)
    return final


def _diverged_at_eval(state: _RunState, step: int, result: EvalResult) -> bool:
    """A non-finite evaluation loss (NaN, +inf or -inf) on the test or the validation split ends the run `diverged`,
    as a non-finite training loss does."""
    bad = next((loss for loss in (result.loss, result.selection_loss) if not math.isfinite(loss)), None)
    if bad is None:
        return False
    state.status = "diverged"
    state.error = f"non-finite evaluation loss ({bad}) at step {step}"
    return True


def _accumulate_gradients(
    task: Task,
    step: int,
    accum: int,
    no_sync: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> torch.Tensor:
    """Backpropagate `accum` micro-batches, each loss scaled by 1/accum; return their mean loss (detached). Under DDP
    the gradients are averaged over ranks once, after the last micro-batch (`no_sync` before it)."""
    if accum == 1:
        loss = task.train_loss(step)
        loss.backward()
        return loss
    total = torch.zeros((), device=next(task.model.parameters()).device)
    for index in range(accum):
        with no_sync() if index < accum - 1 else contextlib.nullcontext():
            loss = task.train_loss(step) / accum
            loss.backward()
        total += loss.detach()
    return total


def _check_target(
    state: _RunState, step: int, wall: float, result: EvalResult, task: Task, metric: str, value: float
) -> None:
    """Record the first evaluation at or past the target, on the validation split where the task holds one out; a
    target from a baseline has no value yet (NaN): skip."""
    if not metric or math.isnan(value) or state.target_step is not None:
        return
    if metric == "loss":
        reached = _reached(result.selection_loss, value, "min")
    else:
        reached = _reached(result.selection_metric, value, task.metric_mode)
    if reached:
        state.target_step, state.target_s = step, wall
