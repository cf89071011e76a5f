"""A run's row for the results store (docs/results-schema.md), built one way for training runs and numerical
experiments alike: `run_row` fills every column of the store's RUN_SCHEMA from named sources (the run's identity,
its outcome, its training measurements, its task, its optimizer, its memory, its environment), each a mapping of
column to value that the functions below compute from what the run produced."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import torch

from structbench import environment, measure
from structbench.execution.distributed import Comm
from structbench.execution.loop import RunState
from structbench.plan.spec import SuiteSpec
from structbench.store import write as store
from structbench.tasks import EvalResult, Task


def run_row(**sources: Mapping[str, Any]) -> dict[str, Any]:
    """Every RUN_SCHEMA column, in schema order, from the sources in the order given (a column no source names is
    null); a source naming a column outside the schema is a ValueError, as the store would never keep it."""
    row: dict[str, Any] = dict.fromkeys(store.RUN_SCHEMA.names)
    for name, columns in sources.items():
        unknown = sorted(set(columns) - row.keys())
        if unknown:
            raise ValueError(f"run row source {name!r} names columns outside the store's schema: {unknown}")
        row.update(columns)
    return row


def identity(
    run_id: str, suite: SuiteSpec, optim: str, seed: int, hparams: dict[str, Any], spec: dict[str, Any]
) -> dict[str, Any]:
    """What ran: the run's id, suite, task, optimizer, seed, hyperparameters and effective spec (JSON text)."""
    return {
        "run_id": run_id,
        "schema_version": store.SCHEMA_VERSION,
        "suite": suite.name,
        "task": suite.task,
        "optim": optim,
        "seed": seed,
        "hparams": json.dumps(hparams, sort_keys=True),
        "spec": json.dumps(spec, sort_keys=True, default=str),
    }


@dataclass(frozen=True)
class LoadProbe:
    """The machine's 1-minute load average and this process's CPU time when a run started."""

    load_start: float | None
    cpu_start: float

    @classmethod
    def start(cls) -> LoadProbe:
        return cls(environment.load_average(), time.process_time())

    def columns(self) -> dict[str, Any]:
        """The load averages at the run's start and end and the CPU seconds the process (all its threads) spent
        since the start: with `cpu_usable`, what says whether the run's timings shared the CPU."""
        return {
            "load_avg_start": self.load_start,
            "load_avg_end": environment.load_average(),
            "cpu_time_s": time.process_time() - self.cpu_start,
        }


def outcome(status: str, error: str | None, started: datetime, finished: datetime) -> dict[str, Any]:
    """How the run ended and when it started and finished."""
    return {"status": status, "error": error, "started_at": started, "finished_at": finished}


def training(state: RunState, task: Task | None, budget: dict[str, Any]) -> dict[str, Any]:
    """The training loop's measurements: steps, the clocks (training excludes the compile step), the per-step
    medians, the last training loss, time to target, checkpointing and throughput."""
    return {
        "steps": state.steps_done,
        "wall_s": state.wall_s,
        "train_s": state.wall_s - (0.0 if math.isnan(state.compile_s) else state.compile_s),
        "eval_s": state.eval_s,
        "compile_s": state.compile_s,
        "step_time_median_s": statistics.median(state.step_times) if state.step_times else math.nan,
        "optim_time_median_s": statistics.median(state.optim_times) if state.optim_times else math.nan,
        "final_train_loss": state.last_train_loss,
        "target_step": state.target_step,
        "target_s": state.target_s,
        "checkpoint_s": state.checkpoint_s,
        "resumed_from_step": state.resumed_from_step,
        **throughput(task, budget, state),
    }


def throughput(task: Task | None, budget: dict[str, Any], state: RunState) -> dict[str, Any]:
    """Items (tokens, images) per second of training, over the timed steps (the first, warm-up step excluded)."""
    items_per_call = getattr(task, "items_per_call", None) if task is not None else None
    if items_per_call is None or not state.step_times:
        return {"throughput_per_s": None, "throughput_unit": None}
    items = items_per_call * budget["grad_accum"] * len(state.step_times)
    return {"throughput_per_s": items / sum(state.step_times), "throughput_unit": f"{task.item_unit}/s"}


def evaluations(task: Task | None, initial: EvalResult | None, final: EvalResult | None) -> dict[str, Any]:
    """The task's facts (parameters, metric and data source) and its evaluations before training and after it."""
    return {
        "param_count": sum(p.numel() for p in task.model.parameters()) if task is not None else None,
        "final_eval_loss": final.loss if final else None,
        "final_eval_metric": final.metric if final else None,
        "final_val_loss": final.val_loss if final else None,
        "final_val_metric": final.val_metric if final else None,
        "eval_metric_name": task.metric_name if task is not None else None,
        "eval_metric_mode": task.metric_mode if task is not None else None,
        "initial_eval_loss": initial.loss if initial else None,
        "initial_eval_metric": initial.metric if initial else None,
        "data_source": task.data_source if task is not None else None,
    }


def optimizer_facts(
    optimizer: torch.optim.Optimizer | None, routing: dict[str, Any] | None, analytic_bytes: int | None
) -> dict[str, Any]:
    """The optimizer's solver events, its split of the parameters and the registry's analytic state size."""
    return {
        "solver_failures": int(getattr(optimizer, "solver_failures", 0)),
        "root_fallbacks": int(getattr(optimizer, "root_fallbacks", 0)),
        "routing": json.dumps(routing),
        "analytic_state_bytes": analytic_bytes,
    }


@dataclass
class PerRank:
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


def memory(probe: measure.MemoryProbe, per_rank: PerRank, comm: Comm) -> dict[str, Any]:
    """Peak memory (what measured it, and NVML's device-level figure) and optimizer-state bytes, over the ranks."""
    return {
        "peak_mem_bytes": per_rank.peak_mem_bytes,
        "peak_mem_source": probe.source,
        "state_bytes": per_rank.state_bytes,
        "nvml_mem_bytes": probe.nvml_used_bytes(),
        **per_rank.columns(comm),
    }
