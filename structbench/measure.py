"""Measurements: step clocks, peak-memory probes, optimizer-state bytes and environment metadata.

Rules (docs/measurement.md): training time excludes evaluation and includes the optimizer step; on CUDA, steps are
timed with events that are read only when the runner synchronises anyway (at log points), never by a
host sync every step; peak GPU memory is `torch.cuda.max_memory_allocated` after a reset, with NVML's
device-level reading beside it when available; on CPU it is the process's peak resident set size during the run minus
its resident set just before the run (source `rss-delta`), so what earlier runs in the same process left resident
does not count towards a later run's figure (the first run of a process still counts the one-time allocations torch
makes on first use; a run in its own process, `--executor local`, has none of either).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import torch

import structbench
from structbench.environment import cpu_model
from structbench.environment import facts as environment_facts

PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


class StepClock:
    """Per-step wall time and optimizer-step time.

    CPU: `time.perf_counter` stamps. CUDA: three events per step, resolved lazily by `drain()`, which the
    runner calls at log points after it has synchronised for its own reasons.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[Any, Any, Any]] = []
        self._stamps: list[Any] = []

    def _stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def step_start(self) -> None:
        self._stamps = [self._stamp()]

    def optim_start(self) -> None:
        self._stamps.append(self._stamp())

    def step_end(self) -> None:
        self._stamps.append(self._stamp())
        start, optim_start, end = self._stamps
        self._pending.append((start, optim_start, end))

    def mark(self) -> Any:
        """A stamp of now, on the device's timeline (an event on CUDA), for `seconds_between`."""
        return self._stamp()

    def drain(self) -> list[tuple[float, float]]:
        """(step seconds, optimizer-step seconds) for every step since the last drain (synchronises on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
        return self.take().timings()

    def take(self) -> StepStamps:
        """The stamps of every step since the last take or drain, to be read later without a device-wide sync."""
        stamps = StepStamps(self.cuda, self._pending)
        self._pending = []
        return stamps


class StepStamps:
    """The (start, optimizer start, end) stamps of some steps; on CUDA, events that may still be in the queue."""

    def __init__(self, cuda: bool, stamps: list[tuple[Any, Any, Any]]) -> None:
        self.cuda, self.stamps = cuda, stamps

    @property
    def last_end(self) -> Any:
        return self.stamps[-1][2]

    def timings(self) -> list[tuple[float, float]]:
        """(step seconds, optimizer-step seconds) of each step; on CUDA waits for the last step's end event only."""
        if not self.cuda:
            return [(e - s, e - o) for s, o, e in self.stamps]
        if self.stamps:
            self.last_end.synchronize()
        return [(s.elapsed_time(e) / 1e3, o.elapsed_time(e) / 1e3) for s, o, e in self.stamps]


def seconds_between(start: Any, end: Any) -> float:
    """Seconds from stamp `start` to stamp `end` (both from one StepClock's `mark` or steps; on CUDA waits for
    `end`'s event, which must have been recorded after `start`'s)."""
    if isinstance(start, float):
        return end - start
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryProbe:
    """Peak memory over a run: CUDA max allocated (plus NVML's device-level peak, sampled in a background thread),
    or on CPU the process's peak RSS above its RSS when the probe was made (just before the run). Garbage is collected
    first (on CPU the C heap's free pages are handed back to the kernel, at the probe's making and at `reset`), so what
    earlier runs of the process freed neither counts towards this run's peak nor, reused, hides the run's own
    allocations from it. On CUDA `max_memory_allocated` counts allocations, not the allocator's cache, so the cache
    earlier runs left is kept (emptied only when asked, `budget.empty_cache`); NVML's device-level reading then
    includes it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.source = "cuda" if device.type == "cuda" else "rss-delta"
        self._rss_baseline_peak = 0
        self._nvml: PeakSampler | None = None
        self._rss_before = 0
        if device.type != "cuda":
            gc.collect()
            _release_free_heap()
            self._rss_before = int(psutil.Process().memory_info().rss)

    def reset(self, empty_cache: bool = False) -> None:
        """Start the peak from here. On CUDA the allocator's cache is kept unless `empty_cache` (emptying it makes
        the run grow its working set again, inside its clock, and NVML then reads this run's own reservations)."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if empty_cache:
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            reader = nvml_reader(
                nvml_index(torch.cuda.current_device() if self.device.index is None else self.device.index)
            )
            self._nvml = PeakSampler(reader) if reader is not None else None
            return
        _release_free_heap()
        if _reset_peak_rss():
            self._rss_baseline_peak = 0
        else:
            self._rss_baseline_peak = psutil.Process().memory_info().rss

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return max(0, max(peak_rss_bytes(), self._rss_baseline_peak) - self._rss_before)

    def nvml_used_bytes(self) -> int | None:
        """NVML's peak of the device's used memory since `reset` (all processes on it), or None without NVML."""
        if self._nvml is None:
            return None
        return self._nvml.stop()


class PeakSampler:
    """The largest value `read()` returned, sampled every `interval_s` in a daemon thread from creation to `stop`."""

    def __init__(self, read: Callable[[], int], interval_s: float = 0.05) -> None:
        self._read, self._interval_s = read, interval_s
        self._peak = read()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(self._interval_s):
            with contextlib.suppress(Exception):
                self._peak = max(self._peak, self._read())

    def stop(self) -> int:
        if not self._done.is_set():
            self._done.set()
            self._thread.join()
            with contextlib.suppress(Exception):
                self._peak = max(self._peak, self._read())
        return self._peak


