"""A run id read from a row never names a file outside its directory: the store's one reader skips (and names) a run
file whose run id is not one plain file name, so the report and every exporter, which name files and folders after
run ids (TensorBoard's `<dest>/<run_id>/`), never see it. Also: a run stored without `finished_at` exports (the
exporters read NaT as absent)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from structbench.store import read
from structbench.store import write as store
from tests.support.store import adamw_and_muon_store

CRAFTED = ("../escaped", "/abs/escaped", "a/b", ".hidden", "tab\there", "")


def _craft(out: Path, run_id: str) -> Path:
    """Give the store's first run file (keeping its own name) the run id `run_id`."""
    path = sorted(store.runs_dir(out).glob("*.parquet"))[0]
    table = pq.read_table(path)
    index = table.column_names.index("run_id")
    pq.write_table(table.set_column(index, "run_id", pa.array([run_id], pa.string())), path)
    return path


@pytest.mark.parametrize("run_id", CRAFTED)
def test_the_reader_skips_and_names_a_run_file_whose_run_id_is_not_a_plain_name(tmp_path: Path, run_id: str):
    out = adamw_and_muon_store(tmp_path / "store")
    before = len(read.load_runs(out)[0])
    crafted = _craft(out, run_id)
    runs, problems = read.load_runs(out)
    assert len(runs) == before - 1
    assert run_id not in set(runs["run_id"])
    assert [(p.path, "not one plain file name" in p.reason) for p in problems] == [(crafted, True)]


def test_a_tensorboard_export_writes_nothing_outside_its_destination(cli, tmp_path: Path):
    pytest.importorskip("torch.utils.tensorboard")
    out = adamw_and_muon_store(tmp_path / "store")
    readable = len(read.load_runs(out)[0]) - 1
    _craft(out, "../escaped")
    dest = tmp_path / "deep" / "tb"
    result = cli("export", "--to", "tensorboard", dest, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert not (tmp_path / "deep" / "escaped").exists()
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["tb"]
    assert all(not p.name.startswith(".") for p in dest.iterdir())
    assert len(list(dest.iterdir())) == readable, "the other runs (stored without finished_at) are exported"


def test_doctor_names_the_crafted_run_file(cli, tmp_path: Path):
    out = adamw_and_muon_store(tmp_path / "store")
    crafted = _craft(out, "../escaped")
    result = cli("doctor", "--out", out)
    assert str(crafted) in result.stdout + result.stderr
    assert "not one plain file name" in result.stdout + result.stderr
