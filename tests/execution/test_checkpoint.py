"""Checkpoint and resume: a run interrupted after a checkpoint and run again ends exactly where an uninterrupted run
of the same key ends (CPU), for every optimizer, every task's data stream, and a real SIGKILL of the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from structbench import optim
from structbench.execution import checkpoint
from structbench.execution.job import Job, run_job
from structbench.plan import grid, spec
from structbench.store import write as store
from structbench.tasks.base import TaskContext
from structbench.tasks.quadratic import QuadraticTask
from tests.support.datasets import write_cifar10
from tests.support.store import read_runs
from tests.support.tasks import interrupt_at, language_task, vision_task

QUICK = ["budget.steps=30", "budget.checkpoint_every=10", "budget.eval_every=5", "budget.log_every=1"]
COMPARED = ["step", "split", "loss", "metric", "lr", "grad_norm"]


def quadratic_cell(optim_name: str, extra: list[str] | None = None) -> grid.Cell:
    suites, _ = spec.load_suites("quadratic", [*QUICK, "task_args.noise_scale=0.1", *(extra or [])], [optim_name], [0])
    return grid.build_grid(suites, "cpu")[0]


def job(cell: grid.Cell, out: Path) -> Job:
    store.prepare(out)
    return Job(cell=cell, device="cpu", data_root=str(out), out=str(out), executor="inline", parallel_runs=1, threads=1)


def curves(out: Path, run_id: str) -> pd.DataFrame:
    return pd.read_parquet(out / "curves" / f"{run_id}.parquet")[COMPARED]


@pytest.mark.parametrize("optim_name", optim.names())
def test_every_optimizer_resumes_bit_identically(optim_name, tmp_path, monkeypatch):
    cell = quadratic_cell(optim_name)
    whole = run_job(job(cell, tmp_path / "whole"))
    assert whole["status"] == "ok", whole["error"]

    with monkeypatch.context() as patch:
        interrupt_at(patch, 24)
        first = run_job(job(cell, tmp_path / "split"))
    assert first["status"] == "interrupted"
    assert (
        torch.load(checkpoint.directory(tmp_path / "split", cell.key) / checkpoint.FILE, weights_only=True)["step"]
        == 20
    )
    resumed = run_job(job(cell, tmp_path / "split"))

    assert resumed["status"] == "ok" and resumed["resumed_from_step"] == 20
    assert whole["resumed_from_step"] is None
    pd.testing.assert_frame_equal(
        curves(tmp_path / "whole", whole["run_id"]), curves(tmp_path / "split", resumed["run_id"])
    )
    assert resumed["final_eval_loss"] == whole["final_eval_loss"]
    assert resumed["final_train_loss"] == whole["final_train_loss"]
    assert resumed["state_bytes"] == whole["state_bytes"]
    assert not checkpoint.directory(tmp_path / "split", cell.key).exists(), "a stored final run removes its checkpoint"


SLOW_SAVE_S = 1.0
"""Each checkpoint's save sleeps this long: 30 steps of a quadratic take milliseconds, so even on a loaded machine the
training time stays far below two saves' worth, which it would exceed if the saves were counted in it."""


def test_checkpoints_land_every_k_steps_and_their_time_is_not_training_time(tmp_path, monkeypatch):
    cell = quadratic_cell("adamw")
    saves: list[int] = []
    original = checkpoint.save

    def slow_save(out: Path, run_key: str, payload: dict) -> None:
        saves.append(payload["step"])
        time.sleep(SLOW_SAVE_S)
        original(out, run_key, payload)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    row = run_job(job(cell, tmp_path))
    assert saves == [10, 20]  # not at the last step: the run is stored then
    assert row["checkpoint_s"] >= 2 * SLOW_SAVE_S
    assert row["wall_s"] < 2 * SLOW_SAVE_S, "the checkpoints' sleep would have been counted as training time"


def test_no_checkpoint_without_checkpoint_every(tmp_path, monkeypatch):
    cell = quadratic_cell("adamw", ["budget.checkpoint_every=0"])
    with monkeypatch.context() as patch:
        interrupt_at(patch, 24)
        run_job(job(cell, tmp_path))
    assert not (tmp_path / "checkpoints").exists()


def test_checkpoint_every_is_not_part_of_the_run_key():
    assert quadratic_cell("adamw").key == quadratic_cell("adamw", ["budget.checkpoint_every=7"]).key
    assert quadratic_cell("adamw").key != quadratic_cell("adamw", ["budget.steps=31"]).key


def test_an_unloadable_checkpoint_is_reported_and_the_run_starts_over(tmp_path, capsys):
    cell = quadratic_cell("sgd")
    whole = run_job(job(cell, tmp_path / "whole"))
    broken = checkpoint.directory(tmp_path / "split", cell.key)
    broken.mkdir(parents=True)
    (broken / checkpoint.FILE).write_bytes(b"not a checkpoint")
    row = run_job(job(cell, tmp_path / "split"))
    assert f"checkpoint {broken / checkpoint.FILE} does not load" in capsys.readouterr().err
    assert row["status"] == "ok" and row["resumed_from_step"] is None
    assert row["final_eval_loss"] == whole["final_eval_loss"]


