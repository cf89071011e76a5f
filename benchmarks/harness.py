"""What the harness-overhead benchmarks share: timing overrides, a harness run's row and rate, and the loop that
alternates bare and harness runs in one process and reports their ratio against the issue's target."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from structbench import measure
from structbench.execution.runner import execute, seed_everything
from structbench.optim import build_with_routing
from structbench.plan.schedule import make_scheduler
from structbench.plan.spec import SuiteSpec
from structbench.tasks import Task, TaskContext, get_task

OVERHEAD_TARGET = 0.99
"""Harness steps/s over bare-loop steps/s that the target asks for (docs/benchmarks.md)."""
REPEATS = 7
"""Interleaved harness and bare runs by default: enough for a median and a spread that one disturbed run cannot
move."""


def timing_overrides(steps: int, extra: Sequence[str]) -> list[str]:
    """Suite overrides for a timing run: exactly `steps` optimizer steps and no evaluation in between."""
    return ["budget.epochs=0", f"budget.steps={steps}", "budget.eval_every=0", *extra]


def autocast_for(enabled: bool, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The bf16 autocast a task trains under when its `autocast` is on, else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def bare_setup(
    suite: SuiteSpec, optim_name: str, seed: int, device: torch.device, data_root: Path, batch_size: int
) -> tuple[Task, torch.optim.Optimizer, Any]:
    """The task (built with `batch_size` examples per call), optimizer and scheduler a bare loop trains with, seeded
    as the runner seeds a run."""
    seed_everything(seed)
    ctx = TaskContext(seed=seed, device=device, data_root=data_root, batch_size=batch_size)
    task = get_task(suite.task).build(dict(suite.task_args), ctx)
    optimizer, _ = build_with_routing(optim_name, task.model, suite.hparams[optim_name])
    return task, optimizer, make_scheduler(optimizer, suite.budget["steps"], suite.schedule)


def timed_rate(steps: int, device: torch.device, train_step: Callable[[], None]) -> float:
    """Steps per second of `steps` calls of `train_step`, the first (warm-up) call left out, as the runner times."""
    start = 0.0
    for step in range(steps):
        if step == 1:
            measure.synchronize(device)
            start = time.perf_counter()
        train_step()
    measure.synchronize(device)
    return (steps - 1) / (time.perf_counter() - start)


def harness_row(suite: SuiteSpec, optim_name: str, seed: int, device: torch.device, data_root: Path) -> dict[str, Any]:
    """The row of one full harness run; raises when the run did not end ok."""
    row = execute(suite, optim_name, seed, device, data_root).row
    if row["status"] != "ok":
        raise RuntimeError(f"harness run ended {row['status']}: {row['error']}")
    return row


def row_rate(row: dict[str, Any]) -> float:
    """Steps per second of a harness run, first step excluded (its `train_s`)."""
    return (row["steps"] - 1) / row["train_s"]


def harness_rate(suite: SuiteSpec, optim_name: str, seed: int, device: torch.device, data_root: Path) -> float:
    """Steps per second of one full harness run, first step excluded."""
    return row_rate(harness_row(suite, optim_name, seed, device, data_root))


def release(device: torch.device) -> None:
    """Free what the last run left behind before the next one starts."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def alternate(
    repeats: int, bare: Callable[[], float], harness: Callable[[], float], device: torch.device
) -> dict[str, list[float]]:
    """Steps/s of `repeats` bare and harness runs, alternating which goes first; each rate is printed as it comes."""
    rates: dict[str, list[float]] = {"bare": [], "harness": []}
    for repeat in range(repeats):
        order = ("bare", "harness") if repeat % 2 == 0 else ("harness", "bare")
        for mode in order:
            rate = bare() if mode == "bare" else harness()
            rates[mode].append(rate)
            print(f"  repeat {repeat}  {mode:<8} {rate:9.2f} steps/s")
            release(device)
    return rates


def report_overhead(rates: dict[str, list[float]]) -> float:
    """Print medians, best runs and per-repeat ratios; return harness / bare of the medians."""
    bare, harness = statistics.median(rates["bare"]), statistics.median(rates["harness"])
    best_bare, best_harness = max(rates["bare"]), max(rates["harness"])
    pairs = [h / b for h, b in zip(rates["harness"], rates["bare"], strict=True)]
    print(
        f"steps/s, median (best) of {len(pairs)}: bare {bare:.2f} ({best_bare:.2f}), harness {harness:.2f} "
        f"({best_harness:.2f})"
    )
    print(
        f"harness / bare: medians {harness / bare:.4f}, best runs {best_harness / best_bare:.4f}; per repeat "
        f"{', '.join(f'{r:.4f}' for r in pairs)} (spread {min(pairs):.4f} to {max(pairs):.4f}); "
        f"target >= {OVERHEAD_TARGET}"
    )
    return harness / bare
