"""What an optimizer step would cost on a GPU, counted on any device (a CPU included): a CPU's step time does not
predict a GPU's, but the counts that dominate there do not depend on the device.

Per step, `count` records
- `launches`: ATen operators that run a kernel (views, which only make new tensor metadata, and allocations without
  a fill are left out): on a GPU each is one kernel launch, about 5-10 us of fixed cost however small the tensor;
- `host_reads`: the places where Python reads a tensor's value (`item`, `tolist`, `bool`, `float`, `int`,
  `numpy`, `cpu`) or an operator whose output size depends on the values (`nonzero`, `masked_select`, indexing by a
  boolean mask, `unique`): on a GPU each waits for every queued kernel (a device synchronisation). Reads of tensors
  the optimizer keeps on the CPU by design (its step counters: `StructuredOptimizer.cpu_state_keys`, torch.optim's
  `step`) cost nothing there: they are counted apart as `counter_reads`; reads of the host copies a
  `structbench.optim.deferred.DeferredCheck` posted a step earlier wait only for that old work, not for the queue:
  counted apart as `deferred_reads`;
- `decompositions`: eigendecompositions, SVDs, QR and Cholesky factorisations, inverses and solves, by operator and
  input shape (cuSOLVER runs a batch of large matrices as one call per matrix, and most of them synchronise);
- `flops`: multiply-add FLOPs of the matrix products (mm, bmm, addmm, baddbmm, mv, dot), by the operands' dtype
  (float32 products run on CUDA cores unless TF32 is on; bfloat16 ones on tensor cores);
- `bytes_allocated`: bytes of the new tensors the step's operators return (in-place results and views excluded).
`profile` steps an optimizer on given weight shapes and reports the steady state, the refresh step and the mean
over the optimizer's full refresh interval (its entry's `refresh_interval` hyperparameter).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from structbench.optim import deferred

READS = {"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu"}
"""Tensor methods that bring a value to the host."""
VALUE_SIZED = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim"}
"""Operators whose output size depends on the values (the host must know it before anything else is queued)."""
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}
DECOMPOSITIONS = {
    "linalg_eigh", "_linalg_eigh", "linalg_eig", "linalg_eigvalsh", "linalg_svd", "_linalg_svd", "linalg_svdvals",
    "linalg_qr", "geqrf", "linalg_cholesky", "linalg_cholesky_ex", "cholesky", "linalg_inv", "linalg_inv_ex",
    "inverse", "linalg_solve", "_linalg_solve_ex", "linalg_solve_triangular", "triangular_solve", "linalg_lstsq",
    "cholesky_solve", "lu_factor", "linalg_lu_factor_ex",
}  # fmt: skip
DEFERRED = "deferred"
"""What `_Reads` records for a read of a `DeferredCheck`'s host copy."""
NO_KERNEL = {"empty", "empty_like", "empty_strided", "_local_scalar_dense", "lift_fresh", "set_", "resize_"}
"""Operators that allocate or read without running a kernel (a read is counted as such)."""


@dataclass
class StepCost:
    """The counts of one optimizer step (module docstring)."""

    launches: int = 0
    host_reads: Counter[str] = field(default_factory=Counter)
    counter_reads: int = 0
    deferred_reads: int = 0
    decompositions: Counter[str] = field(default_factory=Counter)
    flops: Counter[str] = field(default_factory=Counter)
    bytes_allocated: int = 0

    @property
    def reads(self) -> int:
        return sum(self.host_reads.values())