def _batches(task: object, count: int) -> list[torch.Tensor]:
    return [task.train_loss(step).detach().clone() for step in range(count)]  # type: ignore[attr-defined]


def _stream_continues(make: object, draws: int, later: int) -> None:
    """A task's stream saved after `draws` batches, loaded into a fresh task, gives the same next `later` losses."""
    first = make()  # type: ignore[operator]
    _batches(first, draws)
    saved = first.stream_state()
    expected = _batches(first, later)
    second = make()  # type: ignore[operator]
    second.load_stream_state(saved)
    assert [float(t) for t in _batches(second, later)] == [float(t) for t in expected]
    third = make()  # type: ignore[operator]
    assert [float(t) for t in _batches(third, later)] != [float(t) for t in expected], "a fresh stream starts over"


def test_quadratic_noise_stream_continues():
    from structbench.tasks.quadratic import DEFAULTS

    ctx = TaskContext(seed=0, device=torch.device("cpu"), data_root=Path("."), batch_size=8)
    args = {**DEFAULTS, "noise_scale": 0.5}
    _stream_continues(lambda: QuadraticTask(dict(args), ctx), 3, 4)


def test_synthetic_classification_stream_continues():
    from structbench.tasks.synthetic_classification import DEFAULTS, SyntheticClassificationTask

    ctx = TaskContext(seed=0, device=torch.device("cpu"), data_root=Path("."), batch_size=8)
    _stream_continues(lambda: SyntheticClassificationTask(dict(DEFAULTS), ctx), 3, 4)


@pytest.mark.filterwarnings("ignore::structbench.data.checksums.ChecksumWarning")  # generated, not the published files
def test_vision_stream_continues_across_an_epoch_boundary_with_augmentation(tmp_path):
    write_cifar10(tmp_path, per_batch=5)  # 25 training images: 7 batches of 4 per epoch
    _stream_continues(lambda: vision_task(tmp_path, batch_size=4, augment="crop-flip"), 5, 6)


def test_language_stream_continues(tmp_path):
    roots = iter(range(3))  # each task writes its own (identical) corpus
    _stream_continues(lambda: language_task(tmp_path / str(next(roots))), 3, 4)


# ------------------------------------------------------------------ a real SIGKILL of the command line


def _command(out: Path, optim_name: str, steps: int) -> list[str]:
    return [
        sys.executable, "-m", "structbench", "run", "--suite", "quadratic", "--optim", optim_name, "--seed", "0",
        "--set", f"budget.steps={steps}", "--set", "budget.checkpoint_every=40", "--set", "budget.log_every=1",
        "--set", "budget.eval_every=40", "--set", "task_args.noise_scale=0.1", "--out", str(out), "--quiet",
    ]  # fmt: skip


def _checkpointed_step(path: Path) -> int:
    try:
        return int(torch.load(path, weights_only=True)["step"])
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


@pytest.mark.parametrize(("optim_name", "steps"), [("adamw", 4000), ("shampoo-4bit", 1500), ("alice", 1500)])
def test_a_run_killed_after_its_second_checkpoint_resumes_bit_identically(optim_name, steps, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole, split = tmp_path / "whole", tmp_path / "split"
    subprocess.run(_command(whole, optim_name, steps), check=True, env=env, capture_output=True, timeout=300)

    proc = subprocess.Popen(_command(split, optim_name, steps), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    key = read_runs(whole).run_key.iloc[0]
    path = checkpoint.directory(split, key) / checkpoint.FILE
    deadline = time.monotonic() + 240
    while _checkpointed_step(path) < 80 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = _checkpointed_step(path)
    assert 80 <= killed_at < steps, f"the run was not killed between its second checkpoint and its end ({killed_at})"
    assert not (split / "runs").is_dir() or not any((split / "runs").iterdir()), "SIGKILL stores nothing"

    subprocess.run(_command(split, optim_name, steps), check=True, env=env, capture_output=True, timeout=300)
    a, b = read_runs(whole).iloc[0], read_runs(split).iloc[0]
    assert b.status == "ok" and b.resumed_from_step >= killed_at
    pd.testing.assert_frame_equal(curves(whole, a.run_id), curves(split, b.run_id))
    assert a.final_eval_loss == b.final_eval_loss
    assert store.find_debris(split).paths() == []


def test_the_global_random_generators_continue_after_a_resume(tmp_path, monkeypatch):
    """A model whose training draws from torch's and Python's global generators (dropout, random augmentation)."""
    import random

    original = QuadraticTask.train_loss

    def noisy(self: QuadraticTask, index: int) -> torch.Tensor:
        return original(self, index) * (1 + 0.01 * torch.rand(()) + 0.01 * random.random())

    monkeypatch.setattr(QuadraticTask, "train_loss", noisy)
    cell = quadratic_cell("sgd")
    whole = run_job(job(cell, tmp_path / "whole"))
    with monkeypatch.context() as patch:
        interrupt_at(patch, 24)
        run_job(job(cell, tmp_path / "split"))
    resumed = run_job(job(cell, tmp_path / "split"))
    assert resumed["resumed_from_step"] == 20
    pd.testing.assert_frame_equal(
        curves(tmp_path / "whole", whole["run_id"]), curves(tmp_path / "split", resumed["run_id"])
    )
