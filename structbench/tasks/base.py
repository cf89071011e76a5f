"""What a task gives the runner: a model, a training loss per step, and an untimed evaluation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import psutil
import torch
from torch import nn

from structbench.errors import UsageError


@dataclass(frozen=True)
class EvalResult:
    """One evaluation. `loss` and `metric` are the test split's (the held-out evaluation the report compares on, or a
    quadratic's exact objective); `val_loss` and `val_metric` the validation split's, where the task holds one out
    (None where it does not). Targets are checked on the validation split when there is one."""

    loss: float
    metric: float
    val_loss: float | None = None
    val_metric: float | None = None

    @property
    def validated(self) -> bool:
        """Whether the task evaluated a validation split."""
        return self.val_loss is not None

    @property
    def selection_loss(self) -> float:
        """The loss targets are checked on: the validation split's where there is one."""
        return self.loss if self.val_loss is None else self.val_loss

    @property
    def selection_metric(self) -> float:
        """The metric targets are checked on: the validation split's where there is one."""
        return self.metric if self.val_metric is None else self.val_metric


@dataclass(frozen=True)
class Shard:
    """This process's share of every training batch in a torch.distributed run: rank `rank` of `world_size`.

    Every rank draws the same global batch from the same seeded generators and keeps its contiguous block of it
    (sizes differ by at most one), so the global batch is the suite's `batch_size` whatever the
    world size. DDP averages the ranks' gradients: a rank's mean loss weighted by `weight` (its share of the batch
    times the world size) makes that average the gradient of the global batch's mean loss, with unequal shares too.
    """

    rank: int = 0
    world_size: int = 1

    def span(self, count: int) -> tuple[int, int]:
        """[start, stop) of this rank's block of a batch of `count`: the first `count % world_size` blocks one
        longer, as `torch.tensor_split` cuts."""
        size, extra = divmod(count, self.world_size)
        start = self.rank * size + min(self.rank, extra)
        return start, start + size + (1 if self.rank < extra else 0)

    def take(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's block of a global batch (the whole batch at world size 1)."""
        start, stop = self.span(len(batch))
        return batch[start:stop]

    def weight(self, local: int, total: int) -> float:
        """The factor on a rank's mean loss over `local` of the batch's `total` examples (exactly 1 for equal
        shares)."""
        return local * self.world_size / total


@dataclass(frozen=True)
class TaskContext:
    """Everything a task builder may use besides its own arguments."""

    seed: int
    device: torch.device
    data_root: Path
    batch_size: int
    shard: Shard = Shard()
    """The share of each training batch this process trains on (all of it outside a torch.distributed run)."""


class Task(Protocol):
    model: nn.Module
    metric_name: str
    metric_mode: Literal["min", "max"]
    data_source: str

    def train_loss(self, step: int) -> torch.Tensor:
        """The training loss of step `step` (0-based), with its graph attached."""
        ...

    def evaluate(self) -> EvalResult:
        """Loss and metric on the test split (or the exact objective), and on the validation split where the task
        holds one out; called under no_grad."""
        ...

    def stream_state(self) -> dict[str, Any]:
        """Where the training data stream stands (its generators, epoch order, position): saved in checkpoints."""
        ...

    def load_stream_state(self, state: dict[str, Any]) -> None:
        """Continue the data stream from a `stream_state()`, so the next batches are the ones that would have come."""
        ...


@dataclass(frozen=True)
class TaskDef:
    name: str
    summary: str
    defaults: Mapping[str, Any]
    build: Callable[[dict[str, Any], TaskContext], Task]
    preflight: Callable[[dict[str, Any], Path, int], None] | None = None
    """Checks that must pass before any run starts (e.g. the dataset is on disk), given the task arguments, the data
    root and the batch size each training call draws (the budget's batch size over its grad_accum); raises
    UsageError."""
    metric_name: str | None = None
    """The metric the task's evaluation reports, so that a suite's target is checked before any run (None: the
    runner checks it when the task is built)."""
    distributable: bool = False
    """The task trains under torch.distributed: it takes `TaskContext.shard` and has `distribute(ddp_module)`, which
    makes its training forward pass go through the DistributedDataParallel wrapper of its model."""


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A per-step batch, drawn on the CPU from the task's seeded generators (so a seed gives the same batches on every
    device), moved to `device` without a host sync: on CUDA through pinned memory with `non_blocking=True`, so the
    copy is queued on the stream and the CPU goes on (a copy from pageable memory would wait for the GPU)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def check_memory(what: str, needed_bytes: int) -> None:
    """A usage error when `needed_bytes` (a lower bound on what a task allocates before its first step) exceed this
    machine's memory, so that an impossible size fails before any run instead of in the allocator."""
    total = psutil.virtual_memory().total
    if needed_bytes > total:
        raise UsageError(
            f"{what} need at least {needed_bytes / 2**30:.1f} GiB, more than this machine's "
            f"{total / 2**30:.1f} GiB of memory."
        )
