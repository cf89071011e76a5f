"""`structbench export`: each exporter's output read back with the tracker's own reader (TensorBoard's
EventAccumulator, MLflow's search_runs and metric history, W&B's `wandb leet inspect`, pandas) and compared with the
store's Parquet files read by pandas; a second export to the same place; the filters; a missing extra."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from structbench.store import write as store
from tests.support.paths import ROOT
from tests.support.store import read_curves, read_runs
from tests.support.system_parts import missing

T0 = datetime(2026, 1, 5, 9, 30, tzinfo=UTC)
RUNS = [
    # run id, suite, optimizer, seed, status, hyperparameters, metric name
    ("q-sgd-s0", "quadratic", "sgd", 0, "ok", {"lr": 0.5, "momentum": 0.9, "nesterov": False}, "rel_subopt"),
    ("q-sgd-s1", "quadratic", "sgd", 1, "ok", {"lr": 0.5, "momentum": 0.9, "nesterov": False}, "rel_subopt"),
    ("q-adamw-s0", "quadratic", "adamw", 0, "diverged", {"lr": 0.05, "betas": [0.9, 0.999]}, "rel_subopt"),
    ("v-muon-s0", "vision", "muon", 0, "ok", {"lr": 0.02, "ns_steps": 5}, "accuracy"),
]
STEPS = 12
"""Training points every 2 steps, evaluations every 3: steps with gaps, as a tracker must keep them."""


def _needs(module: str) -> None:
    """This exporter's library; its absence fails the test in CI (the dev extra installs it) and skips it elsewhere."""
    if importlib.util.find_spec(module) is None:
        missing(f"{module} (a dev dependency)", "pip install -e '.[dev]'")


def _curves(seed: int, validated: bool) -> list[dict]:
    points = []
    for step in range(STEPS + 1):
        wall = 0.0137 * step + 0.001 * seed
        if step and step % 2 == 0:
            points.append(
                {
                    "step": step,
                    "wall_s": wall,
                    "split": "train",
                    "loss": 1 / (step + seed + 0.3),
                    "metric": None,
                    "lr": 0.5 * (1 - step / 10),
                    "step_time_s": 0.01 + step * 1.3e-4,
                    "optim_time_s": 0.001 * step + 1e-7,
                    "grad_norm": 3 / step,
                }
            )
        if step % 3 == 0:
            for split in ("eval", "val") if validated else ("eval",):
                offset = 0.01 if split == "val" else 0.0
                points.append(
                    {"step": step, "wall_s": wall, "split": split, "loss": 2 / (step + 1.7) + offset,
                     "metric": 1 / (step + 1) + offset, "lr": None, "step_time_s": None, "optim_time_s": None,
                     "grad_norm": None}
                )  # fmt: skip
    return points


def build_store(out: Path) -> None:
    store.prepare(out)
    for index, (run_id, suite, optim, seed, status, hparams, metric) in enumerate(RUNS):
        curves = _curves(seed, validated=suite == "vision")
        evals = [c for c in curves if c["split"] == "eval"]
        row = {f.name: None for f in store.RUN_SCHEMA}
        row.update(
            run_id=run_id,
            schema_version=store.SCHEMA_VERSION,
            suite=suite,
            task="quadratic" if suite == "quadratic" else "image-classification",
            optim=optim,
            seed=seed,
            hparams=json.dumps(hparams),
            spec=json.dumps({"suite": suite, "optim": optim, "seed": seed}),
            status=status,
            error=None if status == "ok" else "diverged: loss is nan at step 12",
            started_at=T0 + timedelta(minutes=index),
            finished_at=T0 + timedelta(minutes=index, seconds=7.25),
            steps=STEPS,
            wall_s=0.0137 * STEPS,
            step_time_median_s=0.0104,
            peak_mem_bytes=12_345_678 + index,
            state_bytes=4096 * (index + 1),
            final_train_loss=curves[-2]["loss"] if status == "ok" else None,
            final_eval_loss=evals[-1]["loss"] if status == "ok" else None,
            final_eval_metric=evals[-1]["metric"] if status == "ok" else None,
            eval_metric_name=metric,
            device="cpu",
            device_name="a test CPU",
            torch_version="2.13.0+cpu",
            structbench_version="0.1.0",
            git_commit="0123abcd",
            git_dirty=index % 2 == 1,
            command=f"structbench run --suite {suite} --optim {optim} --seed {seed}",
            hostname="node-7",
            python_version="3.11.7",
            thread_env=json.dumps({"OMP_NUM_THREADS": "2"}),
            torch_threads=2 if suite == "quadratic" else None,  # a run stored before the column existed
            run_key=f"key{index}",
        )
        store.write_run(out, row, curves)


