"""The training loop of one run (docs/measurement.md): optimizer steps, log windows, evaluations.

Each step's loss, learning rate and gradient norm stay on the device until the log window closes (a log point, an
evaluation, a checkpoint, the time limit or the last step). A window followed by an evaluation, a checkpoint, the
time limit or the end is read back at once, in one synchronisation (what follows needs its values, and synchronises
anyway); any other window's values are copied to the host without blocking (pinned memory and an event on CUDA) and
read when the next window closes, so a log point never waits for the device's queue. Its curve points carry the
training wall-clock at which its last step ended on the device (the last synchronised moment plus the device time
since, from the step clock's events). Either way the values are checked for divergence and turned into curve points;
a deferred window's divergence is found one window later, at the step where it happened. Evaluations are timed apart
from training, and checkpoints apart from both. `RunState` holds every measurement the loop accumulates, and is what
a checkpoint saves of the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from structbench import measure
from structbench.execution import checkpoint, signals
from structbench.execution.distributed import SINGLE, Comm
from structbench.optim.deferred import HostCopy
from structbench.plan.spec import SuiteSpec
from structbench.tasks import EvalResult, Task

NoSync = Callable[[], contextlib.AbstractContextManager[Any]]
"""DDP's `no_sync` (gradients not averaged over ranks), or a context that does nothing outside a distributed run."""
SaveCheckpoint = Callable[[int, "RunState"], None]


@dataclass
class Progress:
    """What the runner reports at each log point."""

    step: int
    total: int
    loss: float
    steps_per_s: float
    evaluating: int | None = None
    """None while training; while the run evaluates, the examples it evaluates (the task's `eval_items`; 0 when the
    task does not say)."""


@dataclass
class RunState:
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


@dataclass
class Pending:
    """The steps of the open log window: their losses and gradient norms still on the device, their learning rates."""

    losses: list[torch.Tensor] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    norms: list[torch.Tensor] = field(default_factory=list)


