"""One run of a grid as a torch.distributed job: started by torchrun on this machine, or by srun through submitit.

- This machine (`--executor inline` with `--nproc-per-node N`): `run_torchrun` starts
  `python -m torch.distributed.run --standalone --nproc-per-node N -m structbench.execution.torchrun JOB RESULT` and
  waits; torchrun starts the N ranks, each of which runs `run_rank`. Their output goes to `<out>/.distributed/<run
  key>.log`.
- Slurm (`--executor slurm`): each array element is one job of N tasks per node on `--nnodes` nodes; every task runs
  `slurm_rank`, which exports the rendezvous variables with submitit's `TorchDistributedEnvironment` and runs
  `run_rank`.

Only rank 0 writes the store. A rank whose run ends on its own (an exception, out of memory, a solver failure, a
signal) writes its status and traceback to `<out>/.distributed/<run id>/rank-<r>.json` before it leaves; its
departure breaks the others' next collective (gloo raises at once; nccl at the process group's timeout), and under
torchrun the launcher stops the others too. Rank 0 then stores the run with the status and traceback of the rank
that failed first. A collective that times out (a rank hung: `distributed.collective_timeout`) raises on the ranks
waiting in it; their error says so and names the ranks that never joined. Under torchrun, rank 0 exits with status 1
after storing a run that did not end together on every rank, so torchrun stops any rank still running.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from structbench.execution.job import Finished, Job, claimed, finish

if TYPE_CHECKING:
    from structbench.execution.distributed import Comm

FAILURES = ".distributed"
"""The store's directory of distributed runs' failure notes and launcher logs."""


def run_rank(job: Job, exit_on_failure: bool = True) -> dict[str, Any] | None:
    """Train this rank's part of the run; on rank 0 store it and return the stored row (with `interrupted` and the
    cell's `setting`), on the other ranks None. A non-zero rank that ended on its own exits with status 1 when
    `exit_on_failure` (torchrun then stops the other ranks), else returns None at once (a Slurm task: its task 0
    reports the run)."""
    from structbench.execution import distributed, signals
    from structbench.execution.runner import SHARED_OUTCOMES, execute, new_run_id

    signals.install(job.time_limit_s)
    with signals.armed(False):
        import torch

        if job.threads is not None:
            torch.set_num_threads(job.threads)
        cell = job.cell
        timeout = distributed.collective_timeout(cell.suite.budget["max_time_s"])
        comm, device = distributed.join(job.device, timeout)
        try:
            run_id = comm.broadcast(new_run_id(cell.suite.name, cell.optim, cell.seed) if comm.is_main else None)
            out = Path(job.out)
            outcome = execute(
                cell.suite,
                cell.optim,
                cell.seed,
                device,
                Path(job.data_root),
                rank_progress(cell.label) if comm.is_main else None,
                run_key=cell.key,
                executor=job.executor,
                parallel_runs=1,
                comm=comm,
                run_id=run_id,
            )
            notes = out / FAILURES / run_id
            row = outcome.row
            if row["status"] not in SHARED_OUTCOMES:
                if distributed.timed_out(row["error"]):
                    row["error"] = hang_report(notes, comm, cell.suite.budget["max_time_s"], row["error"])
                write_failure(notes, comm.rank, row["status"], row["error"])
            if not comm.is_main:
                if row["status"] not in SHARED_OUTCOMES and exit_on_failure:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(1)
                return None
            row.update(first_failure(notes, comm.world_size, row))
            finish(out, job, outcome)
            remove_notes(notes)
        finally:
            distributed.leave()
    interrupted = outcome.interrupted or signals.received() is not None
    return {**row, "interrupted": interrupted, "setting": cell.setting}


def rank_progress(label: str) -> Any:
    """Rank 0's progress: one line per log point on its standard output (the launcher's log)."""

    def report(progress: Any) -> None:
        print(f"{label}: step {progress.step}/{progress.total} loss {progress.loss:.4g}", flush=True)

    return report


def write_failure(notes: Path, rank: int, status: str, error: str | None) -> None:
    """Note this rank's end (atomically: a reader sees the whole note or none)."""
    notes.mkdir(parents=True, exist_ok=True)
    temporary = notes / f".rank-{rank}.json.tmp"
    temporary.write_text(json.dumps({"rank": rank, "status": status, "error": error, "at": time.time()}))
    temporary.replace(notes / f"rank-{rank}.json")


def hang_report(notes: Path, comm: Comm, max_time_s: float, error: str) -> str:
    """The error of a rank whose collective timed out: the timeout, where it comes from, and the ranks that never
    joined the collective (those that noted no failure of their own), then the rank's traceback."""
    from structbench.execution import distributed

    noted = {json.loads(p.read_text())["rank"] for p in notes.glob("rank-*.json")} if notes.is_dir() else set()
    silent = [str(r) for r in range(comm.world_size) if r != comm.rank and r not in noted]
    if len(silent) == 1:
        who = f"rank {silent[0]}"
    elif silent:
        who = f"one of ranks {', '.join(silent)}"
    else:
        who = "a rank"
    timeout = distributed.collective_timeout(max_time_s)
    return (
        f"a collective of rank {comm.rank} of {comm.world_size} timed out after {timeout:g} s "
        f"({distributed.timeout_origin(max_time_s)}): {who} never joined it (hung, or slower than that)\n{error}"
    )