@pytest.fixture
def stored(tmp_path) -> Path:
    out = tmp_path / "results"
    build_store(out)
    return out


def stored_runs(out: Path) -> pd.DataFrame:
    return read_runs(out).set_index("run_id")


def expected_series(out: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """key -> [(step, value)] of every value the store holds for the run, by the exporters' naming."""
    run = stored_runs(out).loc[run_id]
    curves = read_curves(out)
    series: dict[str, list[tuple[int, float]]] = {}
    for point in curves[curves["run_id"] == run_id].sort_values("step", kind="stable").itertuples():
        for field in ("loss", "metric", "lr", "step_time_s", "optim_time_s", "grad_norm", "wall_s"):
            value = getattr(point, field)
            if value is not None and not math.isnan(value):
                name = run["eval_metric_name"] if field == "metric" else field
                series.setdefault(f"{point.split}/{name}", []).append((point.step, value))
    return series


# ------------------------------------------------------------------ CSV


def test_csv_holds_the_stored_rows_and_curves_exactly_and_a_second_export_replaces_them(cli, stored, tmp_path):
    dest = tmp_path / "csv"
    result = cli("export", "--to", "csv", dest, "--out", stored)
    assert result.exit_code == 0, result.stderr
    assert "exported 4 run(s)" in result.stdout
    runs = pd.read_csv(dest / "runs.csv")
    want = pd.read_parquet(stored / "runs")
    assert list(runs.columns) == list(want.columns)
    assert sorted(runs["run_id"]) == sorted(want["run_id"])
    runs, want = runs.set_index("run_id").loc[want["run_id"]], want.set_index("run_id")
    for column in ("final_eval_loss", "final_eval_metric", "final_train_loss", "wall_s", "step_time_median_s"):
        np.testing.assert_array_equal(runs[column].to_numpy(float), want[column].to_numpy(float))
    assert runs["peak_mem_bytes"].tolist() == want["peak_mem_bytes"].tolist()
    assert runs["hparams"].map(json.loads).tolist() == want["hparams"].map(json.loads).tolist()
    assert runs["command"].tolist() == want["command"].tolist()
    assert runs["git_dirty"].tolist() == want["git_dirty"].tolist()
    assert pd.to_datetime(runs["started_at"]).tolist() == want["started_at"].tolist()
    text = pd.read_csv(dest / "runs.csv", dtype=str, keep_default_na=False).set_index("run_id")
    assert text.loc["q-sgd-s0", "torch_threads"] == "2" and text.loc["v-muon-s0", "torch_threads"] == ""

    curves = pd.read_csv(dest / "curves.csv")
    want_curves = read_curves(stored)
    key = ["run_id", "step", "split"]
    merged = want_curves.merge(curves, on=key, suffixes=("", "_csv"), how="outer", validate="1:1", indicator=True)
    assert (merged["_merge"] == "both").all() and len(curves) == len(want_curves)
    for column in ("loss", "metric", "lr", "step_time_s", "optim_time_s", "grad_norm", "wall_s"):
        np.testing.assert_array_equal(merged[column].to_numpy(float), merged[f"{column}_csv"].to_numpy(float))

    before = [(dest / name).read_bytes() for name in ("runs.csv", "curves.csv")]
    again = cli("export", "--to", "csv", dest, "--out", stored, "--optim", "sgd")
    assert again.exit_code == 0 and "replaced the files of the previous export" in again.stdout
    assert sorted(pd.read_csv(dest / "runs.csv")["run_id"]) == ["q-sgd-s0", "q-sgd-s1"]
    cli("export", "--to", "csv", dest, "--out", stored)
    assert [(dest / name).read_bytes() for name in ("runs.csv", "curves.csv")] == before


def test_filters_are_the_reports_and_a_filter_matching_nothing_writes_nothing(cli, stored, tmp_path):
    dest = tmp_path / "csv"
    result = cli("export", "--to", "csv", dest, "--out", stored, "--suite", "quadratic", "--optim", "adamw")
    assert result.exit_code == 0, result.stderr
    assert pd.read_csv(dest / "runs.csv")["run_id"].tolist() == ["q-adamw-s0"], "no baseline added to --optim"
    since = cli("export", "--to", "csv", dest, "--out", stored, "--since", (T0 + timedelta(minutes=2)).isoformat())
    assert since.exit_code == 0
    assert sorted(pd.read_csv(dest / "runs.csv")["run_id"]) == ["q-adamw-s0", "v-muon-s0"]

    fresh = tmp_path / "nothing"
    for args in (("--optim", "adamx"), ("--suite", "visoin"), ("--since", "2030-01-01"), ("--since", "tomorrow")):
        bad = cli("export", "--to", "csv", fresh, "--out", stored, *args)
        assert bad.exit_code == 2, args
        assert len(bad.stderr.strip().splitlines()) == 1 and bad.stderr.startswith("error: ")
        assert not fresh.exists()
    assert "Did you mean 'adamw'?" in cli("export", "--to", "csv", fresh, "--out", stored, "--optim", "adamx").stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--to", "excel"), "--to must be one of tensorboard, mlflow, wandb, csv"),
        (("--to", "csv", "--out", "missing-store"), "does not exist"),
    ],
)
def test_bad_targets_and_stores_are_one_line_exit_2(cli, stored, tmp_path, args, says):
    dest = tmp_path / "dest"
    result = cli("export", dest, *(a if a != "missing-store" else tmp_path / a for a in args))
    assert result.exit_code == 2 and says in result.stderr and len(result.stderr.splitlines()) == 1
    assert not dest.exists()


