"""The Slurm executor: a submitit job array (`AutoExecutor(cluster="slurm").map_array`), one array element per run;
job logs and submitit's pickles under the store's hidden `.submitit/` directory. A distributed run is one job of a
task per rank (`structbench.execution.torchrun.slurm_rank`).
"""

from __future__ import annotations

import contextlib
import io
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structbench.errors import UsageError
from structbench.execution.job import Finished, Job, one_line, run_job
from structbench.execution.signals import SUBMITIT_WARNING_S
from structbench.execution.torchrun import slurm_rank


@dataclass(frozen=True)
class SlurmOptions:
    """Resources of one array element (one run), from the command line over the suite's `[resources]` table."""

    partition: str | None = None
    time_min: int = 60
    gpus_per_run: int = 0
    cpus_per_run: int = 1
    mem: str | None = None
    array_parallelism: int = 256
    extra: Mapping[str, str] = field(default_factory=dict)


RESOURCE_KEYS = {
    "partition": str,
    "time": (str, int),
    "gpus_per_run": int,
    "cpus_per_run": int,
    "mem": str,
    "array_parallelism": int,
    "extra": list,
}


def parse_slurm_time(text: str | int) -> int:
    """Minutes from Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (rounded up to whole minutes)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 1:
            raise UsageError(f"slurm time must be at least 1 minute, got {text}.")
        return text
    value = str(text).strip()
    try:
        days, _, rest = value.rpartition("-") if "-" in value else ("0", "", value)
        parts = [int(p) for p in rest.split(":")]
        if "-" in value:
            hours, minutes, seconds = [*parts, 0, 0][:3]
        elif len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        elif len(parts) == 3:
            hours, minutes, seconds = parts
        else:
            raise ValueError(value)
        total = int(days) * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)
    except ValueError:
        raise UsageError(f"--slurm-time takes minutes or [D-]HH:MM:SS, got {value!r}.") from None
    if total < 1 or min(int(days), hours, minutes, seconds) < 0:
        raise UsageError(f"--slurm-time must be at least one minute, got {value!r}.")
    return total


def parse_extra(items: Sequence[str]) -> dict[str, str]:
    """`--slurm-extra key=value` (an sbatch option without its dashes, e.g. `qos=high`, `constraint=a100`)."""
    extra = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise UsageError(f"--slurm-extra takes an sbatch option as key=value (e.g. qos=high), got {item!r}.")
        extra[key.replace("-", "_")] = value.strip()
    return extra


SLURM_SIGNAL_EARLY_S = 60.0
"""How much earlier than asked Slurm may send that signal (sbatch --signal: "up to 60 seconds earlier")."""


def early_warning_risk(options: SlurmOptions) -> str | None:
    """A warning when the time limit is so short that Slurm may send SIGUSR2 as the job starts, before Python
    handles it: the job then dies without a result."""
    if options.time_min * 60 > SUBMITIT_WARNING_S + SLURM_SIGNAL_EARLY_S:
        return None
    return (
        f"a Slurm time limit of {options.time_min} min lets Slurm send its time-limit warning (SIGUSR2, asked for "
        f"{SUBMITIT_WARNING_S:.0f} s before the limit, sent up to {SLURM_SIGNAL_EARLY_S:.0f} s early) as a job "
        f"starts, which kills it without a result; give --slurm-time 3 or more."
    )


def slurm_options(resources: Mapping[str, Any], given: Mapping[str, Any]) -> SlurmOptions:
    """The suite's `[resources]` defaults, then the command line's `--slurm-*` values where given."""
    for key, value in resources.items():
        kind = RESOURCE_KEYS.get(key)
        if kind is None:
            raise UsageError(f"[resources] has no field {key!r}; valid: {', '.join(sorted(RESOURCE_KEYS))}.")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise UsageError(f"[resources] {key} has the wrong type: {value!r}.")
    merged = {**resources, **{k: v for k, v in given.items() if v is not None and v != []}}
    options = SlurmOptions(
        partition=merged.get("partition"),
        time_min=parse_slurm_time(merged.get("time", 60)),
        gpus_per_run=int(merged.get("gpus_per_run", 0)),
        cpus_per_run=int(merged.get("cpus_per_run", 1)),
        mem=merged.get("mem"),
        array_parallelism=int(merged.get("array_parallelism", 256)),
        extra=parse_extra(merged.get("extra", [])),
    )
    for name in ("cpus_per_run", "array_parallelism"):
        if getattr(options, name) < 1:
            raise UsageError(f"--slurm-{name.replace('_', '-')} must be >= 1, got {getattr(options, name)}.")
    if options.gpus_per_run < 0:
        raise UsageError(f"--slurm-gpus-per-run must be >= 0, got {options.gpus_per_run}.")
    return options


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise UsageError("--executor slurm needs Slurm's sbatch on the PATH (none found); use --executor local.")


def submit_slurm(jobs: Sequence[Job], options: SlurmOptions, folder: Path) -> list[Any]:
    """Submit `jobs` as one Slurm job array through submitit; return submitit's jobs (one per run, in order).

    `folder` (the grid's, new) is made for this user alone (mode 0700): submitit pickles each job into it and the
    compute nodes unpickle them, the one place where structbench loads pickles from a store, so nobody else who can
    write to a shared store may plant one there. When sbatch refuses the array (no reachable controller, a bad
    partition, rejected options), the folder is removed and the refusal is a UsageError with sbatch's last line."""
    submitit = quiet_submitit()
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700)
    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    parameters: dict[str, Any] = {
        "timeout_min": options.time_min,
        "cpus_per_task": options.cpus_per_run,
        "slurm_array_parallelism": options.array_parallelism,
        "name": "structbench",
    }
    function: Callable[[Job], Any] = run_job
    ranks = jobs[0].nproc_per_node if jobs else 0
    if ranks:
        # One run = one job of `ranks` tasks per node (a rank each), its rendezvous from submitit.
        function = slurm_rank
        parameters["tasks_per_node"] = ranks
        parameters["nodes"] = jobs[0].nnodes
    if options.gpus_per_run:
        parameters["gpus_per_node"] = options.gpus_per_run
    if options.partition:
        parameters["slurm_partition"] = options.partition
    if options.mem:
        parameters["slurm_mem"] = options.mem
    if options.extra:
        parameters["slurm_additional_parameters"] = dict(options.extra)
    executor.update_parameters(**parameters)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's whole stderr there
            return executor.map_array(function, list(jobs))
    except submitit.core.utils.FailedJobError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()  # the store's .submitit, unless another grid's folder is in it
        raise UsageError(f"sbatch refused the job array: {last_line(str(exc))}") from None


