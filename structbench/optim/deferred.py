"""Per-matrix checks computed on the device in one step and read on the host at the next, without draining the
device's queue.

An optimizer that must know whether an iterative root or polar factor met its tolerance would read a flag on the
host after computing it: on a GPU that read waits for every queued kernel (a synchronisation), so the host stops
feeding the device once per step. A `DeferredCheck` instead copies the flags to host memory without blocking
(pinned memory on CUDA) and records an event after the copy; the next step's `take` waits for that event only,
which marks work queued a whole forward and backward pass earlier, while the kernels queued since keep the device
busy. `take` always waits (it never skips a check whose copy is still in flight), so the optimizer's trajectory is
the same on every device and at every speed.

The price, stated wherever an optimizer uses it: a result that failed its check is used for the step it was made in;
the next step repairs it by the optimizer's fallback.

`structbench.optim.cost_profile` counts a read of a posted copy as a deferred read, apart from the host reads.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

_HOST_COPIES: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
"""The live host tensors `DeferredCheck.post` made, by id."""


def is_posted_copy(tensor: Tensor) -> bool:
    """Whether `tensor` is a host copy a `HostCopy` made (for `cost_profile`: reading it is deferred)."""
    return _HOST_COPIES.get(id(tensor)) is tensor


class HostCopy:
    """A tensor's values on their way to host memory: on CUDA copied without blocking into pinned memory, with an
    event recorded after the copy; `tolist` waits for that event only (on a CPU the copy is made at once)."""

    def __init__(self, tensor: Tensor) -> None:
        tensor = tensor.detach()
        self._event: torch.cuda.Event | None = None
        if tensor.device.type == "cuda":
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = tensor.to("cpu", copy=True)
        _HOST_COPIES[id(self._host)] = self._host

    def tolist(self) -> list:
        """The values (waiting for the copy's event, not for the device's whole queue)."""
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


class DeferredCheck:
    """One outstanding (k,) boolean check of a stack of k matrices, read one step after it was computed."""

    def __init__(self) -> None:
        self._copy: HostCopy | None = None

    @property
    def pending(self) -> bool:
        """Whether a check was posted and not taken yet."""
        return self._copy is not None

    def post(self, failed: Tensor) -> None:
        """Queue a copy of `failed` ((k,) bool on the matrices' device) to host memory; replaces any pending check."""
        self._copy = HostCopy(failed)

    def take(self) -> list[int]:
        """The indices that failed in the pending check ([] when none is pending); clears it."""
        if self._copy is None:
            return []
        flags = self._copy.tolist()
        self._copy = None
        return [index for index, failed in enumerate(flags) if failed]