def nvml_index(torch_index: int, visible: str | None = None) -> int | str:
    """NVML's name of torch's CUDA device `torch_index`: torch counts only the devices `CUDA_VISIBLE_DEVICES` lists,
    NVML all of them; an entry is a physical index or a GPU-/MIG- UUID (returned as a string)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if not visible or not visible.strip():
        return torch_index
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    entry = entries[torch_index]
    return int(entry) if entry.isdigit() else entry


def nvml_reader(index: int | str) -> Callable[[], int] | None:
    """A function reading the used memory of NVML device `index` (a physical index or a UUID), or None without
    NVML. NVML stays initialised for the process's lifetime."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if isinstance(index, str):
            handle = pynvml.nvmlDeviceGetHandleByUUID(index)
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:
        return None
    return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


_WARMED: set[str] = set()


def warm_up(device: torch.device) -> float:
    """One-off setup of this process on `device`, done before the first run's clock starts so that the first run of
    a process is timed like the others: the device context, the BLAS/cuBLAS and cuDNN/oneDNN handles, LAPACK, the
    autograd engine, the fused/foreach optimizer kernels and the allocator's first growth. Returns its seconds (0
    after the first call for that device)."""
    key = str(device)
    if key in _WARMED:
        return 0.0
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
    model = model.to(device)
    for make in (torch.optim.AdamW, torch.optim.SGD):
        optimizer = make(model.parameters(), lr=1e-3)
        inputs = torch.randn(2, 3, 8, 8, generator=generator).to(device)
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    matrix = torch.randn(16, 16, generator=generator, dtype=torch.float64).to(device)
    spd = matrix @ matrix.T + torch.eye(16, dtype=torch.float64, device=device)
    for dtype in (torch.float32, torch.float64):
        torch.linalg.eigh(spd.to(dtype))
        torch.linalg.qr(spd.to(dtype))
        torch.linalg.svd(spd.to(dtype))
    synchronize(device)
    _WARMED.add(key)
    return time.perf_counter() - start


def device_usable(device: torch.device) -> bool:
    """False when the device can no longer run work (a CUDA error, such as a device-side assert, poisons the
    process's CUDA context: every later call fails)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.zeros(1, device=device).add_(1).item()
    except Exception:
        return False
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    return getattr(ctypes.CDLL(None), "malloc_trim", None)


def _release_free_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc's `malloc_trim(0)`; nothing where the C library has no
    such call). Memory that earlier work freed stays resident in the heap, and a new allocation that reuses it does not
    raise the resident set: without this, a run that allocates 64 MiB can show a peak of 0 above its baseline."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        PROC_CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int:
    """The process's peak resident set size: VmHWM on Linux, else the current RSS."""
    with contextlib.suppress(OSError):
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return int(psutil.Process().memory_info().rss)


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Exact bytes of the tensors an optimizer holds in its state, each tensor counted once, as stored."""
    parts = getattr(optimizer, "parts", None)
    if parts is not None:
        return sum(state_bytes(part) for part in parts.values())
    seen: set[int] = set()
    total = 0
    for tensor in _tensors(optimizer.state_dict()["state"]):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def resolve_device(choice: str) -> torch.device:
    from structbench.errors import UsageError

    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda requested but torch sees no CUDA device; use --device cpu or auto.")
    if choice not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {choice!r}.")
    return torch.device(choice)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def environment(device: torch.device) -> dict[str, Any]:
    """Environment metadata stored with every run: where it ran (structbench.environment's facts and torch's)."""
    return {
        "device": device.type,
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "structbench_version": structbench.__version__,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        **environment_facts(),
        **numerics(),
        **gpus(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }


def gpus() -> dict[str, Any]:
    """The CUDA devices this process sees (their names, distinct ones joined by ", ") and the NVIDIA driver's
    version (through NVML); nulls without CUDA, and a null driver where NVML cannot be read."""
    if not torch.cuda.is_available():
        return {"gpu_count": 0, "gpu_name": None, "cuda_driver_version": None}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"gpu_count": len(names), "gpu_name": ", ".join(dict.fromkeys(names)), "cuda_driver_version": nvml_driver()}


def nvml_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no NVML library or no NVIDIA driver: the driver is unknown, not an error of the run
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def numerics() -> dict[str, Any]:
    """The CUDA, cuDNN and NCCL versions torch was built with and the TF32 switches, which change float32 results."""
    nccl = None
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "cuda_version": torch.version.cuda,
        "cudnn_version": str(cudnn) if cudnn is not None else None,
        "nccl_version": nccl,
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def environment_report() -> dict[str, str]:
    """What `structbench env` prints: devices, versions, and which memory probe a run would use."""
    cuda = torch.cuda.is_available()
    facts = environment_facts()
    report = {
        "default device": "cuda" if cuda else "cpu",
        "torch": torch.__version__,
        "CUDA (torch build)": str(torch.version.cuda),
        "CUDA available": str(cuda),
        "CPU": f"{cpu_model()} ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)",
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "python": platform.python_version(),
        "structbench": structbench.__version__,
        "thread variables": facts["thread_env"],
        "git": f"{facts['git_commit'] or 'not a checkout'}{' (uncommitted changes)' if facts['git_dirty'] else ''}",
    }
    if cuda:
        report["GPU"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        nvml = "available" if nvml_reader(nvml_index(0)) is not None else "unavailable"
        report["memory probe"] = f"cuda (torch.cuda.max_memory_allocated); NVML {nvml}"
    else:
        report["GPU"] = "none"
        rss = "VmHWM, reset per run" if _reset_peak_rss() else "current RSS (no resettable peak counter)"
        heap = "C heap trimmed first" if _malloc_trim() is not None else "no malloc_trim: reused freed memory is unseen"
        report["memory probe"] = f"rss-delta (process peak resident set above its size before the run: {rss}; {heap})"
    return report
