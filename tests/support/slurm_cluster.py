"""Helpers for tests that submit real jobs to a Slurm cluster (started by `bash .ci/slurm.sh up DIR`)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from typing import Any

from tests.support import system_parts

START_HINT = "run `bash .ci/slurm.sh up DIR` (needs slurm-wlm and munge) and `export SLURM_CONF=DIR/slurm.conf`"


def _missing(reason: str) -> None:
    # CI starts the cluster itself: there a missing cluster is a broken setup, not a reason to skip.
    system_parts.missing(f"a Slurm cluster ({reason})", START_HINT)


def require_slurm() -> None:
    """Return when `sbatch` exists and the cluster has a node that takes jobs; else skip (fail under CI=true)."""
    if shutil.which("sbatch") is None:
        _missing(f"no sbatch on PATH: {START_HINT}")
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        _missing(f"`sinfo -h -o %t` did not answer ({e}): {START_HINT}")
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mix", "alloc") for s in states):
        detail = out.stderr.strip().splitlines()[-1:] or states
        _missing(
            f"`sinfo -h -o %t` shows no idle/mixed/allocated node ({' '.join(detail) or 'no output'}; "
            f"SLURM_CONF={os.environ.get('SLURM_CONF', 'unset')}): {START_HINT}"
        )


class _DropSacctBypass(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Bypassing sacct error" not in record.getMessage()


def quiet_submitit_sacct() -> None:
    """Drop submitit's "Bypassing sacct error" warning, logged on every poll when accounting is off (harmless)."""
    log = logging.getLogger("submitit")
    if not any(isinstance(f, _DropSacctBypass) for f in log.filters):
        log.addFilter(_DropSacctBypass())


def results_within(jobs: list[Any], limit_s: float) -> list[Any]:
    """The submitit jobs' results, waiting at most `limit_s` for them all; past it, an AssertionError naming the jobs
    without a result, what squeue lists and the end of each one's error log (submitit alone waits forever for a job
    that died before writing its result on a cluster without accounting, such as this one)."""
    deadline = time.monotonic() + limit_s
    while not all(job.done() for job in jobs):
        if time.monotonic() > deadline:
            listing = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T %R"], capture_output=True, text=True)
            logs = {job.job_id: (job.stderr() or "").strip().splitlines()[-3:] for job in jobs if not job.done()}
            raise AssertionError(f"no result within {limit_s} s; squeue lists {listing.stdout!r}; error logs: {logs}")
        time.sleep(0.5)
    return [job.result() for job in jobs]