class _Reads(TorchFunctionMode):
    """Records the host reads made from Python, with the id of the tensor read; `reading` is set while one runs, so
    that its own operators are not counted again below."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, int]] = []
        self.reading = False

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name not in READS or self.reading or not args or not isinstance(args[0], torch.Tensor):
            return func(*args, **(kwargs or {}))
        self.made.append((DEFERRED if deferred.is_posted_copy(args[0]) else name.strip("_"), id(args[0])))
        self.reading = True
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.reading = False


class _Operators(TorchDispatchMode):
    """Counts launches, value-sized operators, decompositions, matmul FLOPs and new bytes at the ATen level."""

    def __init__(self, cost: StepCost, reads: _Reads) -> None:
        super().__init__()
        self.cost, self.reads = cost, reads

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or self.reads.reading:
            return out
        if name not in NO_KERNEL:
            self.cost.launches += 1
        if name in VALUE_SIZED or (name in INDEXING and _boolean_index(args)):
            self.cost.host_reads[name] += 1
        elif name == "_local_scalar_dense":  # a read made inside an operator, not from Python
            self.cost.host_reads["scalar read inside an operator"] += 1
        if name in DECOMPOSITIONS:
            self.cost.decompositions[f"{name} {tuple(args[0].shape)}"] += 1
        flops = matmul_flops(name, args)
        if flops:
            self.cost.flops[str(args[0].dtype).removeprefix("torch.")] += flops
        self.cost.bytes_allocated += _new_bytes(out, args)
        return out


def _boolean_index(args: Sequence[Any]) -> bool:
    indices = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


def matmul_flops(name: str, args: Sequence[Any]) -> int:
    """Multiply-add FLOPs (2 per multiply-add) of a matrix product operator, 0 for any other."""
    if name in ("mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_"):
        a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
        return 2 * a.numel() * b.shape[-1]
    if name in ("mv", "addmv", "addmv_"):
        matrix = args[0] if name == "mv" else args[1]
        return 2 * matrix.numel()
    if name == "dot":
        return 2 * args[0].numel()
    return 0


def _new_bytes(out: Any, args: Sequence[Any]) -> int:
    inputs = {t.untyped_storage().data_ptr() for t in _tensors(args)}
    return sum(
        t.untyped_storage().nbytes()
        for t in _tensors([out])
        if t.device.type != "meta" and t.untyped_storage().data_ptr() not in inputs
    )


def _tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def counter_tensors(optimizer: torch.optim.Optimizer) -> set[int]:
    """The ids of the state tensors an optimizer keeps on the CPU by design: its step counters."""
    parts = getattr(optimizer, "parts", None)
    if parts:
        return set().union(*(counter_tensors(part) for part in parts.values()))
    keys = set(getattr(optimizer, "cpu_state_keys", ())) | {"step"}
    return {id(value) for state in optimizer.state.values() for key, value in state.items() if key in keys}


def count(step: Callable[[], Any], optimizer: torch.optim.Optimizer | None = None) -> StepCost:
    """The counts of one call of `step`; reads of `optimizer`'s CPU counters (`counter_tensors`, before or after the
    step) are counted apart. A value computed from a counter and then read counts as a host read: an over-count,
    named in `host_reads` like any other."""
    cost = StepCost()
    counters = counter_tensors(optimizer) if optimizer is not None else set()
    reads = _Reads()
    with reads, _Operators(cost, reads):
        step()
    if optimizer is not None:
        counters |= counter_tensors(optimizer)
    for name, tensor in reads.made:
        if name == DEFERRED:
            cost.deferred_reads += 1
        elif tensor in counters:
            cost.counter_reads += 1
        else:
            cost.host_reads[name] += 1
    return cost


AS_ON_CUDA = {"batch_matrices": "on", "ns_dtype": "bfloat16", "root_check": "deferred"}
"""Hyperparameters whose default "auto" resolves by device, set as it resolves on CUDA (same-shape matrices stacked,
Muon's Newton–Schulz in bfloat16, FISMO's root checks read a step later), so that the counts are a GPU's, not this
device's."""
SHORT_INTERVAL = 3
"""The refresh interval the profile runs at, so that every path is reached in a few steps; what the refreshes add is
then spread over the default interval."""
WINDOW_CYCLES = 2
"""Refresh cycles counted after the warm-up step and one uncounted cycle."""


