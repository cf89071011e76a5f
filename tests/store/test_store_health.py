"""Damage the readers meet: a manifest that is not what `run` writes is named by `status` (one line, with doctor's
remedy) while the good grids are still counted, and store.health.damage (what `doctor` reports) finds every file a
reader skips or rebuilds, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from structbench.store import grids, health
from structbench.store import write as store
from structbench.store.read import refresh_index
from tests.support.store import adamw_and_muon_store, index_file

GOOD_CELLS = [{"key": f"k{i}", "suite": "s", "optim": "muon", "setting": "", "seed": i} for i in range(3)]
BAD_MANIFESTS = {
    "not JSON": b'{"cells": [',
    "not UTF-8": b'{"cells": [], "created": "\xff"}',
    "a list": b"[]",
    "cells not a list": b'{"cells": 5}',
    "a cell without its key": json.dumps({"cells": [{"suite": "s", "optim": "muon"}]}).encode(),
    "a suite that is not text": json.dumps({"cells": [{"key": "k", "suite": 1, "optim": "muon"}]}).encode(),
    "a job id that is not text": json.dumps({"cells": [{"key": "k", "suite": "s", "optim": "m", "job_id": 7}]})
    .encode(),
    "a folder that is not text": json.dumps({"cells": [], "submitit_folder": ["/f"]}).encode(),
    "nested too deeply": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("bad", BAD_MANIFESTS)
def test_status_names_a_bad_manifest_and_counts_the_good_grid(cli, tmp_path, bad):
    out = tmp_path / "results"
    grids.write_manifest(out, "good", {"created": "1", "cells": GOOD_CELLS})
    broken = out / grids.GRIDS_DIR / "broken.json"
    broken.write_bytes(BAD_MANIFESTS[bad])
    result = cli("status", "--out", out)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: skipped unreadable file {broken}: ")
    assert lines[0].endswith(f"; `structbench doctor --out {out} --repair` moves it to {out}/.quarantine")
    row = next(line for line in result.stdout.splitlines() if "muon" in line)
    assert row.replace("│", " ").split() == ["s", "muon", "0", "0", "0", "0", "3"], "its 3 cells, missing"
    assert [p.path for p in health.damage(out)] == [broken]


@pytest.fixture
def indexed_store(tmp_path: Path) -> Path:
    out = adamw_and_muon_store(tmp_path / "results")
    refresh_index(out)
    return out


def test_a_sound_store_has_no_damage(indexed_store):
    assert health.damage(indexed_store) == []


def without_column(path: Path, column: str) -> None:
    """Rewrite a store file without one of its columns (a readable Parquet file the reader cannot use)."""
    table = pq.read_table(path)
    pq.write_table(table.drop_columns([column]), path)


def with_flipped_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_damage_is_what_the_report_skips_or_rebuilds(cli, indexed_store):
    out = indexed_store
    curve, run = out / "curves" / "muon-1.parquet", out / "runs" / "adamw-1.parquet"
    without_column(curve, "loss")  # Parquet metadata reads; the reader rejects it
    run.write_bytes(b"PAR1 not really")
    with_flipped_bit(index_file(out, "curves"), 64)
    found = {p.path: p.reason for p in health.damage(out)}
    assert set(found) == {curve, run, index_file(out, "curves")}
    assert found[curve] == "not a structbench store file: lacks column(s) loss"
    assert found[index_file(out, "curves")].startswith("damaged store index (its checksum does not match")
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    warned = {Path(line.split()[4].rstrip(":")) for line in report.stderr.splitlines() if "unreadable file" in line}
    assert warned == {curve, run}, "the report skips the two files; it rebuilt the index silently"
    assert {p.path for p in health.damage(out)} == {curve, run}


def test_files_of_another_schema_version_are_left_to_the_version_survey(indexed_store):
    run = indexed_store / "runs" / "muon-0.parquet"
    table = pq.read_table(run)
    column = table.column_names.index("schema_version")
    pq.write_table(table.set_column(column, "schema_version", pa.array([2], pa.int32())).drop_columns(["seed"]), run)
    without_column(indexed_store / "curves" / "muon-0.parquet", "loss")  # a newer curve layout, say
    assert health.damage(indexed_store) == []
    assert store.SCHEMA_VERSION == 1


def test_doctor_reports_and_repairs_what_the_readers_skip(cli, indexed_store):
    out = indexed_store
    curve, manifest = out / "curves" / "muon-1.parquet", out / grids.GRIDS_DIR / "broken.json"
    without_column(curve, "loss")
    manifest.parent.mkdir()
    manifest.write_bytes(b"[]")
    with_flipped_bit(index_file(out, "runs"), 64)
    found = cli("doctor", "--out", out)
    assert found.exit_code == 1
    assert sorted(line.split(": ")[1] for line in found.stdout.splitlines()) == sorted(
        str(p) for p in (curve, manifest, index_file(out, "runs"))
    )
    repaired = cli("doctor", "--out", out, "--repair")
    assert repaired.exit_code == 0, repaired.output
    assert (out / store.QUARANTINE / "curves" / curve.name).is_file() and not curve.exists()
    assert (out / store.QUARANTINE / grids.GRIDS_DIR / manifest.name).is_file()
    assert cli("doctor", "--out", out).exit_code == 0
    report = cli("report", "--out", out)
    assert report.exit_code == 0 and report.stderr == ""


def test_a_text_value_that_is_not_utf8_is_unreadable_damage_not_a_traceback(cli, tmp_path):
    """A flipped byte inside a run's spec text: Parquet reads it without complaint, and it used to fail only when the
    report turned every file's rows into Python strings (a traceback in report and export, CI's damaged-store fuzz).
    Read in full validation, it is that one file's damage: doctor, report and export name it."""
    out = adamw_and_muon_store(tmp_path / "store")
    victim = sorted((out / "runs").glob("*.parquet"))[0]
    table = pq.read_table(victim)
    spec = table.column("spec").to_pylist()[0].encode().replace(b'"budget"', b'"\xe5udget"')
    flipped = pa.array([spec], pa.binary()).cast(pa.string(), safe=False)  # Arrow does not check UTF-8 here
    pq.write_table(table.set_column(table.schema.get_field_index("spec"), "spec", flipped), victim)
    for command in ("doctor", "report", ("export", str(tmp_path / "export"), "--to", "csv")):
        words = (command,) if isinstance(command, str) else command
        result = cli(*words, "--out", out)
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert result.exit_code in (0, 1)
        assert str(victim) in result.stdout + result.stderr, words


def test_a_column_name_that_is_not_utf8_is_unreadable_damage_not_a_traceback(cli, tmp_path):
    """A flipped byte in a Parquet footer's column name makes pyarrow raise UnicodeDecodeError (a ValueError, not an
    ArrowException) while it reads the metadata: doctor and the report name the file like any damaged one."""
    out = adamw_and_muon_store(tmp_path / "store")
    victim = sorted((out / "curves").glob("*.parquet"))[0]
    data = victim.read_bytes()
    assert b"step_time_s" in data
    victim.write_bytes(data.replace(b"step_time_s", b"\xe5tep_time_s"))
    for command in ("doctor", "report"):
        result = cli(command, "--out", out)
        assert "Traceback" not in result.output
        assert result.exit_code in (0, 1)
        assert str(victim) in result.stdout + result.stderr, command