def test_a_file_where_the_directory_goes_is_exit_2(cli, stored, tmp_path):
    dest = tmp_path / "taken"
    dest.write_text("mine")
    result = cli("export", "--to", "csv", dest, "--out", stored)
    assert result.exit_code == 2 and "is a file, not a directory" in result.stderr
    assert dest.read_text() == "mine"


@pytest.mark.parametrize(("target", "module"), [("tensorboard", "tensorboard"), ("mlflow", "sqlalchemy"),
                                                ("wandb", "wandb")])  # fmt: skip
def test_a_missing_extra_names_the_pip_install_and_writes_nothing(cli, stored, tmp_path, monkeypatch, target, module):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    dest = tmp_path / "dest"
    result = cli("export", "--to", target, dest, "--out", stored)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: --to {target} needs {module}, which is not installed: pip install 'structbench[{target}]'"
    )
    assert not dest.exists() and result.stdout == ""


# ------------------------------------------------------------------ TensorBoard


def test_tensorboard_event_files_read_back_with_event_accumulator(cli, stored, tmp_path):
    _needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    dest = tmp_path / "tb"
    result = cli("export", "--to", "tensorboard", dest, "--out", stored)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(r[0] for r in RUNS)
    runs = stored_runs(stored)
    for run_id, _, _, _, status, hparams, _ in RUNS:
        events = EventAccumulator(str(dest / run_id), size_guidance={"scalars": 0, "tensors": 0})
        events.Reload()
        started = runs.loc[run_id, "started_at"].timestamp()
        for key, points in expected_series(stored, run_id).items():
            read = events.Scalars(key)
            assert [e.step for e in read] == [step for step, _ in points], key
            # TensorBoard keeps scalars as 32-bit floats.
            assert [e.value for e in read] == [float(np.float32(value)) for _, value in points], key
        walls = dict(expected_series(stored, run_id)["train/wall_s"])
        for event in events.Scalars("train/loss"):
            # Exact: the exporter writes start + wall_s, the same float64 sum of the same two values, and the event
            # file keeps wall times as doubles.
            assert event.wall_time == started + walls[event.step]
        final = events.Scalars("final/peak_mem_bytes")
        assert [(e.step, e.value) for e in final] == [(STEPS, float(np.float32(runs.loc[run_id, "peak_mem_bytes"])))]
        if status != "ok":
            assert "final/eval_loss" not in events.Tags()["scalars"], "a value the store lacks is not written"

        content = events.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        shown = start.session_start_info.hparams
        assert shown["optim.lr"].number_value == hparams["lr"]
        assert shown["status"].string_value == status and shown["optim"].string_value == runs.loc[run_id, "optim"]
        assert shown["seed"].number_value == runs.loc[run_id, "seed"]
        if "nesterov" in hparams:
            assert shown["optim.nesterov"].string_value == "False"
        if "betas" in hparams:
            assert json.loads(shown["optim.betas"].string_value) == hparams["betas"]
        experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        assert "final/wall_s" in {m.name.tag for m in experiment.metric_infos}
        (text,) = events.Tensors("provenance/text_summary")
        table = text.tensor_proto.string_val[0].decode()
        assert f"| command | {runs.loc[run_id, 'command']} |" in table
        assert f"| git_dirty | {runs.loc[run_id, 'git_dirty']} |" in table

    files = sorted((p, p.stat().st_mtime_ns) for p in dest.rglob("*"))
    again = cli("export", "--to", "tensorboard", dest, "--out", stored)
    assert again.exit_code == 0 and "exported 0 run(s)" in again.stdout and "4 already there, skipped" in again.stdout
    assert sorted((p, p.stat().st_mtime_ns) for p in dest.rglob("*")) == files


