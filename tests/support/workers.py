"""kill -9 of a report while its worker processes draw or typeset."""

from __future__ import annotations

import subprocess
import time

import psutil


def kill_once_two_workers_run(report: subprocess.Popen) -> None:
    """kill -9 of `report` as soon as it has two worker processes; both must end within 10 s (any left are killed)."""
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2:
            assert report.poll() is None, "the report ended before both workers were seen"
            assert time.monotonic() < deadline
            workers = psutil.Process(report.pid).children()
            time.sleep(0.01)
        report.kill()
        report.wait()
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert alive == []
    finally:
        for process in workers:
            if process.is_running():
                process.kill()
