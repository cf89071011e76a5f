"""The store index (`<out>/index/`): `structbench run` leaves it holding exactly the store's runs, the report uses
its rows only while their files are unchanged, reads every other file directly, and gives the same output without
it, with a corrupt one or where it cannot be written."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from structbench.report import build
from structbench.report.cache_dir import CACHE_DIR
from structbench.store import cached_read
from structbench.store import write as store
from structbench.store.read import refresh_index
from tests.support.store import (
    INDEX_TRAILER,
    adamw_and_muon_store,
    adamw_evals,
    assert_indexes_the_store,
    index_file,
    indexed,
    muon_evals,
    read_runs,
    write_run,
)
from tests.support.tasks import interrupt_at

QUICK = ("--suite", "quadratic", "--steps", "30", "--quiet")


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the store files the report's reader opens."""
    names: list[str] = []
    real = pq.ParquetFile

    def counting(path: Path, *args: object, **kwargs: object) -> pq.ParquetFile:
        names.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(cached_read.pq, "ParquetFile", counting)
    return names


def test_run_leaves_an_index_of_exactly_the_stores_runs_and_a_later_run_is_still_reported(cli, tmp_path):
    result = cli("run", *QUICK, "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert_indexes_the_store(tmp_path)
    assert not (tmp_path / CACHE_DIR).exists(), "run writes the index, not the report's cache"
    # A run stored without indexing it (a copy, or a command that does not index) is read from its file.
    write_run(tmp_path, "hand-0", "muon", 0, muon_evals(0), suite="quadratic")
    report = cli("report", "--out", tmp_path)
    assert report.exit_code == 0, report.output
    assert "muon" in report.stdout  # only the run stored afterwards is muon's
    assert sorted(build.build_report(tmp_path).runs.run_id) == sorted([*read_runs(tmp_path).run_id])
    assert "hand-0" in set(indexed(tmp_path, "runs").run_id), "the report brought the index up to date"


def test_an_interrupted_grid_is_not_indexed(cli, tmp_path, monkeypatch):
    interrupt_at(monkeypatch, 12)
    result = cli("run", *QUICK, "--optim", "sgd", "--seed", "0", "--out", tmp_path)
    assert result.exit_code == 130
    assert len(read_runs(tmp_path)) == 1 and not store.index_dir(tmp_path).exists()


def test_a_signal_while_indexing_stops_it_and_the_run_exits_with_the_signals_code(cli, tmp_path, monkeypatch):
    def interrupted_refresh(out: Path) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises at once: never slept through
        refresh_index(out)

    monkeypatch.setattr("structbench.store.read.refresh_index", interrupted_refresh)
    started = time.monotonic()
    result = cli("run", *QUICK, "--optim", "sgd", "--seed", "0", "--out", tmp_path)
    assert result.exit_code == 128 + signal.SIGTERM
    assert time.monotonic() - started < 25
    assert "interrupted by SIGTERM: this command stored 1 run(s) (1 ok)" in result.stderr
    assert read_runs(tmp_path).status.tolist() == ["ok"] and not store.index_dir(tmp_path).exists()


def test_the_index_follows_the_store(tmp_path, opened):
    out = tmp_path / "results"
    store.prepare(out)
    write_run(out, "a-0", "adamw", 0, adamw_evals(0))
    first = build.build_report(out)
    # Exact throughout: Parquet and the index return the float64 losses bit for bit, and a median of two is
    # (a + b) / 2 on both sides.
    assert first.suites[0].selected["adamw"].final_loss.median == 0.2
    assert index_file(out, "runs").is_file() and index_file(out, "curves").is_file()
    assert not (out / CACHE_DIR / "runs.arrow").exists()
    # An index up to date: no store file is opened.
    opened.clear()
    assert len(build.build_report(out).runs) == 1 and opened == []
    # A new run and a rewritten run are both read from their files (and only they); the rewritten run's stale
    # index row is not used: its new final loss is the one reported.
    write_run(out, "a-1", "adamw", 1, adamw_evals(1))
    write_run(out, "a-0", "adamw", 0, [(0, 0.0, 2.0, 0.1), (20, 2.0, 0.05, 0.9)])
    second = build.build_report(out)
    assert second.suites[0].selected["adamw"].final_loss.median == (0.05 + 0.2) / 2
    assert sorted(opened) == ["a-0.parquet", "a-0.parquet", "a-1.parquet", "a-1.parquet"]
    assert sorted(indexed(out, "runs").final_eval_loss) == [0.05, 0.2]
    # A vanished run is dropped from the report and from the index.
    (out / "runs" / "a-1.parquet").unlink()
    assert len(build.build_report(out).runs) == 1
    assert indexed(out, "runs").run_id.tolist() == ["a-0"]
    # The index sits outside the store's datasets.
    assert len(pd.read_parquet(out / "runs")) == 1


def term_report(cli, out: Path) -> str:
    """The terminal report computed afresh (the report's own cache removed first)."""
    shutil.rmtree(out / CACHE_DIR, ignore_errors=True)
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def indexed_store(tmp_path: Path) -> Path:
    out = adamw_and_muon_store(tmp_path / "results")
    refresh_index(out)
    return out


def test_deleting_the_index_changes_nothing_in_the_report(cli, indexed_store):
    with_index = term_report(cli, indexed_store)
    assert "(t, 4 runs)" in with_index
    shutil.rmtree(store.index_dir(indexed_store))
    assert term_report(cli, indexed_store) == with_index
    assert_indexes_the_store(indexed_store)  # the report rebuilt it


DAMAGES = {
    "garbage": (lambda data: b"garbage", "too short to hold its checksum"),
    "truncated": (lambda data: data[: len(data) // 2], "not a structbench store index of this version"),
    "no trailer (format 1)": (lambda data: data[:-INDEX_TRAILER], "not a structbench store index of this version"),
    "one flipped bit": (
        lambda data: data[:100] + bytes([data[100] ^ 1]) + data[101:],
        "its checksum does not match its contents",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_corrupt_index_is_ignored_and_replaced(cli, indexed_store, opened, damage):
    expected = term_report(cli, indexed_store)
    path = index_file(indexed_store, "runs")
    damaged, reason = DAMAGES[damage]
    path.write_bytes(damaged(path.read_bytes()))
    assert cached_read.index_damage(path, store.RUN_SCHEMA) == reason
    opened.clear()
    assert term_report(cli, indexed_store) == expected
    assert sorted(n for n in opened if n.startswith("adamw")) == ["adamw-0.parquet", "adamw-1.parquet"]
    assert_indexes_the_store(indexed_store)


def test_an_index_whose_values_were_changed_in_place_is_not_trusted(indexed_store, opened):
    """A float in the index changed (a parseable file, same size, same store identities): without the checksum the
    report would take the changed value; it reads the run files instead, whose adamw final losses are both 0.2."""
    path = index_file(indexed_store, "runs")
    data = path.read_bytes()
    stored = struct.pack("<d", 0.2)
    assert data.count(stored) == 2, "adamw's two final eval losses, in the index's final_eval_loss column"
    path.write_bytes(data.replace(stored, struct.pack("<d", 0.05)))
    assert cached_read.index_damage(path, store.RUN_SCHEMA) == "its checksum does not match its contents"
    opened.clear()
    assert build.build_report(indexed_store).suites[0].selected["adamw"].final_loss.median == 0.2
    assert sorted(n for n in opened if n.startswith("adamw")) == ["adamw-0.parquet", "adamw-1.parquet"]
    assert cached_read.index_damage(path, store.RUN_SCHEMA) is None, "the read rebuilt it"


def test_an_index_that_cannot_be_written_is_ignored(cli, indexed_store):
    expected = term_report(cli, indexed_store)
    shutil.rmtree(store.index_dir(indexed_store))
    store.index_dir(indexed_store).write_bytes(b"")  # a file where the directory should be: nothing can go there
    refresh_index(indexed_store)
    assert term_report(cli, indexed_store) == expected
    assert store.index_dir(indexed_store).read_bytes() == b""


def test_clean_removes_a_temporary_index_file_a_crash_left(indexed_store):
    leftover = store.index_dir(indexed_store) / ".runs.arrow.4242.0123abcd.tmp"
    leftover.write_bytes(b"partial")
    assert store.clean(indexed_store).temporaries == [leftover]
    assert not leftover.exists() and index_file(indexed_store, "runs").is_file()


def test_refreshing_ignores_a_store_that_cannot_be_listed(indexed_store, monkeypatch):
    def unlistable(directory: Path) -> dict[str, str]:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(cached_read, "_identities", unlistable)
    before = index_file(indexed_store, "runs").read_bytes()
    refresh_index(indexed_store)  # returns: an index it cannot bring up to date is no error of the run's
    assert index_file(indexed_store, "runs").read_bytes() == before