def test_tensorboard_adds_the_runs_a_destination_lacks(cli, stored, tmp_path):
    _needs("tensorboard")
    dest = tmp_path / "tb"
    assert cli("export", "--to", "tensorboard", dest, "--out", stored, "--optim", "sgd").exit_code == 0
    result = cli("export", "--to", "tensorboard", dest, "--out", stored)
    assert "exported 2 run(s)" in result.stdout and "2 already there" in result.stdout
    assert sorted(p.name for p in dest.iterdir()) == sorted(r[0] for r in RUNS), "no partial directory left"


# ------------------------------------------------------------------ MLflow


def test_mlflow_runs_read_back_with_search_runs_and_metric_history(cli, stored, tmp_path):
    _needs("mlflow")
    _needs("sqlalchemy")
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = cli("export", "--to", "mlflow", uri, "--out", stored, "--name", "bench")
    assert result.exit_code == 0, result.stderr
    client = MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    found = mlflow.search_runs(experiment_names=["bench"])
    assert sorted(found["tags.run_id"]) == sorted(r[0] for r in RUNS)
    runs = stored_runs(stored)
    for _, row in found.iterrows():
        run_id = row["tags.run_id"]
        stored_row = runs.loc[run_id]
        hparams = json.loads(stored_row["hparams"])
        assert row["status"] == ("FINISHED" if stored_row["status"] == "ok" else "FAILED")
        assert row["tags.status"] == stored_row["status"] and row["tags.command"] == stored_row["command"]
        threads = stored_row["torch_threads"]
        if math.isnan(threads):
            assert pd.isna(row["tags.torch_threads"]), "a value the store lacks is not tagged"
        else:
            assert row["tags.torch_threads"] == str(int(threads))
        assert row["tags.mlflow.runName"] == run_id
        assert row["params.optim"] == stored_row["optim"] and row["params.seed"] == str(stored_row["seed"])
        assert row["params.optim.lr"] == str(hparams["lr"])
        assert row["start_time"] == stored_row["started_at"]
        assert row["end_time"] == stored_row["finished_at"]
        for key, points in expected_series(stored, run_id).items():
            history = sorted((m.step, m.value) for m in client.get_metric_history(row["run_id"], key))
            assert history == points, key
        walls = dict(expected_series(stored, run_id)["train/wall_s"])
        for metric in client.get_metric_history(row["run_id"], "train/loss"):
            started_ms = stored_row["started_at"].timestamp() * 1000
            assert metric.timestamp == round(started_ms + walls[metric.step] * 1000)
        assert row["metrics.final/state_bytes"] == stored_row["state_bytes"]
        if stored_row["status"] == "ok":
            assert row["metrics.final/eval_loss"] == stored_row["final_eval_loss"]
        else:
            assert math.isnan(row["metrics.final/eval_loss"]), "a value the store lacks is not logged"

    # An export that died midway left a RUNNING run: the next export replaces it and skips the others.
    experiment = client.get_experiment_by_name("bench").experiment_id
    (left,) = found.loc[found["tags.run_id"] == "q-sgd-s1", "run_id"]
    client.delete_run(left)
    client.create_run(experiment, tags={"run_id": "q-sgd-s1"})
    again = cli("export", "--to", "mlflow", uri, "--out", stored, "--name", "bench")
    assert again.exit_code == 0 and "exported 1 run(s)" in again.stdout and "3 already there" in again.stdout
    after = mlflow.search_runs(experiment_names=["bench"])
    assert sorted(after["tags.run_id"]) == sorted(r[0] for r in RUNS)
    assert (after["status"] != "RUNNING").all()


