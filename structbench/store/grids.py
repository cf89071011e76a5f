"""What `structbench status` reports: every grid `run` started in a store, cell by cell.

Each `run` (but a dry run) writes a manifest of its grid to the store's hidden `.grids/` directory: the cells' run
keys, suites, optimizers, settings and seeds, the executor, and for Slurm the submitit folder and each run's job id.
A cell is then *done* (a stored run with status ok), *failed* (by status: a final failure, or an `error` /
`interrupted` run that the next `run` repeats), *queued* or *running* (its Slurm job's state, from submitit, or
`squeue` on a cluster without accounting), or *missing* (nothing stored and no live job).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pandas as pd

from structbench.errors import StoreWriteError
from structbench.store.write import FINAL_STATUSES, MANIFESTS, TEMPORARY_SUFFIX

GRIDS_DIR = MANIFESTS
QUEUED_STATES = frozenset({"PENDING", "REQUEUED", "CONFIGURING", "RESIZING", "SUSPENDED"})
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING"})


def new_grid_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + f"-{uuid4().hex[:6]}"


def write_manifest(out: Path, grid_id: str, record: dict[str, Any]) -> Path:
    """Write (or replace) one grid's manifest by atomic rename; an OS error (a full disk) is a StoreWriteError."""
    directory = out / GRIDS_DIR
    path = directory / f"{grid_id}.json"
    tmp = directory / f".{grid_id}.json{TEMPORARY_SUFFIX}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        raise StoreWriteError(f"cannot write to the results store {out}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_manifests(out: Path) -> list[dict[str, Any]]:
    """Every readable manifest of the store, oldest first."""
    directory = out / GRIDS_DIR
    if not directory.is_dir():
        return []
    manifests = []
    for path in sorted(directory.glob("*.json")):
        try:
            manifests.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(manifests, key=lambda m: str(m.get("created", "")))


@dataclass
class Tally:
    done: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    queued: int = 0
    running: int = 0
    missing: int = 0


def grid_status(
    out: Path,
    runs: pd.DataFrame,
    states: Callable[[str, Sequence[str]], dict[str, str]] | None = None,
) -> dict[tuple[str, str], Tally]:
    """(suite, optimizer) -> tally over every cell of every manifest, plus stored runs of no manifest.

    `runs` holds run_key, status, suite, optim (store.run_keys); `states(folder, job_ids)` gives Slurm job states.
    """
    statuses: dict[str, list[str]] = {}
    for key, status in zip(runs["run_key"], runs["status"], strict=True):
        statuses.setdefault(key, []).append(status)
    cells: dict[str, dict[str, Any]] = {}
    for manifest in read_manifests(out):
        for cell in manifest.get("cells", []):
            cells[cell["key"]] = {**cell, "folder": manifest.get("submitit_folder")}
    for key, suite, optim in zip(runs["run_key"], runs["suite"], runs["optim"], strict=True):
        cells.setdefault(key, {"key": key, "suite": suite, "optim": optim})
    live = _live_states(cells, statuses, states)
    tallies: dict[tuple[str, str], Tally] = {}
    for key, cell in cells.items():
        tally = tallies.setdefault((cell["suite"], cell["optim"]), Tally())
        seen = statuses.get(key, [])
        final = [s for s in seen if s in FINAL_STATUSES]
        state = live.get(key, "")
        if final:
            if final[-1] == "ok":
                tally.done += 1
            else:
                tally.failed[final[-1]] += 1
        elif state in RUNNING_STATES:
            tally.running += 1
        elif state in QUEUED_STATES:
            tally.queued += 1
        elif seen:
            tally.failed[seen[-1]] += 1
        else:
            tally.missing += 1
    return dict(sorted(tallies.items()))


def _live_states(
    cells: dict[str, dict[str, Any]],
    statuses: dict[str, list[str]],
    states: Callable[[str, Sequence[str]], dict[str, str]] | None,
) -> dict[str, str]:
    """run key -> Slurm state, for cells with a job and no final run yet."""
    if states is None:
        return {}
    by_folder: dict[str, dict[str, str]] = {}
    for key, cell in cells.items():
        if cell.get("job_id") and cell.get("folder") and not set(statuses.get(key, [])) & FINAL_STATUSES:
            by_folder.setdefault(cell["folder"], {})[cell["job_id"]] = key
    live = {}
    for folder, jobs in by_folder.items():
        for job_id, state in states(folder, list(jobs)).items():
            live[jobs[job_id]] = state.split()[0] if state else ""
    return live