class _LoopClock:
    """The loop's seconds (checkpoints excluded) and its training seconds (evaluations excluded too), both continuing
    from where a resumed run's state left them."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.start = time.perf_counter()
        self.wall_before, self.loop_before = state.wall_s, state.loop_s
        self.eval_at_start, self.checkpoint_at_start = state.eval_s, state.checkpoint_s

    def loop_time(self) -> float:
        state = self.state
        return self.loop_before + time.perf_counter() - self.start - (state.checkpoint_s - self.checkpoint_at_start)

    def train_wall(self) -> float:
        return self.wall_before + self.loop_time() - self.loop_before - (self.state.eval_s - self.eval_at_start)


@dataclass
class _Schedule:
    """When, in optimizer steps, the loop logs, evaluates, checkpoints and stops (0: never)."""

    total: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    time_limit: float

    def window_ends(self, done: int, timed_out: bool, checkpoint_due: bool) -> bool:
        """Whether the log window closes after step `done`."""
        evaluation_due = bool(self.eval_every) and done % self.eval_every == 0
        return done % self.log_every == 0 or done == self.total or evaluation_due or timed_out or checkpoint_due

    def evaluates_at(self, done: int) -> bool:
        """Whether the loop evaluates after step `done` (the final evaluation comes after the loop)."""
        return bool(self.eval_every) and done % self.eval_every == 0 and done != self.total

    def reads_later(self, done: int, timed_out: bool, checkpoint_due: bool) -> bool:
        """Whether the window closing after step `done` is read at the next one: when nothing right after it needs
        its values (an evaluation, a checkpoint, the time limit or the end of the run)."""
        return not (timed_out or checkpoint_due or done == self.total or self.evaluates_at(done))

    def checkpoints_at(self, done: int) -> bool:
        return self.checkpoint_every > 0 and done % self.checkpoint_every == 0 and done != self.total


def train(
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    suite: SuiteSpec,
    device: torch.device,
    state: RunState,
    on_progress: Callable[[Progress], None] | None,
    save_checkpoint: SaveCheckpoint | None = None,
    comm: Comm = SINGLE,
    no_sync: NoSync = contextlib.nullcontext,
) -> EvalResult | None:
    """Run the budget's steps (from the step a resumed `state` reached); return the final evaluation, or None when
    the run diverged or timed out.

    In a distributed run the ranks start and stop the clock together (barriers), the logged losses are the mean over
    ranks (the global batch's loss) and the time-limit decision is taken once for all ranks, so every rank leaves
    the loop at the same step with the same status."""
    budget = suite.budget
    schedule = _Schedule(
        budget["steps"],
        budget["log_every"],
        budget["eval_every"],
        budget["checkpoint_every"] if save_checkpoint is not None else 0,
        budget["max_time_s"],
    )
    step_clock = measure.StepClock(device)
    task.model.train()
    measure.synchronize(device)
    comm.barrier()
    clock = _LoopClock(state)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    pending = Pending()
    window = _Anchor(clock.train_wall(), step_clock.mark())
    posted: _Posted | None = None
    try:
        for step in range(state.steps_done, schedule.total):
            train_step(task, optimizer, scheduler, step, budget, params, step_clock, pending, no_sync)
            done = step + 1
            timed_out = schedule.time_limit > 0 and comm.any(clock.loop_time() > schedule.time_limit, device)
            checkpoint_due = schedule.checkpoints_at(done)
            if not schedule.window_ends(done, timed_out, checkpoint_due):
                continue
            if posted is not None:
                settled, posted = posted, None
                if not _record_window(state, settled.read(), schedule):
                    return None
            if schedule.reads_later(done, timed_out, checkpoint_due):
                posted = _Posted(pending, step_clock.take(), comm, done, window)
                pending = Pending()
                _report(on_progress, state, schedule)
                continue
            if not _record_window(state, _read_now(pending, step_clock, clock, comm, done, timed_out), schedule):
                return None
            pending = Pending()
            _report(on_progress, state, schedule)
            if timed_out:
                state.status = "timeout"
                state.error = (
                    f"ran {clock.loop_time():.3g} s (training and evaluation), past budget.max_time_s = "
                    f"{schedule.time_limit:g} s"
                )
                return None
            if schedule.evaluates_at(done):
                announce_evaluation(on_progress, task, done, schedule.total)
                if not _evaluate_at(task, device, state, comm, suite, done, state.wall_s):
                    return None
            state.loop_s = clock.loop_time()
            if checkpoint_due:
                assert save_checkpoint is not None
                save_checkpoint(done, state)
            window = _Anchor(clock.train_wall(), step_clock.mark())
    except BaseException:
        if posted is not None and measure.device_usable(device):
            _record_window(state, posted.read(), schedule)
        raise
    measure.synchronize(device)
    comm.barrier()
    state.wall_s = clock.train_wall()
    announce_evaluation(on_progress, task, state.steps_done, schedule.total)
    return _final_evaluation(task, device, state, comm, suite)


def _report(on_progress: Callable[[Progress], None] | None, state: RunState, schedule: _Schedule) -> None:
    """Tell the caller where the run stands (the steps read back so far)."""
    if on_progress is not None:
        wall, done = state.wall_s, state.steps_done
        on_progress(Progress(done, schedule.total, state.last_train_loss, done / wall if wall > 0 else math.nan))


def announce_evaluation(on_progress: Callable[[Progress], None] | None, task: Task, step: int, total: int) -> None:
    """Tell the caller the run is about to evaluate after `step`, and on how many examples."""
    if on_progress is not None:
        on_progress(Progress(step, total, math.nan, math.nan, evaluating=int(getattr(task, "eval_items", 0))))


def train_step(
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    budget: dict[str, Any],
    params: list[torch.Tensor],
    clock: measure.StepClock,
    pending: Pending,
    no_sync: NoSync,
) -> None:
    """One optimizer step (its micro-batches, the clipping, the step and the schedule's), timed; its loss, learning
    rate and gradient norm join the open log window."""
    clock.step_start()
    optimizer.zero_grad(set_to_none=True)
    loss = _accumulate_gradients(task, step, budget["grad_accum"], no_sync)
    if budget["grad_clip"] > 0:
        pending.norms.append(torch.nn.utils.clip_grad_norm_(params, budget["grad_clip"]))
    clock.optim_start()
    optimizer.step()
    clock.step_end()
    pending.lrs.append(float(optimizer.param_groups[0]["lr"]))
    scheduler.step()
    pending.losses.append(loss.detach())


@dataclass
class _Anchor:
    """A point of the loop's training time read on the host right after the device was synchronised, with a stamp
    of the same moment on the device's timeline: a later step's training wall-clock is the anchor's plus the device
    time between the two stamps (no synchronisation needed to know when that step ended)."""

    wall_s: float
    stamp: Any


@dataclass
class _WindowValues:
    """A closed log window, read back: each step's loss, gradient norm (None without clipping), learning rate and
    (step, optimizer-step) seconds; the training wall-clock when its last step ended; the step it closed after."""

    losses: list[float]
    norms: list[float | None]
    lrs: list[float]
    timings: list[tuple[float, float]]
    wall: float
    done: int
    timed_out: bool = False


class _Posted:
    """A closed log window whose values are on their way to the host (non-blocking copies into pinned memory on
    CUDA) and are read when the next window closes: a log point then never waits for the device's queue."""

    def __init__(self, pending: Pending, stamps: measure.StepStamps, comm: Comm, done: int, anchor: _Anchor) -> None:
        self.losses = HostCopy(comm.mean(torch.stack(pending.losses).double()))
        self.norms = HostCopy(torch.stack(pending.norms).double()) if pending.norms else None
        self.lrs, self.stamps, self.done, self.anchor = pending.lrs, stamps, done, anchor

    def read(self) -> _WindowValues:
        losses = self.losses.tolist()
        norms = self.norms.tolist() if self.norms is not None else [None] * len(losses)
        timings = self.stamps.timings()
        wall = self.anchor.wall_s + measure.seconds_between(self.anchor.stamp, self.stamps.last_end)
        return _WindowValues(losses, norms, self.lrs, timings, wall, self.done)


def _read_now(
    pending: Pending, step_clock: measure.StepClock, clock: _LoopClock, comm: Comm, done: int, timed_out: bool
) -> _WindowValues:
    """Read the open window's values back in one synchronisation; its wall-clock is the loop's now."""
    losses = comm.mean(torch.stack(pending.losses).double()).cpu().tolist()
    norms = torch.stack(pending.norms).double().cpu().tolist() if pending.norms else [None] * len(losses)
    timings = step_clock.drain()
    return _WindowValues(losses, norms, pending.lrs, timings, clock.train_wall(), done, timed_out)


def _record_window(state: RunState, window: _WindowValues, schedule: _Schedule) -> bool:
    """Time the window's steps (the first step of the run is its compile step) and log its curve points; False when
    a loss is not finite (the run ends `diverged` at that step)."""
    first = window.done - len(window.losses) + 1
    for offset, (value, (step_s, optim_s), lr, grad_norm) in enumerate(
        zip(window.losses, window.timings, window.lrs, window.norms, strict=True)
    ):
        index = first + offset
        if not math.isfinite(value):
            state.status, state.steps_done, state.wall_s = "diverged", index, window.wall
            state.error = f"non-finite training loss ({value}) at step {index}"
            return False
        if index == 1:
            state.compile_s = step_s
        else:
            state.step_times.append(step_s)
            state.optim_times.append(optim_s)
        last = window.timed_out and index == window.done
        if index % schedule.log_every == 0 or index == schedule.total or last:
            state.curves.append(_train_point(index, window.wall, value, lr, step_s, optim_s, grad_norm))
    state.last_train_loss = window.losses[-1]
    state.steps_done, state.wall_s = window.done, window.wall
    return True


def _train_point(
    step: int, wall: float, loss: float, lr: float, step_s: float, optim_s: float, grad_norm: float | None
) -> dict[str, Any]:
    return {
        "step": step,
        "wall_s": wall,
        "split": "train",
        "loss": loss,
        "metric": None,
        "lr": lr,
        "step_time_s": step_s,
        "optim_time_s": optim_s,
        "grad_norm": grad_norm,
    }


def _evaluate_at(
    task: Task, device: torch.device, state: RunState, comm: Comm, suite: SuiteSpec, step: int, wall: float
) -> bool:
    """Evaluate inside the loop, log the points and check the target; False when the evaluation diverged."""
    result = evaluate(task, device, state, comm)
    state.curves += eval_points(step, wall, result)
    if _diverged_at_eval(state, step, result):
        return False
    _check_target(state, step, wall, result, task, suite.target["metric"], suite.target["value"])
    return True


def _final_evaluation(
    task: Task, device: torch.device, state: RunState, comm: Comm, suite: SuiteSpec
) -> EvalResult | None:
    """The evaluation after the last step (logged, target checked), or None when it diverged."""
    total = suite.budget["steps"]
    final = evaluate(task, device, state, comm)
    state.curves += eval_points(total, state.wall_s, final)
    if _diverged_at_eval(state, total, final):
        return None
    _check_target(state, total, state.wall_s, final, task, suite.target["metric"], suite.target["value"])
    return final


def evaluate(task: Task, device: torch.device, state: RunState, comm: Comm = SINGLE) -> Any:
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


def eval_points(step: int, wall_s: float, result: EvalResult) -> list[dict[str, Any]]:
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


def _diverged_at_eval(state: RunState, step: int, result: EvalResult) -> bool:
    """A non-finite evaluation loss (NaN, +inf or -inf) on the test or the validation split ends the run `diverged`,
    as a non-finite training loss does."""
    bad = next((loss for loss in (result.loss, result.selection_loss) if not math.isfinite(loss)), None)
    if bad is None:
        return False
    state.status = "diverged"
    state.error = f"non-finite evaluation loss ({bad}) at step {step}"
    return True


def _accumulate_gradients(task: Task, step: int, accum: int, no_sync: NoSync = contextlib.nullcontext) -> torch.Tensor:
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


def _reached(value: float, target: float, mode: str) -> bool:
    return value <= target if mode == "min" else value >= target


def _check_target(
    state: RunState, step: int, wall: float, result: EvalResult, task: Task, metric: str, value: float
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


def resume(
    saved: dict[str, Any],
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[RunState, EvalResult]:
    """Put a freshly built run into the checkpointed one's state; return its measurements and initial evaluation."""
    task.model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    task.load_stream_state(saved["stream"])
    checkpoint.restore_rng(saved["rng"])
    state = RunState(**saved["state"])
    state.resumed_from_step = saved["step"]
    return state, EvalResult(*saved["initial"])


def checkpoint_saver(
    out: Path,
    run_key: str,
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
    initial: EvalResult,
) -> SaveCheckpoint:
    """A function that checkpoints the run at a step boundary (signals deferred until the file is in place)."""

    def save(step: int, state: RunState) -> None:
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