def test_an_mlflow_destination_that_is_a_directory_is_exit_2(cli, stored, tmp_path):
    _needs("mlflow")
    result = cli("export", "--to", "mlflow", tmp_path, "--out", stored)
    assert result.exit_code == 2 and "is a directory" in result.stderr
    assert sorted(tmp_path.iterdir()) == [stored]


# ------------------------------------------------------------------ Weights & Biases


def _inspect(directory: Path) -> list[dict]:
    """The records of an offline run as `wandb leet inspect --json` prints them (W&B's reader of .wandb files)."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    command = [str(wandb_cli)] if wandb_cli.exists() else [sys.executable, "-m", "wandb"]
    done = subprocess.run([*command, "leet", "inspect", "--json", str(directory)], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_wandb_offline_runs_read_back_with_wandb_leet_inspect(cli, stored, tmp_path):
    _needs("wandb")
    dest = tmp_path / "wb"
    result = cli("export", "--to", "wandb", dest, "--out", stored, "--name", "bench")
    assert result.exit_code == 0, result.stderr
    directories = sorted((dest / "wandb").glob("offline-run-*"))
    assert len(directories) == len(RUNS) and sorted(p.name for p in dest.iterdir()) == ["wandb"]
    runs = stored_runs(stored)
    seen = set()
    for directory in directories:
        records = _inspect(directory)
        (header,) = [r["run"] for r in records if r["type"] == "run"]
        run_id = header["display_name"]
        seen.add(run_id)
        stored_row = runs.loc[run_id]
        assert header["run_id"] == run_id and header["project"] == "bench"
        assert header["tags"] == [stored_row["suite"], stored_row["optim"], stored_row["status"]]
        config = header["config"]["update"]
        assert config["optim.lr"] == json.loads(stored_row["hparams"])["lr"]
        assert config["structbench"]["command"] == stored_row["command"]
        assert config["structbench"]["git_commit"] == stored_row["git_commit"]
        history: dict[str, list[tuple[int, float]]] = {}
        for record in records:
            if record["type"] == "history":
                step = record["history"]["step"]["num"] if record["history"].get("step") else 0
                for key, value in record["history"]["item"].items():
                    if not key.startswith("_"):
                        history.setdefault(key, []).append((step, value))
        assert history == expected_series(stored, run_id)
        summary = {}
        for record in records:
            if record["type"] == "summary":
                summary.update(record["summary"].get("update", {}))
        assert summary["final/peak_mem_bytes"] == stored_row["peak_mem_bytes"]
        (exit_record,) = [r for r in records if r["type"] == "exit"]
        assert exit_record is records[-1] and exit_record["exit"].get("exit_code", 0) == 0
    assert seen == {r[0] for r in RUNS}

    again = cli("export", "--to", "wandb", dest, "--out", stored, "--name", "bench")
    assert again.exit_code == 0 and "exported 0 run(s)" in again.stdout and "4 already there" in again.stdout
    assert sorted((dest / "wandb").glob("offline-run-*")) == directories


def test_wandb_export_never_opens_a_network_connection(stored, tmp_path):
    """Every connect(2) of the export and its children (the wandb service) goes to a local Unix socket."""
    _needs("wandb")
    if shutil.which("strace") is None:
        missing("strace on PATH", "apt-get install strace")
    log = tmp_path / "strace.log"
    command = [sys.executable, "-m", "structbench", "export", "--to", "wandb", str(tmp_path / "wb"),
               "--out", str(stored), "--optim", "sgd"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WANDB_MODE", None)
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(log), *command],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "exported 2 run(s)" in done.stdout
    connects = [line for line in log.read_text().splitlines() if "connect(" in line]
    assert connects, "strace saw the export's connection to the wandb service"
    assert all("AF_UNIX" in line for line in connects), [c for c in connects if "AF_UNIX" not in c]
