"""Provenance facts stored with every run that need no torch: the command line, the git state of the structbench
checkout, the CPU, the thread settings of the environment and the versions of the packages that shape results.

measure.environment adds what torch knows (device, CUDA/cuDNN, GPUs, torch threads) and stores both with the run.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import structbench

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "OMP_DYNAMIC",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "MKL_DYNAMIC",
    "KMP_AFFINITY",
)
"""Environment variables that set or pin the threads of the BLAS and OpenMP libraries torch calls."""
PACKAGE_COLUMNS = {
    "numpy": "numpy_version",
    "pytorch_optimizer": "pytorch_optimizer_version",
    "tokenizers": "tokenizers_version",
    "torchvision": "torchvision_version",
}
"""Distributions whose versions shape results (data pipelines, reference optimizers), by their stored column."""


def command_line() -> str:
    """This process's command line as the operating system started it (sys.orig_argv: the interpreter's own
    arguments included, so `python -m structbench run ...` reads as typed), quoted for a POSIX shell."""
    return shlex.join(sys.orig_argv)


def checkout_root() -> Path | None:
    """The git checkout structbench runs from, or None for an installed copy."""
    root = Path(structbench.__file__).resolve().parent.parent
    return root if (root / ".git").exists() else None


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def git_commit(root: Path | None) -> str | None:
    """The commit checked out at `root`."""
    out = _git(root, "rev-parse", "HEAD") if root is not None else None
    return (out or "").strip() or None


def git_dirty(root: Path | None) -> bool | None:
    """Whether tracked files at `root` differ from its commit (staged or not), as `git describe --dirty` counts;
    untracked files do not count. None when `root` is not a checkout or git cannot tell."""
    out = _git(root, "status", "--porcelain", "--untracked-files=no") if root is not None else None
    return bool(out.strip()) if out is not None else None


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: what Slurm or taskset granted)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable and running processes), or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def contended(load: float | None, cores: int) -> bool:
    """Whether a load average exceeds the cores a run may use: its timings then share the CPU with other work."""
    return load is not None and load > cores


def contention_warning() -> str | None:
    """What `run` says once, before its runs, when the machine's load already exceeds this process's usable cores;
    None when it does not (or the system reports no load)."""
    load, cores = load_average(), usable_cores()
    if not contended(load, cores):
        return None
    return (
        f"the 1-minute load average is {load:.1f}, above the {cores} usable cores: step times measured now share the "
        "CPU with other work (each run records its load at start and end, and the report marks contended runs)."
    )


def thread_env() -> str:
    """The thread variables set in the environment (THREAD_ENV_VARS), as JSON text; "{}" when none is."""
    return json.dumps({name: os.environ[name] for name in THREAD_ENV_VARS if name in os.environ}, sort_keys=True)


def package_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def code_facts() -> dict[str, Any]:
    """The checkout's commit and state and the packages' versions, found once per process: the code a process runs
    is what it loaded, so each of its runs records them as its first run found them (and a grid of small runs does not
    start two git processes and read four packages' metadata per run)."""
    root = checkout_root()
    return {
        "git_commit": git_commit(root),
        "git_dirty": git_dirty(root),
        **{column: package_version(name) for name, column in PACKAGE_COLUMNS.items()},
    }


def facts() -> dict[str, Any]:
    """The torch-free provenance columns of a run row."""
    return {
        "command": command_line(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable_cores(),
        "thread_env": thread_env(),
        **code_facts(),
    }
