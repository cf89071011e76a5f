"""A store is not trusted: no path built from a row's content is deleted, nothing a newer structbench wrote is moved or
removed, and `doctor --repair` says what it could not do.

The facts checked are outside the code under test: a victim file's bytes, the SHA-256 of every file a store held
before a command, the files a directory lists afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from structbench.store import paths
from structbench.store import write as store
from tests.support.store import hand_row

QUICK = ("--suite", "quadratic", "--optim", "sgd", "--seed", "0", "--steps", "20", "--quiet")
VICTIM_BYTES = b"a file outside the store that no structbench command may delete"
DATA_DIRS = ("runs", "curves", "tables", "claims")


def only_run_file(out: Path) -> Path:
    (path,) = sorted((out / "runs").glob("*.parquet"))
    return path


def rewrite_column(path: Path, column: str, value: object, kind: pa.DataType) -> None:
    """Rewrite one column of a one-row Parquet file in place (the file keeps its own name)."""
    table = pq.read_table(path)
    index = table.column_names.index(column)
    pq.write_table(table.set_column(index, column, pa.array([value], kind)), path)


def hashes(out: Path) -> dict[Path, str]:
    """SHA-256 of every file in the store's data directories."""
    return {
        path: hashlib.sha256(path.read_bytes()).hexdigest()
        for directory in DATA_DIRS
        for path in sorted((out / directory).rglob("*"))
        if path.is_file()
    }


# ------------------------------------------------------------------ nothing outside the store is deleted


def test_a_crafted_run_id_cannot_make_rerun_delete_outside_the_store(cli, tmp_path):
    """The stored row names `../../outside/victim` as its run id; `run --rerun` of its key replaces the run (the
    files named by the run file's own name go) and the victim outside the store keeps its bytes."""
    out, victim = tmp_path / "store", tmp_path / "outside" / "victim.parquet"
    assert cli("run", *QUICK, "--out", out).exit_code == 0
    victim.parent.mkdir()
    victim.write_bytes(VICTIM_BYTES)
    crafted = only_run_file(out)
    rewrite_column(crafted, "run_id", "../../outside/victim", pa.string())

    result = cli("run", *QUICK, "--rerun", "--out", out)

    assert result.exit_code == 0, result.stderr
    assert victim.read_bytes() == VICTIM_BYTES
    assert not crafted.exists(), "the replaced run is found by its file's name"
    assert not (out / "curves" / crafted.name).exists()
    assert len(list((out / "runs").glob("*.parquet"))) == 1


def test_remove_runs_takes_only_run_ids_the_store_lists(tmp_path):
    """Ids not of the run-id form, ids no file has, and a run file that is a link: only the link goes."""
    out, victim = tmp_path / "store", tmp_path / "victim.parquet"
    store.prepare(out)
    victim.write_bytes(VICTIM_BYTES)
    link = out / "runs" / "20250101T000000-s-sgd-s0-abcdef.parquet"
    link.symlink_to(victim)
    store.remove_runs(out, ["../victim", "../../victim", "/" + str(victim.with_suffix("")), "victim"])
    assert victim.read_bytes() == VICTIM_BYTES and link.is_symlink()
    store.remove_runs(out, [link.stem])
    assert not link.is_symlink() and victim.read_bytes() == VICTIM_BYTES


def test_each_guard_of_remove_runs_holds_on_its_own(tmp_path):
    """A listed file whose name is no run id, a run id whose path is a directory (not a listed file), and a run file
    listed through a `runs` link that leaves the store: none is removed (and nothing raises)."""
    out, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.prepare(out)
    (out / "curves" / "adamw-0.parquet").write_bytes(VICTIM_BYTES)
    directory_id = "20250101T000000-s-sgd-s1-abcdef"
    (out / "curves" / f"{directory_id}.parquet").mkdir()
    (out / "curves" / f"{directory_id}.parquet" / "inner").write_bytes(VICTIM_BYTES)
    linked_id = "20250101T000000-s-sgd-s2-abcdef"
    elsewhere.mkdir()
    (elsewhere / f"{linked_id}.parquet").write_bytes(VICTIM_BYTES)
    (out / "runs").rmdir()
    (out / "runs").symlink_to(elsewhere, target_is_directory=True)
    store.remove_runs(out, ["adamw-0", directory_id, linked_id])
    assert (out / "curves" / "adamw-0.parquet").read_bytes() == VICTIM_BYTES
    assert (out / "curves" / f"{directory_id}.parquet" / "inner").read_bytes() == VICTIM_BYTES
    assert (elsewhere / f"{linked_id}.parquet").read_bytes() == VICTIM_BYTES