def first_failure(notes: Path, world_size: int, row: dict[str, Any]) -> dict[str, Any]:
    """The status and error of the rank that failed first, when another rank than 0 did: rank 0's own failure (or
    its broken collective) follows a failing peer's note, which is written before that peer leaves."""
    if not notes.is_dir():
        return {}
    peers = [json.loads(p.read_text()) for p in sorted(notes.glob("rank-*.json"))]
    peers = [p for p in peers if p["rank"] != 0]
    if not peers:
        return {}
    first = min(peers, key=lambda p: p["at"])
    return {
        "status": first["status"],
        "error": f"rank {first['rank']} of {world_size} ended {first['status']}:\n{first['error']}",
    }


def remove_notes(notes: Path) -> None:
    if notes.is_dir():
        for path in notes.iterdir():
            path.unlink(missing_ok=True)
        notes.rmdir()


def torchrun_command(job_file: Path, result_file: Path, nproc_per_node: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        "--max-restarts=0",
        "-m",
        "structbench.execution.torchrun",
        str(job_file),
        str(result_file),
    ]


def run_torchrun(job: Job) -> Finished:
    """Run `job` as a torch.distributed job on this machine and wait for it, holding its key's claim (this command
    runs it; structbench.store.run_claims); a run another structbench runs, or has stored meanwhile, is left to it."""
    with claimed(job) as elsewhere:
        if elsewhere is not None:
            return Finished(job, None, elsewhere=elsewhere)
        return _launch(job)


def _launch(job: Job) -> Finished:
    """Start torchrun for `job` and wait for it. A signal this process receives is passed on to torchrun, which
    passes it on to the ranks (each stores nothing but rank 0, which stores the run)."""
    from structbench.execution import signals

    log = Path(job.out) / FAILURES / f"{job.cell.key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="structbench-ddp-") as tmp:
        # The job and its result cross to torchrun's ranks and back as pickles (a Job holds the suite's whole spec;
        # a row holds datetimes): both files live in this private directory, created mode 0700 by this command
        # and removed when it ends, never in the results store, so only the user running the command (who could
        # run code anyway) can write what is unpickled.
        job_file, result_file = Path(tmp) / "job.pkl", Path(tmp) / "result.pkl"
        job_file.write_bytes(pickle.dumps(job))
        env = {**os.environ, "OMP_NUM_THREADS": str(job.threads or 1)}
        with log.open("w") as sink, signals.armed(False):
            process = subprocess.Popen(
                torchrun_command(job_file, result_file, job.nproc_per_node),
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
            )
            forwarded = False
            while process.poll() is None:
                signum = signals.received()
                if signum is not None and not forwarded:
                    process.send_signal(signum)
                    forwarded = True
                time.sleep(0.2)
        if result_file.exists():
            row = pickle.loads(result_file.read_bytes())
            # A rank that torchrun stopped after rank 0 stored the run may have noted its end: nobody reads it now.
            remove_notes(Path(job.out) / FAILURES / row["run_id"])
            return Finished(job, row)
    # torchrun prefixes each rank's output with [rankN]: the last such line is the failing rank's error.
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("[rank")]
    last = f": {lines[-1]}" if lines else ""
    return Finished(job, None, f"torchrun exited with status {process.returncode}, no run stored (log {log}){last}")


def run_torchrun_jobs(jobs: Sequence[Job]) -> Iterator[Finished]:
    """Run `jobs` one after another, each as a torchrun job; none starts after a signal (Ctrl-C, SIGTERM)."""
    from structbench.execution import signals

    for job in jobs:
        if signals.received() is not None:
            return
        yield run_torchrun(job)


def slurm_rank(job: Job) -> dict[str, Any] | None:
    """One task of a Slurm job of `nproc_per_node` tasks per node: its rendezvous from submitit, then `run_rank`."""
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return run_rank(job, exit_on_failure=False)


def main(argv: list[str]) -> int:
    """torchrun's entry point on every rank: the job from `argv[0]`; rank 0 writes its returned row to `argv[1]`."""
    job_file, result_file = Path(argv[0]), Path(argv[1])
    job = pickle.loads(job_file.read_bytes())  # written by run_torchrun in its private directory (see there)
    from structbench.execution.runner import SHARED_OUTCOMES

    result = run_rank(job)
    if result is None:
        return 0
    temporary = result_file.with_suffix(".tmp")
    temporary.write_bytes(pickle.dumps(result))
    temporary.replace(result_file)
    # A run rank 0 ended on its own (or whose collective broke or timed out) can leave another rank stuck, which
    # torchrun would wait for: rank 0 exits 1 so that torchrun stops the other ranks.
    return 0 if result["status"] in SHARED_OUTCOMES else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
