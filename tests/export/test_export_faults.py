"""`export` and `claims` on a full disk or a read-only destination: one `error:` line, exit 1 (as `run` and `report`
on a full disk), no temporary file left and no file half-replaced; and an export of a store with a missing or
damaged curve file warns and exports the rest."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pandas as pd
import pytest

from structbench.claims.base import HOLDS, ClaimDef, Outcome
from structbench.store import write as store
from tests.support.store import adamw_and_muon_store

FAULTS = {"full disk": errno.ENOSPC, "read-only": errno.EROFS}


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return adamw_and_muon_store(tmp_path / "results")


def failing_to_csv(code: int, after_bytes: int):
    """DataFrame.to_csv that writes `after_bytes` bytes of the file, then fails with the OS error `code`."""

    def write(frame: pd.DataFrame, path: Path, **kwargs: object) -> None:
        Path(path).write_text(frame.to_string()[:after_bytes])
        raise OSError(code, os.strerror(code))

    return write


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_csv_export_leaves_the_previous_files_and_no_temporary(cli, out, tmp_path, monkeypatch, fault):
    dest = tmp_path / "csv"
    first = cli("export", dest, "--to", "csv", "--out", out)
    assert first.exit_code == 0, first.output
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    monkeypatch.setattr(pd.DataFrame, "to_csv", failing_to_csv(FAULTS[fault], 100))
    result = cli("export", dest, "--to", "csv", "--out", out)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[-1] == f"error: cannot write to {dest}: {os.strerror(FAULTS[fault])}"
    assert "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before, "no temporary, the old files whole"


def test_an_export_skips_a_missing_or_damaged_curve_file_with_one_line_each(cli, out, tmp_path):
    (out / "curves" / "muon-0.parquet").unlink()
    damaged = out / "curves" / "adamw-1.parquet"
    damaged.write_bytes(damaged.read_bytes()[:40])
    dest = tmp_path / "csv"
    result = cli("export", dest, "--to", "csv", "--out", out)
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.stderr.splitlines() if not line.startswith("export to csv")]  # not the bar
    assert line.startswith(f"warning: skipped unreadable file {damaged}: ")
    assert line.endswith(f"; `structbench doctor --out {out} --repair` moves it to {out}/.quarantine")
    assert len(pd.read_csv(dest / "runs.csv")) == 4
    exported = pd.read_csv(dest / "curves.csv").groupby("run_id").size().to_dict()
    stored = {p.stem: len(pd.read_parquet(p)) for p in (out / "curves").glob("*.parquet") if p != damaged}
    assert exported == stored and set(exported) == {"adamw-0", "muon-1"}


def instant_claims(paper: str) -> list[ClaimDef]:
    """Two claims whose experiments return at once (the command's store writes are what is tested)."""
    found = Outcome(HOLDS, {"x": 1.0}, "x = 1")
    return [ClaimDef("paper", f"c{i}", "a statement", "arXiv 0000", "1", lambda scale, context: found) for i in (1, 2)]


def test_claims_on_a_full_disk_is_one_line_exit_1_and_leaves_no_temporary(cli, tmp_path, monkeypatch):
    out = tmp_path / "results"
    written: list[Path] = []

    def fills_the_disk(table: object, path: Path) -> None:
        if written:  # the first claim is stored, the second meets a full disk halfway through its file
            path.write_bytes(b"PAR1 half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(path)
        real_write(table, path)

    real_write = store._write_parquet
    monkeypatch.setattr("structbench.claims.claims_of", instant_claims)
    monkeypatch.setattr(store, "_write_parquet", fills_the_disk)
    result = cli("claims", "--scale", "ci", "--out", out, "--quiet")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == f"error: cannot write to the results store {out}: No space left on device"
    assert "Traceback" not in result.output
    assert sorted(p.name for p in store.claims_dir(out).iterdir()) == [written[0].name.removeprefix(".")[:-4]]
