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
from structbench.store.write import FINAL_STATUSES, MANIFESTS, TEMPORARY_SUFFIX, Problem

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


CELL_TEXT_FIELDS = ("key", "suite", "optim")
"""What every cell of a manifest names, as text."""
OPTIONAL_TEXT = (str, type(None))


def _cell_problem(cell: Any) -> str | None:
    """Why a manifest's cell cannot be used (status reads its key, suite, optimizer and Slurm job id), or None."""
    if not isinstance(cell, dict):
        return "a cell is not a JSON object"
    if not all(isinstance(cell.get(name), str) for name in CELL_TEXT_FIELDS):
        return f"a cell lacks one of {', '.join(CELL_TEXT_FIELDS)} as text"
    if not isinstance(cell.get("job_id"), OPTIONAL_TEXT):
        return "a cell's job_id is not text"
    return None


def manifest_problem(record: Any) -> str | None:
    """Why a parsed manifest cannot be used (it is not what write_manifest writes), or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if not isinstance(record.get("cells", []), list):
        return "its cells are not a list"
    if not isinstance(record.get("submitit_folder"), OPTIONAL_TEXT):
        return "its submitit_folder is not text"
    return next(filter(None, map(_cell_problem, record.get("cells", []))), None)


def _read_manifest(path: Path) -> dict[str, Any]:
    """One manifest file, parsed and checked; ValueError (or OSError) saying why it cannot be used."""
    try:
        record = json.loads(path.read_bytes())
    except RecursionError:
        raise ValueError("nested too deeply to be a manifest") from None
    reason = manifest_problem(record)
    if reason is not None:
        raise ValueError(reason)
    return record


def remove_manifest(out: Path, grid_id: str) -> None:
    """Remove one grid's manifest (a grid whose submission was refused: it has no job to track)."""
    (out / GRIDS_DIR / f"{grid_id}.json").unlink(missing_ok=True)


def read_manifests(out: Path) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Every usable manifest of the store, oldest first, and the manifest files that cannot be read or used (not
    JSON, or not shaped as write_manifest writes one), each with why."""
    directory = out / GRIDS_DIR
    try:
        paths = sorted(p for p in directory.glob("*.json") if not p.name.startswith("."))
    except OSError:
        return [], []
    manifests, problems = [], []
    for path in paths:
        try:
            manifests.append(_read_manifest(path))
        except (OSError, ValueError) as exc:
            problems.append(Problem(path, _first_line(exc)))
    return sorted(manifests, key=lambda m: str(m.get("created", ""))), problems


def _first_line(exc: Exception) -> str:
    """An exception's message as one line (its type's name when it has none)."""
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


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
    for manifest in read_manifests(out)[0]:
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
