"""Resuming a built run from its checkpoint, or leaving it exactly as built when the checkpoint cannot be used.

`loop.resume` loads a checkpoint's state dicts into the freshly built model, optimizer, schedule and data stream, one
after another; a checkpoint that loads as a file but does not fit the run (a tensor of another shape, a missing
entry, a value of the wrong type) fails part way, after some of them changed. `resume_or_start_over` keeps what the
built run holds before it loads anything, and on any failure puts it all back (the model's parameters and buffers,
the optimizer's, the schedule's and the stream's states, the random number generators), so the run then starts from
step 0 as if no checkpoint had been there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from structbench.execution import checkpoint, loop
from structbench.tasks import EvalResult, Task

Scheduler = torch.optim.lr_scheduler.LRScheduler


@dataclass
class _Built:
    """What a freshly built run holds that loading a checkpoint changes (copied off the device)."""

    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    stream: dict[str, Any]
    rng: dict[str, Any]

    @classmethod
    def keep(cls, task: Task, optimizer: torch.optim.Optimizer, scheduler: Scheduler, device: torch.device) -> _Built:
        return cls(
            model={name: value.detach().to("cpu", copy=True) for name, value in task.model.state_dict().items()},
            optimizer=copy.deepcopy(optimizer.state_dict()),
            scheduler=copy.deepcopy(scheduler.state_dict()),
            stream=copy.deepcopy(task.stream_state()),
            rng=checkpoint.rng_state(device),
        )

    def put_back(self, task: Task, optimizer: torch.optim.Optimizer, scheduler: Scheduler) -> None:
        task.model.load_state_dict(self.model)
        optimizer.load_state_dict(self.optimizer)
        scheduler.load_state_dict(self.scheduler)
        task.load_stream_state(self.stream)
        checkpoint.restore_rng(self.rng)


def resume_or_start_over(
    saved: dict[str, Any],
    task: Task,
    optimizer: torch.optim.Optimizer,
    scheduler: Scheduler,
    device: torch.device,
    where: str,
) -> tuple[loop.RunState, EvalResult]:
    """`loop.resume` from `saved` (the checkpoint at `where`); when it fails, the run is put back as built and
    `checkpoint.Unusable` says why."""
    built = _Built.keep(task, optimizer, scheduler, device)
    try:
        return loop.resume(saved, task, optimizer, scheduler)
    except Exception as exc:
        built.put_back(task, optimizer, scheduler)
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise checkpoint.Unusable(
            f"checkpoint {where} does not fit this run ({type(exc).__name__}: {reason})"
        ) from None