@dataclass
class Profile:
    """One optimizer's costs on given shapes: the steady-state step (the cheapest in the window), the refresh step
    (the costliest), and `amortised` values per step over a full refresh interval of the default length."""

    name: str
    matrices: int
    interval: int
    steady: StepCost
    refresh: StepCost
    window: list[StepCost]

    @property
    def cycle(self) -> int:
        """The shortened refresh interval the window ran at (1 for an optimizer without refreshes)."""
        return min(self.interval, SHORT_INTERVAL)

    def refresh_phases(self) -> set[int]:
        """The positions in the shortened cycle (window index mod `cycle`) of the steps that cost more than the
        steady state: where a refresh falls, for a run started like the profile's (`shortened_hparams`, one
        warm-up step, then whole cycles)."""
        return {
            index % self.cycle
            for index, cost in enumerate(self.window)
            if (cost.launches, cost.decompositions, cost.flops)
            != (self.steady.launches, self.steady.decompositions, self.steady.flops)
        } if self.interval > 1 else set()  # fmt: skip

    def amortised(self, value: Callable[[StepCost], float]) -> float:
        """`value` per step over one default refresh interval: the steady state plus what the window's refreshes add
        per cycle (the window holds `WINDOW_CYCLES` whole cycles of the shortened interval), spread over the default
        interval; the window's mean for an optimizer without refreshes."""
        if self.interval == 1:
            return sum(value(cost) for cost in self.window) / len(self.window)
        extra = sum(value(cost) - value(self.steady) for cost in self.window) / WINDOW_CYCLES
        return value(self.steady) + extra / self.interval


def shortened_hparams(name: str, hparams: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Optimizer `name`'s refresh interval under `hparams` (its default unless they set it), and `hparams` with the
    interval shortened to at most `SHORT_INTERVAL` (unchanged for an optimizer without refreshes: interval 1)."""
    from structbench import optim

    entry = optim.get(name)
    if entry.refresh_interval is None:
        return 1, dict(hparams)
    interval = int(optim.resolve_hparams(name, hparams)[entry.refresh_interval])
    return interval, {**hparams, entry.refresh_interval: min(interval, SHORT_INTERVAL)}


def profile(name: str, shapes: Sequence[tuple[int, ...]], overrides: dict[str, Any] | None = None) -> Profile:
    """Step optimizer `name` on weights of `shapes` (matrices its structured method owns) with fixed random
    gradients, its device-dependent switches as on CUDA (`AS_ON_CUDA`) unless `overrides` set them and its refresh
    interval shortened (`shortened_hparams`): one warm-up step (the states are made) and one uncounted cycle of the
    shortened interval (what happens once at the start, such as a first root, stays out), then `WINDOW_CYCLES`
    counted cycles."""
    from structbench import optim

    declared = optim.get(name).hparams.names()
    as_on_cuda = {key: value for key, value in AS_ON_CUDA.items() if key in declared}
    interval, hparams = shortened_hparams(name, as_on_cuda | dict(overrides or {}))
    generator = torch.Generator().manual_seed(0)
    named = []
    for index, shape in enumerate(shapes):
        weight = torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02)
        weight.grad = torch.randn(shape, generator=generator) * 1e-3
        named.append((f"layer{index}.weight", weight))
    optimizer = optim.make_optimizer(name, named, **hparams)
    cycle = min(interval, SHORT_INTERVAL)
    for _ in range(1 + cycle):
        optimizer.step()
    steps = WINDOW_CYCLES * cycle if interval > 1 else WINDOW_CYCLES
    window = [count(optimizer.step, optimizer) for _ in range(steps)]
    steady = min(window, key=lambda cost: (cost.launches, cost.reads, sum(cost.decompositions.values())))
    refresh = max(window, key=lambda cost: (cost.launches, sum(cost.decompositions.values())))
    return Profile(name, len(shapes), interval, steady, refresh, window)