def test_clean_never_removes_through_a_link_that_leaves_the_store(cli, tmp_path):
    """`checkpoints` is a link to a directory elsewhere holding a checkpoint of a stored run's key: not debris."""
    out, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    assert cli("run", *QUICK, "--out", out).exit_code == 0
    key = store.run_keys(out).run_key.iloc[0]
    (elsewhere / key).mkdir(parents=True)
    (elsewhere / key / "checkpoint.pt").write_bytes(VICTIM_BYTES)
    (out / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    assert store.clean(out).paths() == []
    assert (elsewhere / key / "checkpoint.pt").read_bytes() == VICTIM_BYTES


@pytest.mark.parametrize("run_id", ["../../victim", "../victim", ".hidden", "a/b", "", "esc\x1b]8;;x\x07"])
def test_a_run_is_never_written_under_a_name_that_leaves_its_directory(tmp_path, run_id):
    out = tmp_path / "store"
    store.prepare(out)
    with pytest.raises(ValueError, match="does not name a file inside the results store"):
        store.write_run(out, hand_row(run_id=run_id, status="ok"), [])
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(
    ("text", "is_id"),
    [
        ("20251201T120000-quadratic-sgd-s0-0a1b2c", True),
        ("20251201T120000-my-suite-pkg.mod:Opt-s-3-0a1b2c", True),
        ("../../outside/victim", False),
        ("20251201T120000-quadratic-../x-s0-0a1b2c", False),
        ("20251201T120000-quadratic-sgd-s0-0a1b2c/../../x", False),
        ("20251201T120000-quadratic-sgd-s0-0A1B2C", False),
        ("20251201T120000-quadr\x1b]8;;x\x07atic-sgd-s0-0a1b2c", False),
        ("adamw-0", False),
    ],
)
def test_run_ids_have_the_form_new_run_id_gives(text, is_id):
    assert paths.is_run_id(text) is is_id


def test_every_run_id_the_runner_makes_is_one(tmp_path):
    from structbench.execution.runner import new_run_id

    assert all(paths.is_run_id(new_run_id(suite, optim, seed)) for suite, optim, seed in
               [("quadratic", "sgd", 0), ("a-b", "pkg.mod:Cls", 12), ("x", "shampoo-4bit", -1)])  # fmt: skip


# ------------------------------------------------------------------ files of a newer structbench


def newer_store(cli, out: Path) -> Path:
    """A store whose one run (with its curve file) is rewritten as schema version 2, as a newer structbench would
    write it; and a claim file of version 2."""
    assert cli("run", *QUICK, "--out", out).exit_code == 0
    run = only_run_file(out)
    rewrite_column(run, "schema_version", 2, pa.int32())
    claim = {f.name: None for f in store.CLAIMS_SCHEMA} | {"claim_row_id": "c-1", "schema_version": 2}
    store.claims_dir(out).mkdir()
    pq.write_table(pa.Table.from_pylist([claim], schema=store.CLAIMS_SCHEMA), store.claims_dir(out) / "c-1.parquet")
    return run


UPGRADE = "written by a newer structbench (schema 2): upgrade to read them"


def test_a_newer_schema_store_survives_doctor_repair_and_run_byte_identical(cli, tmp_path):
    out = tmp_path / "store"
    run = newer_store(cli, out)
    before = hashes(out)
    assert {p.parent.name for p in before} == {"runs", "curves", "claims"}

    doctor = cli("doctor", "--out", out, "--repair")
    assert doctor.exit_code == 0, doctor.stdout + doctor.stderr
    assert f"newer: {run}: {UPGRADE}" in doctor.stdout
    assert "quarantined" not in doctor.stdout and not (out / ".quarantine").exists()
    assert hashes(out) == before

    again = cli("run", *QUICK, "--out", out)  # its key is not cached (the newer row is not read): it runs beside it
    assert again.exit_code == 0, again.stderr
    assert f"1 run file(s) in {out} {UPGRADE}" in again.stderr
    after = hashes(out)
    assert {path: after.get(path) for path in before} == before
    assert len(after) == len(before) + 2, "the new run's row and curves beside the newer files"

    check = cli("doctor", "--out", out)
    assert check.exit_code == 0 and "every file readable but 2 written by a newer structbench" in check.stdout


def test_older_and_unknown_versions_are_still_quarantined(cli, tmp_path):
    out = tmp_path / "store"
    assert cli("run", *QUICK, "--out", out).exit_code == 0
    run = only_run_file(out)
    rewrite_column(run, "schema_version", 0, pa.int32())
    repaired = cli("doctor", "--out", out, "--repair")
    assert repaired.exit_code == 0
    assert f"quarantined: {run}: schema_version 0 is not supported" in repaired.stdout
    assert (out / ".quarantine" / "runs" / run.name).is_file() and not run.exists()


# ------------------------------------------------------------------ doctor --repair on a read-only store


@contextlib.contextmanager
def read_only(out: Path) -> Iterator[Path]:
    """The store `out` made read-only, as the path to use: its directories chmod'ed 0555 for a user; for root (whom
    permissions do not stop) a read-only bind mount of it, or a skip saying why when mounting is not allowed."""
    if os.geteuid() != 0:
        directories = [out, *(p for p in out.rglob("*") if p.is_dir())]
        for directory in directories:
            directory.chmod(0o555)
        try:
            yield out
        finally:
            for directory in directories:
                directory.chmod(0o755)
        return
    view = out.with_name(out.name + "-read-only")
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(out), str(view)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root, for whom a read-only directory is writable, and cannot mount a read-only view "
                    f"of the store: {mounted.stderr.strip()}")  # fmt: skip
    try:
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def test_doctor_repair_on_a_read_only_store_says_what_it_could_not_remove(cli, tmp_path):
    out = tmp_path / "store"
    assert cli("run", *QUICK, "--out", out).exit_code == 0
    orphan_name = "20250101T000000-quadratic-sgd-s9-abcdef.parquet"
    corrupt_name = "20250101T000000-quadratic-sgd-s7-abcdef.parquet"
    (out / "curves" / orphan_name).write_bytes((out / "curves" / only_run_file(out).name).read_bytes())
    (out / "runs" / corrupt_name).write_bytes(b"not parquet")
    before = hashes(out)
    with read_only(out) as view:
        repaired = cli("doctor", "--out", view, "--repair")
    assert repaired.exit_code == 1
    assert "removed:" not in repaired.stdout and "quarantined:" not in repaired.stdout
    assert f"not removed: {view / 'curves' / orphan_name}: " in repaired.stderr
    assert f"not removed: {view / 'runs' / corrupt_name}: " in repaired.stderr
    assert f"error: 2 file(s) of {view} could not be repaired." in repaired.stderr
    assert "Traceback" not in repaired.stderr
    assert hashes(out) == before
