"""Measurement primitives against exact byte counts and the kernel's own counters."""

from __future__ import annotations

import torch

from structbench import measure
from structbench.plan.schedule import lr_factor


def test_state_bytes_of_adamw_and_sgd_are_exact():
    params = [torch.nn.Parameter(torch.randn(7, 5)), torch.nn.Parameter(torch.randn(3))]
    adamw = torch.optim.AdamW(params, lr=1e-3)
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    assert measure.state_bytes(adamw) == 0
    for p in params:
        p.grad = torch.ones_like(p)
    adamw.step()
    sgd.step()
    # exp_avg and exp_avg_sq (float32) per element, plus a float32 step scalar per parameter.
    assert measure.state_bytes(adamw) == 2 * 4 * (35 + 3) + 2 * 4
    assert measure.state_bytes(sgd) == 4 * (35 + 3)


def test_state_bytes_counts_low_precision_tensors_as_stored():
    p = torch.nn.Parameter(torch.randn(4, 4))
    opt = torch.optim.SGD([p], lr=0.1)
    opt.state[p]["codes"] = torch.zeros(8, dtype=torch.uint8)
    opt.state[p]["scales"] = torch.zeros(2, dtype=torch.float32)
    assert measure.state_bytes(opt) == 8 + 2 * 4


def test_peak_rss_probe_sees_an_allocation_and_resets():
    probe = measure.MemoryProbe(torch.device("cpu"))
    probe.reset()
    before = probe.peak_bytes()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    block += 1
    peak = probe.peak_bytes()
    assert peak - before >= 60 * 2**20
    del block
    probe.reset()
    assert probe.peak_bytes() < peak


PEAK_RSS_DELTA = """
import torch
from structbench import measure

held = torch.ones(64 * 2**20 // 4)
held += 1
probe = measure.MemoryProbe(torch.device("cpu"))
probe.reset()
print(probe.source, probe.peak_bytes())
block = torch.ones(32 * 2**20 // 4)
block += 1
print(probe.peak_bytes())
"""


def test_peak_rss_counts_from_the_resident_set_before_the_run():
    """What the process held before the probe was made (an earlier run's leftovers) is not the run's: a 64 MiB block
    held throughout adds nothing, a 32 MiB block touched during the run adds its 32 MiB. In a fresh process, so that
    nothing else is held."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PEAK_RSS_DELTA], capture_output=True, text=True, check=True)
    (source, before), (after,) = (line.split() for line in done.stdout.splitlines())
    assert source == "rss-delta"
    assert int(before) < 16 * 2**20
    assert 30 * 2**20 <= int(after) < 64 * 2**20


HEAP_FREED = """
import ctypes
import sys
import psutil
import torch
from structbench import measure

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]


def free_128_mib_of_heap():
    chunks = [libc.malloc(64 * 2**10) for _ in range(2048)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, 64 * 2**10)
    held = psutil.Process().memory_info().rss
    for chunk in chunks[:-1]:
        libc.free(chunk)
    print(held - psutil.Process().memory_info().rss)


before_the_probe = sys.argv[1] == "before"
if before_the_probe:
    free_128_mib_of_heap()
probe = measure.MemoryProbe(torch.device("cpu"))
if not before_the_probe:
    free_128_mib_of_heap()
probe.reset()
block = torch.ones(int(sys.argv[2]) * 2**20 // 4)
block += 1
print(probe.peak_bytes())
"""


def _peak_after_freeing_heap(when: str, block_mib: int) -> int:
    """Run HEAP_FREED: 128 MiB of the C heap is touched and freed in 64 KiB chunks (below glibc's 128 KiB mmap
    threshold, so they come from the heap; the last chunk stays allocated, so the heap's top cannot shrink), `when`
    the probe is made ("before") or between its making and its reset ("setup"); then the run touches a block of
    `block_mib` MiB. The freed pages stay resident, which is checked here."""
    import subprocess
    import sys

    script = [sys.executable, "-c", HEAP_FREED, when, str(block_mib)]
    returned_by_free, peak = (
        int(line) for line in subprocess.run(script, capture_output=True, text=True, check=True).stdout.splitlines()
    )
    assert returned_by_free < 16 * 2**20
    return peak


def test_peak_rss_sees_a_run_reusing_heap_memory_freed_before_it():
    """The run's 64 MiB block fits in the 128 MiB the heap holds free; unless the probe hands free pages back to the
    kernel when it is made, the block raises no RSS and the run's peak reads as about 0."""
    assert 60 * 2**20 <= _peak_after_freeing_heap("before", 64) < 80 * 2**20


def test_peak_rss_leaves_out_heap_memory_the_setup_freed():
    """128 MiB freed after the probe is made but before its reset (a task's build freeing a temporary buffer) is not
    the run's: unless the reset hands it back, the peak counter restarts at an RSS that still holds it, and a run that
    touches 8 MiB reads as 128 MiB or more."""
    assert 7 * 2**20 <= _peak_after_freeing_heap("setup", 8) < 32 * 2**20


def test_cpu_step_clock_measures_a_sleep():
    import time

    clock = measure.StepClock(torch.device("cpu"))
    clock.step_start()
    time.sleep(0.02)
    clock.optim_start()
    time.sleep(0.01)
    clock.step_end()
    ((step_s, optim_s),) = clock.drain()
    assert step_s >= 0.03 and 0.01 <= optim_s < step_s
    assert clock.drain() == []


def test_lr_schedules():
    constant = {"kind": "constant", "warmup_steps": 4, "min_lr_ratio": 0.0}
    assert [lr_factor(s, 10, constant) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = {"kind": "cosine", "warmup_steps": 0, "min_lr_ratio": 0.1}
    assert lr_factor(0, 100, cosine) == 1.0
    assert abs(lr_factor(50, 100, cosine) - 0.55) < 1e-12
    assert abs(lr_factor(100, 100, cosine) - 0.1) < 1e-12
    linear = {"kind": "linear", "warmup_steps": 0, "min_lr_ratio": 0.0}
    assert lr_factor(25, 100, linear) == 0.75
