"""100 damaged copies of a real store (flipped bytes, truncations, deletions of one file each: the index, the grid
manifest, run, curve and claim files) through `report`, `status`, `export`, `doctor` and the end of `run`: no
traceback, no crash, and `doctor` names every file a reader skipped and every damaged index.

The commands run in-process (CliRunner) in two worker processes (tests/support/damaged_stores.py), one interpreter
per worker rather than one per command: a segmentation fault, which only a separate process survives to count,
ends its worker, which is counted as a crash of the command it was running and restarted from the next one.
Derandomized: each variant's damage comes from its own seeded generator.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from structbench.store import write as store
from tests.support import damaged_stores
from tests.support.cli import invoke
from tests.support.paths import ROOT

VARIANTS = 100
WORKERS = 2
DOCUMENTED_EXIT_CODES = {0, 1, 2}
"""docs/cli.md's exit codes of a command that was not interrupted."""
WORKER_TIMEOUT_S = 500


def claim_row() -> dict[str, object]:
    """A claim's verdict as `structbench claims` stores it (every CLAIMS_SCHEMA column)."""
    text = {name: "x" for name in store.CLAIMS_SCHEMA.names}
    started = datetime(2025, 3, 1, tzinfo=UTC)
    return {**text, "claim_row_id": "batch-paper-c1", "schema_version": 1, "wall_s": 1.0, "started_at": started}


@pytest.fixture(scope="module")
def base_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store: two runs of a tiny grid (run files, curves, the index, the grid's manifest) and a claim."""
    out = tmp_path_factory.mktemp("fuzz") / "base"
    result = invoke("run", *damaged_stores.GRID, "--out", out)
    assert result.exit_code == 0, result.output
    store.write_claim(out, claim_row())
    kinds = {Path(name).parts[0] for name in damaged_stores.store_files(out)}
    assert kinds == {"index", ".grids", "runs", "curves", "claims"}
    assert invoke("doctor", "--out", out).exit_code == 0, "the base store is sound"
    return out


def digests(out: Path) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in damaged_stores.store_files(out)}


def run_batch(base: Path, work: Path, first: int, count: int) -> tuple[list[dict], list[str]]:
    """The outcomes of variants first .. first + count - 1 (damaged_stores.main), and a line for each crash: a
    worker killed by a signal or ending with an error, restarted after the command it was running."""
    outcomes: list[dict] = []
    crashes: list[str] = []
    variant, skip = first, 0
    while variant < first + count:
        arguments = [base, work, variant, first + count - variant, skip]
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.damaged_stores", *map(str, arguments)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WORKER_TIMEOUT_S,
        )
        last = None
        for line in done.stdout.splitlines():
            if line.startswith("start "):
                last = (int(line.split()[1]), line.split()[2])
            elif line.startswith("{"):
                outcomes.append(json.loads(line))
        if done.returncode == 0:
            break
        crashes.append(f"{last}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
        if last is None:
            break
        position = damaged_stores.COMMANDS.index(last[1]) + 1
        variant, skip = (last[0], position) if position < len(damaged_stores.COMMANDS) else (last[0] + 1, 0)
    return outcomes, crashes


def test_damaged_stores_give_no_traceback_no_crash_and_doctor_names_the_damage(base_store, tmp_path):
    before = digests(base_store)
    share = VARIANTS // WORKERS
    with ThreadPoolExecutor(WORKERS) as pool:
        batches = list(
            pool.map(lambda w: run_batch(base_store, tmp_path / f"w{w}", w * share, share), range(WORKERS))
        )
    outcomes = [o for batch, _ in batches for o in batch]
    crashes = [c for _, batch in batches for c in batch]
    crashes += [f"{o['variant']} {o['command']}: exit {o['exit_code']}" for o in outcomes
                if o["exit_code"] not in DOCUMENTED_EXIT_CODES]  # fmt: skip
    tracebacks = [f"{o['variant']} {o['command']}" for o in outcomes if o["traceback"]]
    files = damaged_stores.store_files(base_store)
    damages = {v: damaged_stores.damage_of(v, files) for v in range(VARIANTS)}
    by_variant: dict[int, dict[str, dict]] = {}
    for o in outcomes:
        by_variant.setdefault(o["variant"], {})[o["command"]] = o
    undetected = []
    for variant, commands in sorted(by_variant.items()):
        doctor = set(commands["doctor"]["named"])
        skipped = {name for c, o in commands.items() if c != "doctor" for name in o["named"]}
        damage = damages[variant]
        if damage.victim.startswith("index/") and damage.mode != "delete":
            skipped.add(str(tmp_path / f"w{variant // share}" / "store" / damage.victim))
        undetected += [f"{variant} ({damage}): {name}" for name in sorted(skipped - doctor)]
    print(
        f"\n{VARIANTS} damaged stores x {len(damaged_stores.COMMANDS)} commands: {len(outcomes)} results, "
        f"{len(tracebacks)} tracebacks, {len(crashes)} crashes, {len(undetected)} damaged files doctor missed; "
        f"damage: {dict(Counter(d.mode for d in damages.values()))}, "
        f"files: {dict(Counter(Path(d.victim).parts[0] for d in damages.values()))}, "
        f"doctor found damage in {sum(by_variant[v]['doctor']['exit_code'] == 1 for v in by_variant)}"
    )
    assert tracebacks == [] and crashes == [] and undetected == []
    assert len(outcomes) == VARIANTS * len(damaged_stores.COMMANDS)
    assert {Path(d.victim).parts[0] for d in damages.values()} == {"index", ".grids", "runs", "curves", "claims"}
    assert any(o["named"] for o in outcomes if o["command"] == "report"), "some damage reaches the report"
    assert digests(base_store) == before, "the variants' hard links never wrote into the base store"
