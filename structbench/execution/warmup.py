"""Each run's warm-up: its real training steps, run before the clock starts, then undone (docs/measurement.md).

The first steps of a run pay costs that later steps do not: the first launch of each of its kernels (cuBLAS and cuDNN
algorithm selection, lazily loaded kernels), the allocator's growth to the run's working set, an optimizer's
first-call paths. Time to target counts every second of the timed loop, so these costs would be charged to the
optimizer. Before its clock starts, a run therefore executes `budget.warmup_steps` of its real steps (micro-batches,
backward, clipping, optimizer step and schedule step, as `loop.train_step` runs them) with a throw-away optimizer and
schedule built like its own, then puts back everything those steps changed that a checkpoint would restore: the
model's parameters and buffers, the random number generators and the task's data stream. The timed run then starts
from the state it would have had without the warm-up (on a CPU its trajectory is bit-identical) and the warm-up's
seconds are stored apart, as `warmup_s`, outside `wall_s`, `train_s` and time to target. airbench
(KellerJordan/airbench, `airbench94.py`) and modded-nanogpt (KellerJordan/modded-nanogpt, `train_gpt.py`) warm their
real step before their clocks start in the same spirit.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch

from structbench import measure
from structbench.execution import checkpoint, loop
from structbench.tasks import Task

BuildOptimizer = Callable[[], torch.optim.Optimizer]
MakeSchedule = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def warm_up_run(
    task: Task,
    build_optimizer: BuildOptimizer,
    make_schedule: MakeSchedule,
    budget: dict[str, Any],
    device: torch.device,
    no_sync: loop.NoSync,
) -> float:
    """Run `budget["warmup_steps"]` real training steps of `task` with an optimizer from `build_optimizer`, restore
    the model, the random number generators and the data stream to where they were, and return the seconds it took
    (0.0 with no warm-up steps)."""
    steps = budget["warmup_steps"]
    if steps == 0:
        return 0.0
    measure.synchronize(device)
    start = time.perf_counter()
    model_state = {name: value.detach().clone() for name, value in task.model.state_dict().items()}
    rng = checkpoint.rng_state(device)
    stream = copy.deepcopy(task.stream_state())
    optimizer = build_optimizer()
    scheduler = make_schedule(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clock = measure.StepClock(device)
    for step in range(steps):
        loop.train_step(task, optimizer, scheduler, step, budget, params, clock, loop.Pending(), no_sync)
    measure.synchronize(device)
    task.model.load_state_dict(model_state)
    for param in task.model.parameters():
        param.grad = None
    task.load_stream_state(stream)
    checkpoint.restore_rng(rng)
    return time.perf_counter() - start
