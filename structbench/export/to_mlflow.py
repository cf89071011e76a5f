"""MLflow export: one MLflow run per stored run, in the experiment `--name` (default `structbench`), through
MlflowClient.

- run name: the store's run id; start and end time: the run's `started_at` and `finished_at`;
- params: fields.params (MLflow keeps params as text);
- metrics by step: the curves (fields.scalars), each stamped with the run's start plus the point's `wall_s`, and the
  summary numbers (`final/...`) at the run's last step;
- tags: fields.tags (identity, status, environment, command line); values longer than MLflow's limit are cut;
- status: FINISHED for an `ok` run, KILLED for an `interrupted` one, FAILED for any other (the `status` tag has
  structbench's own word).

The destination is a tracking URI (`sqlite:///results/mlflow.db`, `http://host:5000`, `databricks`, ...) or a path,
which means a SQLite database file there. A stored run already in the experiment (tag `run_id`) is skipped; one left
RUNNING by an export that died midway is deleted and written again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from structbench.errors import UsageError
from structbench.export import fields
from structbench.export.base import Progress, Result, Selection

ID_TAG = "run_id"
STATUS = {"ok": "FINISHED", "interrupted": "KILLED"}
"""MLflow's run status for each structbench status; FAILED for the others."""
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
TAG_LIMIT = 8000
"""MLflow's longest tag value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)."""
CUT = " [cut]"
T = TypeVar("T")


def tracking_uri(dest: str) -> str:
    """A tracking URI as given, or a path as a SQLite database there (a UsageError when the path is a directory)."""
    if "://" in dest or dest.startswith("databricks"):
        return dest
    path = Path(dest)
    if path.is_dir():
        raise UsageError(f"{dest} is a directory; give the SQLite file to write (e.g. {path / 'mlflow.db'}) or a URI.")
    return f"sqlite:///{path.resolve()}"


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _tag(value: str) -> str:
    return value if len(value) <= TAG_LIMIT else value[: TAG_LIMIT - len(CUT)] + CUT


def _exported(client: Any, experiment_id: str) -> dict[str, Any]:
    """The experiment's runs that carry a stored run's id: id -> MLflow run (the latest when several)."""
    found: dict[str, Any] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token, order_by=["start_time ASC"])
        for run in page:
            if ID_TAG in run.data.tags:
                found[run.data.tags[ID_TAG]] = run
        token = page.token
        if not token:
            return found


def _write(client: Any, experiment_id: str, run: pd.Series, curves: pd.DataFrame) -> None:
    from mlflow.entities import Metric, Param

    start = pd.Timestamp(run["started_at"]).timestamp()
    finished = pd.Timestamp(run["finished_at"]).timestamp() if fields.present(run["finished_at"]) else start
    last_step = int(run["steps"]) if fields.present(run["steps"]) else 0
    tags = {key: _tag(value) for key, value in fields.tags(run).items()}
    created = client.create_run(experiment_id, start_time=_ms(start), tags=tags, run_name=str(run["run_id"]))
    mlflow_id = created.info.run_id
    params = [Param(key, str(value)) for key, value in fields.params(run).items()]
    for chunk in _chunks(params, PARAMS_PER_BATCH):
        client.log_batch(mlflow_id, params=chunk)
    metrics = [
        Metric(s.key, s.value, _ms(start + (s.wall_s or 0.0)), s.step)
        for s in fields.scalars(curves, run.get("eval_metric_name"))
    ]
    metrics += [Metric(key, value, _ms(finished), last_step) for key, value in fields.summary(run).items()]
    for chunk in _chunks(metrics, METRICS_PER_BATCH):
        client.log_batch(mlflow_id, metrics=chunk)
    client.set_terminated(mlflow_id, status=STATUS.get(str(run["status"]), "FAILED"), end_time=_ms(finished))


def export(selection: Selection, destination: str, name: str, progress: Progress) -> Result:
    """The selected runs into experiment `name` of the tracking store `destination` (a URI or a SQLite file)."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(destination)

    for logger in ("mlflow", "alembic"):  # their INFO lines (creating the database's tables) would bury the progress
        logging.getLogger(logger).setLevel(logging.WARNING)

    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(name)
    done = _exported(client, experiment_id)
    exported = skipped = 0
    for run, curves in selection:
        run_id = str(run["run_id"])
        earlier = done.get(run_id)
        if earlier is not None and earlier.info.status != "RUNNING":
            skipped += 1
        else:
            if earlier is not None:
                client.delete_run(earlier.info.run_id)
            _write(client, experiment_id, run, curves)
            exported += 1
        progress(run_id)
    return Result(exported, skipped, f"{uri} (experiment {name!r})")