def last_line(text: str) -> str:
    """The last non-blank line of `text` (sbatch ends with its reason), or a placeholder when there is none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def slurm_states(folder: str | Path, job_ids: Sequence[str]) -> dict[str, str]:
    """Each job's Slurm state: submitit's (from sacct) on a cluster with accounting; on one without (sacct fails),
    from `squeue`, which knows the jobs still queued or running. A job neither knows maps to "UNKNOWN"."""
    import subprocess

    submitit = quiet_submitit()
    accounting = shutil.which("sacct") is not None and (
        subprocess.run(["sacct", "-n", "-j", "1"], capture_output=True, timeout=30, check=False).returncode == 0
    )
    if accounting:
        return {j: submitit.SlurmJob(folder=folder, job_id=j).state for j in job_ids}
    queued = queued_or_running() or {}
    return {j: queued.get(j, "UNKNOWN") for j in job_ids}


def queued_or_running() -> dict[str, str] | None:
    """Job id (an array element's as ARRAY_INDEX) -> state of every job Slurm still has queued or running
    (`squeue`, which lists no job that has ended); None when squeue does not answer."""
    import subprocess

    try:
        listing = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(line.strip().split(maxsplit=1) for line in listing.splitlines() if " " in line.strip())


def quiet_submitit() -> Any:
    """submitit, imported with its logger at ERROR: it warns on every poll of a cluster without accounting (its
    logging configuration runs at import, so the level is set after it)."""
    import logging

    import submitit

    logging.getLogger("submitit").setLevel(logging.ERROR)
    return submitit


LOST_AFTER_S = 30.0
"""How long a job Slurm no longer lists may take to show its result file (a shared file system's caching) before
its run is reported failed."""


def collect_slurm(
    jobs: Sequence[Job],
    submitted: Sequence[Any],
    poll_s: float = 1.0,
    queued: Callable[[], Mapping[str, str] | None] = queued_or_running,
) -> Iterator[Finished]:
    """Yield each Slurm run as it finishes: when submitit's result file appears (or sacct says the job ended), or,
    for a job that Slurm no longer lists as queued or running and that has left no result after LOST_AFTER_S
    (killed before it could write one, on a cluster without accounting: submitit alone would wait for it forever),
    as a failure quoting the end of the job's error log. A round in which squeue does not answer counts no job as
    unlisted."""
    waiting = {sub.job_id: (job, sub) for job, sub in zip(jobs, submitted, strict=True)}
    unlisted_since: dict[str, float] = {}
    while waiting:
        for job_id, (job, sub) in list(waiting.items()):
            if sub.done():
                del waiting[job_id]
                yield _collected(job, sub)
        listed, now = queued(), time.monotonic()
        for job_id, (job, sub) in list(waiting.items()):
            if listed is None or job_id in listed:
                unlisted_since.pop(job_id, None)
            elif now - unlisted_since.setdefault(job_id, now) >= LOST_AFTER_S and not sub.done():
                del waiting[job_id]
                yield Finished(job, None, f"Slurm job {job_id} ended without a result ({_log_end(sub)})")
        if waiting:
            time.sleep(poll_s)


def _collected(job: Job, sub: Any) -> Finished:
    try:
        # A distributed run's job has a task per rank: rank 0 (task 0) returns the stored row.
        return Finished.of(job, sub.results()[0] if job.nproc_per_node else sub.result())
    except Exception as exc:  # a failed job is reported; the other runs are still collected
        return Finished(job, None, one_line(exc))


def _log_end(sub: Any) -> str:
    lines = [line.strip() for line in (sub.stderr() or "").splitlines() if line.strip()]
    return f"its error log ends: {lines[-1]}" if lines else "its error log is empty"
