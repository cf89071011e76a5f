"""Two `structbench run` commands on one store with overlapping grids (issue 38, item 5): each run key runs once,
with checkpointing off and on, none ends `error`, and each command's summary says what it left to the other.

Both commands are released at the same moment, after their imports (each waits for a `go` file), so both usually plan
the grid against an empty store and meet on the keys they share; without claims both would run every shared key. On
a loaded machine one may plan after the other stored some shared keys: its grid line counts those as already stored,
and the accounting below includes them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from structbench.store import run_claims
from tests.support.store import read_runs

DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from structbench.cli import app as cli

    if __name__ == "__main__":  # local workers re-import this module as __mp_main__
        ready, go = Path(sys.argv[1]), Path(sys.argv[2])
        ready.touch()
        while not go.exists():
            time.sleep(0.01)
        sys.argv = ["structbench", *sys.argv[3:]]
        cli.app()
    """
)
SHARED = ["--suite", "quadratic", "--optim", "sgd", "--optim", "adamw", "--steps", "300", "--quiet"]
FIRST_SEEDS, SECOND_SEEDS = (0, 1, 2), (1, 2, 3)


def seeds(values: tuple[int, ...]) -> list[str]:
    return [part for seed in values for part in ("--seed", str(seed))]


def wait_for(paths: list[Path], procs: list[subprocess.Popen], limit_s: float) -> None:
    """Until every path exists; a command that exits first fails the test with its output."""
    deadline = time.monotonic() + limit_s
    while not all(p.exists() for p in paths):
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"a command ended before it was released: {proc.communicate()}")
        assert time.monotonic() < deadline, "the commands did not get ready"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("checkpoint_every", "second_executor"),
    [(0, ["--executor", "inline"]), (5, ["--executor", "local", "--jobs", "2"])],
    ids=["checkpoints-off", "checkpoints-on"],
)
def test_two_commands_with_overlapping_grids_run_each_key_once(tmp_path, checkpoint_every, second_executor):
    out, go = tmp_path / "results", tmp_path / "go"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    options = [*SHARED, "--set", f"budget.checkpoint_every={checkpoint_every}", "--out", str(out)]
    commands = [
        [*seeds(FIRST_SEEDS), *options],
        [*seeds(SECOND_SEEDS), *options, *second_executor],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ready = [tmp_path / f"ready-{i}" for i in range(len(commands))]
    procs = [
        subprocess.Popen(
            [sys.executable, str(driver), str(flag), str(go), "run", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for flag, command in zip(ready, commands, strict=True)
    ]
    wait_for(ready, procs, 120)
    go.touch()
    try:
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()

    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    runs = read_runs(out)
    per_key = runs.groupby("run_key").size()
    assert len(per_key) == 2 * len(set(FIRST_SEEDS) | set(SECOND_SEEDS)), per_key
    assert (per_key == 1).all(), f"keys run more than once: {per_key[per_key > 1].to_dict()}"
    assert set(runs.status) == {"ok"}, runs[["optim", "seed", "status", "error"]]
    assert len(list((out / "curves").iterdir())) == len(runs)
    assert not (out / "checkpoints").exists() or list((out / "checkpoints").iterdir()) == []
    assert list(run_claims.claims_dir(out).glob("*.json")) == [], "every claim was released"
    stored_by = [runs.command.str.contains("--seed 0").sum(), runs.command.str.contains("--seed 3").sum()]
    left_by = [_left_count(err) for _, err in outputs]
    cached_by = [_already_stored(text) for text, _ in outputs]
    planned = 2 * len(FIRST_SEEDS)
    accounted = [s + n + c for s, n, c in zip(stored_by, left_by, cached_by, strict=True)]
    assert accounted == [planned, planned], (stored_by, left_by, cached_by)
    print(f"stored by each command: {stored_by}; left to the other: {left_by}; already stored at its plan: {cached_by}")


def _already_stored(stdout: str) -> int:
    """Runs a command's grid line found stored when it planned: on a loaded machine one command may plan after the
    other has already stored some of the shared keys."""
    import re

    [count] = re.findall(r"^grid: \d+ runs — (\d+) already stored", stdout, re.M)
    return int(count)


def _left_count(stderr: str) -> int:
    """Runs a command's summary says it left to another structbench (running there or stored meanwhile)."""
    import re

    return sum(int(n) for n in re.findall(r"^(\d+) run\(s\) (?:left to|stored meanwhile by) another", stderr, re.M))
