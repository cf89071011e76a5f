"""Real jobs through submitit on the Slurm cluster that `.ci/slurm.sh up` starts (skipped without one, outside CI)."""

from __future__ import annotations

import os
import sys
import time

import cloudpickle
import submitit

from tests.support.slurm_cluster import quiet_submitit_sacct, require_slurm, results_within

# By value, so a job need not import this module (its cwd or sys.path may not reach `tests`).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square_in_job(x: int) -> tuple[int, str, str]:
    return x * x, os.environ["SLURM_ARRAY_TASK_ID"], os.environ.get("SLURM_JOB_ID", "")


def test_job_array_runs_on_slurm(tmp_path):
    require_slurm()
    quiet_submitit_sacct()
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    # Slurm sends submitit's SIGUSR2 warning (asked for 90 s before the limit) up to a minute early: with a 2-minute
    # limit it came as two elements started, and killed them before Python could handle it.
    executor.update_parameters(timeout_min=10, cpus_per_task=1, slurm_array_parallelism=2)
    start = time.perf_counter()
    jobs = executor.map_array(square_in_job, [1, 2, 3])
    results = results_within(jobs, 240)
    elapsed = time.perf_counter() - start
    print(f"\n3-job Slurm array (parallelism 2): submission to results in {elapsed:.1f} s")

    assert [r[0] for r in results] == [1, 4, 9]
    assert [r[1] for r in results] == ["0", "1", "2"]
    job_ids = [r[2] for r in results]
    assert all(job_ids), "each element should run as a Slurm job (SLURM_JOB_ID set)"
    assert len(set(job_ids)) == 3
    assert len({job.job_id.split("_")[0] for job in jobs}) == 1, "one array, three elements"
