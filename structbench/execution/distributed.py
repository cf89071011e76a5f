"""One run as a torch.distributed job: the process group of a rank, and the few collectives the runner needs.

A run started with `--nproc-per-node N` (`structbench.execution.torchrun`) runs as N processes per node, one rank each,
started by torchrun (`python -m torch.distributed.run`) on this machine or by Slurm's srun through submitit. Each rank
calls `join()`, which reads the rank, world size and rendezvous address torchrun or submitit's
`TorchDistributedEnvironment` put in the environment and initialises the default process group: gloo for CPU runs, nccl
for CUDA runs (one GPU per rank, the node-local rank's).

Every collective is bounded by the process group's timeout: the run's `budget.max_time_s` (plus
`COLLECTIVE_MARGIN_S` for the final evaluation, which the limit does not cover) when it sets one, else
`DEFAULT_COLLECTIVE_TIMEOUT_S`, so a rank that hangs cannot hold the others longer than that (gloo raises on
the waiting ranks; `structbench.execution.torchrun` stores the run `error`, saying which collective timed out, and has
the launcher stop the hung rank).

`Comm` is what the runner sees: in a single-process run (`SINGLE`) every operation is the identity, so the runner's
code reads the same either way.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0
"""A collective waits at most this long when the run has no `budget.max_time_s` (torch's own default for gloo)."""
COLLECTIVE_MARGIN_S = 60.0
"""What a collective may wait beyond `budget.max_time_s`: the final evaluation, which the limit does not cover."""


@dataclass(frozen=True)
class Comm:
    """This process's place in the run: rank `rank` of `world_size` over `backend` (None: a single-process run)."""

    rank: int = 0
    world_size: int = 1
    backend: str | None = None

    @property
    def active(self) -> bool:
        """Whether the run is a torch.distributed job (of any world size, 1 included)."""
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """The mean over ranks of `tensor` (a copy; `tensor` itself on a single process)."""
        if not self.active:
            return tensor
        total = tensor.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / self.world_size

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether `flag` holds on some rank: one decision every rank takes alike."""
        if not self.active:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


SINGLE = Comm()


def backend_for(device_kind: str) -> str:
    return "nccl" if device_kind == "cuda" else "gloo"


def join(device_kind: str, timeout_s: float) -> tuple[Comm, torch.device]:
    """Initialise this rank's default process group from the launcher's environment; return it and its device."""
    backend = backend_for(device_kind)
    device = torch.device("cpu")
    if device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=timeout_s), device_id=device if device.type == "cuda" else None
    )
    return Comm(dist.get_rank(), dist.get_world_size(), backend), device


def leave() -> None:
    """Destroy this rank's process group (local: no collective)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def collective_timeout(max_time_s: float) -> float:
    return max_time_s + COLLECTIVE_MARGIN_S if max_time_s > 0 else DEFAULT_COLLECTIVE_TIMEOUT_S


def timeout_origin(max_time_s: float) -> str:
    """Where `collective_timeout(max_time_s)` comes from, in words."""
    if max_time_s > 0:
        return f"budget.max_time_s {max_time_s:g} s + {COLLECTIVE_MARGIN_S:g} s"
    return "the default collective timeout: the run sets no budget.max_time_s"


def timed_out(error: str | None) -> bool:
    """Whether a rank's stored traceback ends in a collective that timed out: gloo's "Timed out waiting <ms> for
    <op> operation to complete", or the nccl watchdog's "collective operation timeout"."""
    lines = (error or "").strip().splitlines()
    last = lines[-1] if lines else ""
    return ("gloo" in last and "Timed out waiting" in last) or "collective operation timeout" in last
