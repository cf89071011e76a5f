"""Weights & Biases export, offline only: one offline run directory per stored run under `<dest>/wandb/`, written by
the wandb library with `mode="offline"`; nothing is sent anywhere (`wandb sync <dest>/wandb/offline-run-*` uploads
them when the user chooses to).

- run id: the store's run id (characters W&B reserves, such as ':' of a plugin optimizer, become '_'); name: the
  run id; project `--name` (default `structbench`); group `<suite>/<optim>` (the seeds of a setting together);
  tags: suite, optimizer and status;
- config: fields.params, and fields.tags under `structbench` (identity, status, environment, command line);
- history: the curves (fields.scalars), one `log` per step with every split's values of that step;
- summary: the summary numbers (`final/...`).

W&B is kept off the network: WANDB_MODE=offline and error reporting off while the export runs, and the run settings
turn off system metrics, machine and git probes, code and requirements capture and console capture. A run's
directory is written in a temporary directory and moved into place; a stored run whose directory exists is skipped.
`wandb leet inspect --json <run dir>` prints what a run holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from structbench.export import fields
from structbench.export.base import Progress, Result, Selection, destination_directory

RUNS_DIR = "wandb"
OFFLINE_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false"}
RESERVED = re.compile(r"[:;,#?/'\s]")
"""Characters W&B does not take in a run id (wandb_settings.validate_run_id), and whitespace."""


def wandb_id(run_id: str) -> str:
    return RESERVED.sub("_", run_id)


@contextlib.contextmanager
def offline_environment() -> Iterator[None]:
    """OFFLINE_ENV set while the export runs (the wandb service started inside inherits it), restored after."""
    saved = {key: os.environ.get(key) for key in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_directories(dest: Path) -> dict[str, Path]:
    """W&B run id -> its offline run directory under `dest`."""
    found = {}
    for directory in sorted((dest / RUNS_DIR).glob("offline-run-*")):
        for log in directory.glob("run-*.wandb"):
            found[log.stem.removeprefix("run-")] = directory
    return found


def _settings(run: pd.Series) -> Any:
    import wandb

    return wandb.Settings(
        mode="offline",
        silent=True,
        console="off",
        x_disable_stats=True,
        x_disable_machine_info=True,
        x_disable_meta=True,
        disable_git=True,
        disable_code=True,
        save_code=False,
        x_save_requirements=False,
        host=str(run["hostname"]) if fields.present(run.get("hostname")) else None,
    )


def _write(staging: Path, run: pd.Series, curves: pd.DataFrame, project: str) -> Path:
    """Write the run under `staging`; return its offline run directory."""
    import wandb

    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for scalar in fields.scalars(curves, run.get("eval_metric_name")):
        by_step[scalar.step][scalar.key] = scalar.value
    tracked = wandb.init(
        dir=str(staging),
        project=project,
        id=wandb_id(str(run["run_id"])),
        name=str(run["run_id"]),
        group=f"{run['suite']}/{run['optim']}",
        tags=[str(run["suite"]), str(run["optim"]), str(run["status"])],
        config={**fields.params(run), "structbench": fields.tags(run)},
        settings=_settings(run),
    )
    try:
        for step in sorted(by_step):
            tracked.log(by_step[step], step=step)
        tracked.summary.update(fields.summary(run))
    finally:
        tracked.finish()
    (directory,) = run_directories(staging).values()
    return directory


def export(selection: Selection, destination: str, project: str, progress: Progress) -> Result:
    """Offline W&B run directories of project `project` in `destination`."""
    import wandb

    dest = destination_directory(destination)

    (dest / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    exported = skipped = 0
    with offline_environment():
        try:
            for run, curves in selection:
                run_id = str(run["run_id"])
                if wandb_id(run_id) in run_directories(dest):
                    skipped += 1
                else:
                    staging = Path(tempfile.mkdtemp(prefix=f".{wandb_id(run_id)}.", suffix=".partial", dir=dest))
                    try:
                        directory = _write(staging, run, curves, project)
                        os.rename(directory, dest / RUNS_DIR / directory.name)
                    finally:
                        shutil.rmtree(staging, ignore_errors=True)
                    exported += 1
                progress(run_id)
        finally:
            wandb.teardown()
    return Result(exported, skipped, str(dest / RUNS_DIR), " (offline runs: `wandb sync` uploads them)")
