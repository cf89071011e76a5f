"""Checkpoints cannot carry code (issue 38, item 1): a payload planted at a run's predictable checkpoint path never
runs, with checkpointing off or on; a checkpoint that does not load, or loads but does not fit the run, is reported
and the run starts over from step 0 exactly as a fresh run; a checkpoint is found only under its own run key, inside
the store."""

from __future__ import annotations

import builtins
import pickle
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from structbench.errors import StoreWriteError
from structbench.execution import checkpoint
from structbench.execution.job import run_job
from structbench.plan import grid
from structbench.store import paths
from structbench.store import write as store
from tests.execution.test_checkpoint import curves, job, quadratic_cell
from tests.support.store import read_runs
from tests.support.tasks import interrupt_at


class Payload:
    """Unpickled, it calls `open(marker, "w")`: the marker file appears if the checkpoint's loader runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return builtins.open, (str(self.marker), "w")


def plant(out: Path, run_key: str, marker: Path, as_torch_file: bool) -> Path:
    """A checkpoint of the current format at the key's path whose unpickling would create `marker`."""
    payload = {"format": checkpoint.FORMAT, "step": 20, "model": Payload(marker)}
    target = checkpoint.directory(out, run_key)
    target.mkdir(parents=True)
    path = target / checkpoint.FILE
    if as_torch_file:
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    return path


def test_the_planted_payload_is_live_when_unpickled_by_plain_pickle(tmp_path):
    """The payload the tests below plant does run code when loaded unsafely (so its marker's absence means
    something)."""
    marker = tmp_path / "marker"
    path = plant(tmp_path / "out", "0" * 20, marker, as_torch_file=False)
    pickle.loads(path.read_bytes())
    assert marker.exists()


def dry_run_key(cli, out: Path, *options: str) -> str:
    """The run key `structbench run --dry-run` prints (the single cell of the grid)."""
    result = cli("run", *options, "--out", out, "--dry-run")
    assert result.exit_code == 0, result.stderr
    keys = re.findall(r"\b[0-9a-f]{20}\b", result.stdout)
    assert len(keys) == 1, result.stdout
    return keys[0]


