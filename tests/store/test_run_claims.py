"""Claims of run keys (structbench.store.run_claims): taken atomically by one process at a time, released, taken over
when stale (a dead or reused pid on this machine, a silent holder on another, an unreadable file) and never when
live; `stale_claims` lists what doctor reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from structbench.errors import StoreWriteError
from structbench.store import run_claims

KEY = "0123456789abcdef0123"
COMMAND = run_claims.Commander(pid=4242, host="planner", id="c0ffee")


def claim_file(out: Path, key: str = KEY) -> Path:
    return run_claims.claims_dir(out) / f"{key}.json"


def plant_claim(out: Path, **fields: object) -> Path:
    """A claim file as another holder wrote it: this process's holder with `fields` changed."""
    holder = {**vars(run_claims.Holder.this_process(COMMAND)), **fields}
    path = claim_file(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(holder))
    return path


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_claim_holds_its_holder_and_is_removed_when_released(tmp_path):
    held = run_claims.claim(tmp_path, KEY, COMMAND)
    assert isinstance(held, run_claims.Claim)
    written = json.loads(claim_file(tmp_path).read_text())
    assert (written["pid"], written["command_pid"], written["command_host"]) == (os.getpid(), 4242, "planner")
    held.release()
    assert not claim_file(tmp_path).exists()
    again = run_claims.claim(tmp_path, KEY, COMMAND)
    assert isinstance(again, run_claims.Claim)
    again.release()


def test_a_live_claim_is_not_taken_and_names_its_command(tmp_path):
    with run_claims.claim(tmp_path, KEY, COMMAND):
        other = run_claims.claim(tmp_path, KEY, run_claims.Commander(1, "other", "x"))
        assert isinstance(other, run_claims.Held)
        assert other.holder.describe() == "pid 4242 host planner"
        assert run_claims.stale_claims(tmp_path) == []
    assert not claim_file(tmp_path).exists()


def test_only_one_of_many_racing_claimants_gets_the_key(tmp_path):
    """Sixteen threads (each its own open lock file, so flock excludes them as it does processes) claim one key at
    once, over a stale claim: exactly one takes it over."""
    plant_claim(tmp_path, pid=dead_pid())
    start = threading.Barrier(16)
    results: list[object] = []

    def contend() -> None:
        start.wait()
        results.append(run_claims.claim(tmp_path, KEY, COMMAND))

    threads = [threading.Thread(target=contend) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [r for r in results if isinstance(r, run_claims.Claim)]
    assert len(won) == 1 and len(results) == 16
    won[0].release()


@pytest.mark.parametrize(
    "stale",
    [
        pytest.param({"pid": "dead"}, id="dead-pid"),
        pytest.param({"started": 12345.0}, id="reused-pid"),
        pytest.param({"host": "elsewhere", "age": run_claims.STALE_AFTER_S + 60}, id="silent-other-host"),
        pytest.param({"garbage": True}, id="unreadable"),
        pytest.param({"pid": "not a number"}, id="crafted-field"),
    ],
)
def test_a_stale_claim_is_listed_and_taken_over(tmp_path, stale):
    if stale.get("garbage"):
        path = claim_file(tmp_path)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"\x00{not json")
    else:
        fields = {k: v for k, v in stale.items() if k != "age"}
        if fields.get("pid") == "dead":
            fields["pid"] = dead_pid()
        path = plant_claim(tmp_path, **fields)
        if "age" in stale:
            old = time.time() - stale["age"]
            os.utime(path, (old, old))
    assert run_claims.stale_claims(tmp_path) == [path]
    taken = run_claims.claim(tmp_path, KEY, COMMAND)
    assert isinstance(taken, run_claims.Claim)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    taken.release()


def test_a_claim_from_another_host_that_keeps_its_heartbeat_is_live(tmp_path):
    path = plant_claim(tmp_path, host="elsewhere", pid=dead_pid())
    recent = time.time() - run_claims.STALE_AFTER_S / 2
    os.utime(path, (recent, recent))
    assert isinstance(run_claims.claim(tmp_path, KEY, COMMAND), run_claims.Held)
    assert run_claims.stale_claims(tmp_path) == []


def test_a_held_claim_is_touched_by_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(run_claims, "HEARTBEAT_S", 0.05)
    with run_claims.claim(tmp_path, KEY, COMMAND):
        path = claim_file(tmp_path)
        os.utime(path, (1.0, 1.0))
        deadline = time.monotonic() + 30
        while path.stat().st_mtime == 1.0:
            assert time.monotonic() < deadline, "the heartbeat never touched the claim"
            time.sleep(0.01)


def test_releasing_never_removes_a_claim_that_is_no_longer_ours(tmp_path):
    mine = run_claims.claim(tmp_path, KEY, COMMAND)
    assert isinstance(mine, run_claims.Claim)
    theirs = plant_claim(tmp_path, command_id="theirs")
    mine.release()
    assert json.loads(theirs.read_text())["command_id"] == "theirs"


def test_remove_stale_claims_keeps_live_ones(tmp_path):
    live = run_claims.claim(tmp_path, "f" * 20, COMMAND)
    stale = plant_claim(tmp_path, pid=dead_pid())
    assert run_claims.remove_stale_claims(tmp_path) == [stale]
    assert not stale.exists() and claim_file(tmp_path, "f" * 20).exists()
    live.release()


def test_claims_refuse_a_key_that_is_not_one_and_a_directory_that_leaves_the_store(tmp_path):
    with pytest.raises(ValueError, match="not a run key"):
        run_claims.claim(tmp_path, "../" + KEY, COMMAND)
    out, outside = tmp_path / "results", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    run_claims.claims_dir(out).symlink_to(outside)
    with pytest.raises(StoreWriteError, match="leads out of the results store"):
        run_claims.claim(out, KEY, COMMAND)
    assert list(outside.iterdir()) == []


def test_doctor_finds_a_stale_claim_as_debris_and_repair_removes_it_but_keeps_a_live_one(cli, tmp_path):
    stale = plant_claim(tmp_path, pid=dead_pid())
    found = cli("doctor", "--out", tmp_path)
    assert found.exit_code == 1
    assert f"found: {stale}" in found.stdout
    repaired = cli("doctor", "--out", tmp_path, "--repair")
    assert repaired.exit_code == 0, repaired.stderr
    assert f"removed: {stale}" in repaired.stdout
    assert not stale.exists()
    with run_claims.claim(tmp_path, KEY, COMMAND):
        assert cli("doctor", "--out", tmp_path, "--repair").exit_code == 0
        assert claim_file(tmp_path).exists(), "a live claim is no debris"
