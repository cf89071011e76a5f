"""Reading a store back, checking its index, and hand-built runs (evaluation curves only) written through it."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa

from structbench.store import write

T0 = datetime(2025, 3, 1, tzinfo=UTC)
TARGET = {"metric": "loss", "value": 0.5}


def read_runs(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "runs")


def read_curves(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "curves")


def index_file(out: Path, dataset: str) -> Path:
    return write.index_dir(out) / f"{dataset}.arrow"


INDEX_TRAILER = 8 + 32
"""An index file ends in 8 bytes of magic and the SHA-256 (32 bytes) of the Arrow IPC file before them."""


def indexed(out: Path, dataset: str) -> pd.DataFrame:
    """The index file's rows, after checking its trailer's digest against its Arrow bytes (hashlib's, independently
    of the reader)."""
    contents = index_file(out, dataset).read_bytes()
    body, digest = contents[:-INDEX_TRAILER], contents[-32:]
    assert hashlib.sha256(body).digest() == digest, "the index's checksum matches its contents"
    return pa.ipc.open_file(pa.py_buffer(body)).read_all().to_pandas()


def assert_indexes_the_store(out: Path) -> None:
    """The index holds one row per stored run and every stored curve point, each row naming its own file."""
    runs, curves = indexed(out, "runs"), indexed(out, "curves")
    stored_runs, stored_curves = read_runs(out), read_curves(out)
    assert sorted(runs.run_id) == sorted(stored_runs.run_id)
    assert sorted(runs["_file"]) == sorted(p.name for p in (out / "runs").glob("*.parquet"))
    assert (runs["_file"] == runs.run_id + ".parquet").all()
    assert len(curves) == len(stored_curves)
    assert curves.groupby("run_id").size().to_dict() == stored_curves.groupby("run_id").size().to_dict()


def hand_spec(
    *, suite: str, task: str, steps: int, target: dict | None, optim: str, hparams: dict, seed: int
) -> dict[str, object]:
    """The spec a hand-built run records: a constant schedule, a budget of `steps`, no task arguments."""
    return {
        "suite": suite,
        "task": task,
        "task_args": {},
        "budget": {"steps": steps},
        "schedule": {"kind": "constant"},
        "target": target,
        "optim": optim,
        "hparams": hparams,
        "seed": seed,
        "source": "test",
    }


def hand_row(**values: object) -> dict[str, object]:
    """A run row of the store's schema: None in every column but those every hand-built run shares, then `values`."""
    row: dict[str, object] = {f.name: None for f in write.RUN_SCHEMA}
    row.update(
        schema_version=1,
        compile_s=0.01,
        step_time_median_s=0.002,
        optim_time_median_s=0.0005,
        peak_mem_bytes=100 << 20,
        state_bytes=4096,
        eval_metric_name="accuracy",
        eval_metric_mode="max",
        torch_version="2.13",
        structbench_version="0.1.0",
        git_commit="abc",
        hostname="h",
        python_version="3.11",
        routing=json.dumps({"structured": ["w"], "fallback": ["b"], "fallback_optimizer": "adamw"}),
    )
    row.update(values)
    return row


def write_run(
    out: Path,
    run_id: str,
    optim: str,
    seed: int,
    evals: list[tuple[int, float, float, float]],
    *,
    suite: str = "hand",
    status: str = "ok",
    hparams: dict | None = None,
    target: dict | None = TARGET,
    started: datetime | None = None,
    **fields: object,
) -> None:
    """One run: evals are (step, cumulative seconds, loss, accuracy); train points mirror the evals."""
    hparams = hparams or {"lr": 0.1}
    spec = hand_spec(suite=suite, task="t", steps=20, target=target, optim=optim, hparams=hparams, seed=seed)
    last = evals[-1]
    row = hand_row(
        run_id=run_id,
        suite=suite,
        task="t",
        optim=optim,
        seed=seed,
        hparams=json.dumps(hparams),
        spec=json.dumps(spec),
        status=status,
        error=None if status == "ok" else f"{status}: something\nmore",
        started_at=started or T0 + timedelta(minutes=seed),
        steps=last[0],
        wall_s=last[1],
        peak_mem_source="rss",
        final_eval_loss=last[2] if status == "ok" else None,
        final_eval_metric=last[3] if status == "ok" else None,
        device="cpu",
        device_name="test cpu",
    )
    row.update(fields)
    curves = [
        {
            "step": s,
            "wall_s": w,
            "split": "eval",
            "loss": loss,
            "metric": acc,
            "lr": None,
            "step_time_s": None,
            "optim_time_s": None,
        }
        for s, w, loss, acc in evals
    ] + [
        {
            "step": s,
            "wall_s": w,
            "split": "train",
            "loss": loss,
            "metric": None,
            "lr": 0.1,
            "step_time_s": 0.002,
            "optim_time_s": 0.0005,
        }
        for s, w, loss, _ in evals
        if s > 0
    ]
    write.write_run(out, row, curves)


def write_experiment_run(out: Path, statement: str) -> None:
    """A stored numerical-experiment run (suite "orth") whose one claim, `statement`, holds."""
    claims = [{"source": "Paper §3", "statement": statement, "holds": True, "evidence": "1e-3"}]
    write_run(
        out,
        "exp-0",
        "-",
        0,
        [(0, 0.0, 0.0, 0.0)],
        suite="orth",
        task="experiment:orth-error",
        claims=json.dumps(claims),
        target=None,
    )


def adamw_evals(seed: int) -> list[tuple[int, float, float, float]]:
    k = 1 + 0.1 * seed
    return [(0, 0.0, 2.0, 0.1), (10, 1.0 * k, 1.0, 0.5), (20, 2.0 * k, 0.2, 0.8 + 0.01 * seed)]


def muon_evals(seed: int) -> list[tuple[int, float, float, float]]:
    k = 1 + 0.2 * seed
    return [(0, 0.0, 2.0, 0.1), (10, 0.8 * k, 0.4 - 0.1 * seed, 0.7), (20, 1.6 * k, 0.1, 0.9 + 0.02 * seed)]


def adamw_and_muon_store(out: Path, seeds: int = 2) -> Path:
    """A new store at `out` holding runs of adamw (adamw_evals) and muon (muon_evals) for seeds 0 .. seeds - 1."""
    write.prepare(out)
    for seed in range(seeds):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed))
        write_run(out, f"muon-{seed}", "muon", seed, muon_evals(seed))
    return out