GRID = ("--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "30")


@pytest.mark.parametrize("as_torch_file", [True, False], ids=["torch-save", "raw-pickle"])
@pytest.mark.parametrize("checkpoint_every", [0, 10])
def test_a_planted_checkpoint_payload_never_runs(cli, tmp_path, checkpoint_every, as_torch_file):
    out, marker = tmp_path / "results", tmp_path / "marker"
    key = dry_run_key(cli, out, *GRID)
    planted = plant(out, key, marker, as_torch_file)

    result = cli("run", *GRID, "--set", f"budget.checkpoint_every={checkpoint_every}", "--out", out, "--quiet")

    assert not marker.exists(), "the planted checkpoint ran code"
    assert result.exit_code == 0, result.stderr
    row = read_runs(out).iloc[0]
    assert row.run_key == key and row.status == "ok" and pd.isna(row.resumed_from_step)
    if checkpoint_every:
        assert f"warning: checkpoint {planted} does not load (UnpicklingError: " in result.stderr
        assert row.checkpoint_discarded.startswith(f"checkpoint {planted} does not load")
    else:
        assert "checkpoint" not in result.stderr, "a run that does not checkpoint never opens the file"
        assert pd.isna(row.checkpoint_discarded)
    assert not planted.exists(), "the stored final run removed its key's checkpoint directory"


def interrupted_checkpoint(out: Path, cell: grid.Cell, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real checkpoint at step 20, left by a run interrupted at step 24."""
    with monkeypatch.context() as patch:
        interrupt_at(patch, 24)
        assert run_job(job(cell, out))["status"] == "interrupted"
    return checkpoint.directory(out, cell.key) / checkpoint.FILE


def assert_same_curves(tmp_path: Path, whole: dict, row: dict) -> None:
    """The run in `split` logged exactly the curves of the uninterrupted run in `whole`."""
    expected, got = curves(tmp_path / "whole", whole["run_id"]), curves(tmp_path / "split", row["run_id"])
    pd.testing.assert_frame_equal(expected, got)


def test_a_truncated_checkpoint_is_reported_and_the_run_starts_over(tmp_path, monkeypatch, capsys):
    cell = quadratic_cell("adamw")
    whole = run_job(job(cell, tmp_path / "whole"))
    path = interrupted_checkpoint(tmp_path / "split", cell, monkeypatch)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    row = run_job(job(cell, tmp_path / "split"))

    assert f"warning: checkpoint {path} does not load (" in capsys.readouterr().err
    assert row["status"] == "ok" and row["resumed_from_step"] is None
    assert row["checkpoint_discarded"].startswith(f"checkpoint {path} does not load")
    assert_same_curves(tmp_path, whole, row)


def tamper(path: Path, change: dict[str, object]) -> None:
    saved = torch.load(path, weights_only=True)
    saved.update(change)
    torch.save(saved, path)


@pytest.mark.parametrize("optim_name", ["adamw", "shampoo", "fismo"])
def test_a_checkpoint_that_does_not_fit_leaves_the_run_as_built(optim_name, tmp_path, monkeypatch):
    """The stream state, loaded after the model, optimizer and schedule, is broken: the run must still start from
    the built run's own state (curves equal to an uninterrupted run's, bit for bit), not from a half-loaded one."""
    cell = quadratic_cell(optim_name)
    whole = run_job(job(cell, tmp_path / "whole"))
    path = interrupted_checkpoint(tmp_path / "split", cell, monkeypatch)
    tamper(path, {"stream": {"noise_gen": torch.zeros(3, dtype=torch.uint8)}})

    row = run_job(job(cell, tmp_path / "split"))

    assert row["status"] == "ok" and row["resumed_from_step"] is None
    assert row["checkpoint_discarded"].startswith(f"checkpoint {path} does not fit this run (")
    assert_same_curves(tmp_path, whole, row)
    assert row["final_eval_loss"] == whole["final_eval_loss"]


def test_a_checkpoint_missing_an_entry_is_reported(tmp_path, monkeypatch):
    cell = quadratic_cell("sgd")
    path = interrupted_checkpoint(tmp_path, cell, monkeypatch)
    saved = torch.load(path, weights_only=True)
    del saved["rng"]
    torch.save(saved, path)
    with pytest.raises(checkpoint.Unusable, match="does not hold what a checkpoint holds"):
        checkpoint.load(tmp_path, cell.key)


def test_a_legitimate_checkpoint_is_not_read_when_the_run_does_not_checkpoint(tmp_path, monkeypatch):
    cell = quadratic_cell("sgd")
    interrupted_checkpoint(tmp_path, cell, monkeypatch)
    without = quadratic_cell("sgd", ["budget.checkpoint_every=0"])
    assert without.key == cell.key
    row = run_job(job(without, tmp_path))
    assert row["status"] == "ok" and row["resumed_from_step"] is None and row["checkpoint_discarded"] is None


def test_run_keys_are_what_names_a_checkpoint_directory(tmp_path):
    assert paths.is_run_key(quadratic_cell("sgd").key)
    for not_a_key in ("../../elsewhere", "0" * 19, "0" * 21, "G" * 20, "/" + "0" * 19, "0" * 20 + "\n"):
        with pytest.raises(ValueError, match="not a run key"):
            checkpoint.directory(tmp_path, not_a_key)


def linked_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    """A store whose checkpoints directory is a link to a folder outside it, holding a file for key 0...0."""
    out, outside = tmp_path / "results", tmp_path / "outside"
    (outside / ("0" * 20)).mkdir(parents=True)
    (outside / ("0" * 20) / checkpoint.FILE).write_bytes(b"victim")
    out.mkdir()
    store.prepare(out)
    (out / "checkpoints").symlink_to(outside)
    return out, outside / ("0" * 20) / checkpoint.FILE


def test_checkpoints_are_neither_read_written_nor_removed_through_a_link_out_of_the_store(tmp_path):
    out, victim = linked_checkpoints(tmp_path)
    with pytest.raises(checkpoint.Unusable, match="leads out of the results store"):
        checkpoint.load(out, "0" * 20)
    with pytest.raises(StoreWriteError, match="leads out of the results store"):
        checkpoint.save(out, "0" * 20, {"step": 1})
    checkpoint.remove(out, "0" * 20)
    assert victim.read_bytes() == b"victim"


def test_each_checkpoint_write_has_a_temporary_of_its_own(tmp_path, monkeypatch):
    """A save's temporary carries the writer's pid and a random suffix, so two writers never share one."""
    import os

    from structbench.store import atomic

    renamed: list[str] = []
    original = os.replace

    def recording(source: Path, target: Path) -> None:
        renamed.append(Path(source).name)
        original(source, target)

    monkeypatch.setattr(atomic.os, "replace", recording)
    store.prepare(tmp_path)
    for step in (1, 2):
        checkpoint.save(tmp_path, "0" * 20, {"step": step})
    assert len(set(renamed)) == 2, renamed
    assert all(f".{os.getpid()}." in name and name.endswith(store.TEMPORARY_SUFFIX) for name in renamed), renamed
    assert torch.load(checkpoint.directory(tmp_path, "0" * 20) / checkpoint.FILE, weights_only=True)["step"] == 2
