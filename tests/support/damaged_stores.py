"""Damaged copies of a store, each put through the commands that read a store, in one process per batch.

    python -m tests.support.damaged_stores BASE WORK FIRST COUNT

makes variants FIRST .. FIRST + COUNT - 1 of the store BASE (`variant`: one of its files with a few flipped bytes,
truncated, or deleted; the variant's other files are hard links to BASE's, so the store index still matches them
and is trusted unless checked) and runs `report`, `status`, `export`, `doctor` and `run` (a grid BASE already holds:
the end of `run` refreshes the index) on a fresh copy each, in-process with Typer's CliRunner (one interpreter for
the whole batch: importing structbench costs more than a command). Before each command it prints `start VARIANT
COMMAND` and after it one JSON line of what happened, flushed, so that the parent (tests/store/test_damaged_store_
fuzz.py) can tell which command a crashed process (a segmentation fault) was running and go on from the next.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from typer.testing import CliRunner

SEED = 38
COMMANDS = ("report", "status", "export", "doctor", "run")
GRID = ("--suite", "quadratic", "--steps", "20", "--optim", "sgd", "--optim", "adamw", "--seed", "0", "--quiet")
"""The grid the base store is built with (and that `run` finds stored)."""
MODES = ("flip", "flip", "flip", "flip", "truncate", "delete")
TRACEBACK = "Traceback (most recent call last)"
SKIPPED = re.compile(r"^warning: skipped unreadable file (.+?): ", re.MULTILINE)
DOCTOR_NAMED = re.compile(r"^(?:unreadable|found): (.+?)(?:: |$)", re.MULTILINE)


@dataclass(frozen=True)
class Damage:
    """What one variant does to its store: the file (relative to the store) and how."""

    victim: str
    mode: str


@dataclass(frozen=True)
class Outcome:
    """One command on one variant: its exit code, whether it ended in an exception (a traceback on a terminal), and
    the files it warned it skipped (doctor: the files it named)."""

    variant: int
    command: str
    exit_code: int
    traceback: bool
    named: list[str]


def store_files(base: Path) -> list[str]:
    """The files a variant may damage: the index, manifests, run, curve and claim files (not the lock file)."""
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file() and p.name != ".lock")


def damage_of(variant: int, files: list[str]) -> Damage:
    """The damage of variant number `variant` (derandomized: one seeded generator per variant)."""
    rng = random.Random(SEED * 1000 + variant)
    return Damage(rng.choice(files), rng.choice(MODES))


def damaged_bytes(data: bytes, mode: str, rng: random.Random) -> bytes:
    """`data` with 1 to 8 bytes flipped (each XORed with a non-zero byte), or truncated to a shorter length."""
    if mode == "truncate":
        return data[: rng.randrange(len(data))]
    flipped = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        flipped[rng.randrange(len(flipped))] ^= rng.randint(1, 255)
    return bytes(flipped)


def materialize(base: Path, dest: Path, damage: Damage, rng: random.Random) -> None:
    """A fresh copy of `base` at `dest` with `damage` done: the damaged file written anew, every other one a hard
    link (same inode and modification time, so the index's identities still match)."""
    shutil.rmtree(dest, ignore_errors=True)
    for path in sorted(base.rglob("*")):
        relative = str(path.relative_to(base))
        target = dest / relative
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative != damage.victim:
            os.link(path, target)
        elif damage.mode != "delete":
            target.write_bytes(damaged_bytes(path.read_bytes(), damage.mode, rng))


def command_line(command: str, store: Path, work: Path) -> list[str]:
    arguments = {
        "report": ["report"],
        "status": ["status"],
        "export": ["export", str(work / "export"), "--to", "csv"],
        "doctor": ["doctor"],
        "run": ["run", *GRID],
    }[command]
    return [*arguments, "--out", str(store)]


def run_command(runner: CliRunner, variant: int, command: str, store: Path, work: Path) -> Outcome:
    from structbench.cli.app import app

    result = runner.invoke(app, command_line(command, store, work))
    raised = result.exception is not None and not isinstance(result.exception, SystemExit)
    output = result.stdout + result.stderr
    pattern = DOCTOR_NAMED if command == "doctor" else SKIPPED
    named = sorted(set(pattern.findall(result.stdout if command == "doctor" else result.stderr)))
    return Outcome(variant, command, result.exit_code, raised or TRACEBACK in output, named)


def main(base: Path, work: Path, first: int, count: int, skip_commands: int) -> None:
    """Variants first .. first + count - 1, each command on a fresh copy (module docstring); the first
    `skip_commands` commands of the first variant are skipped (a restart after a crash)."""
    files = store_files(base)
    runner = CliRunner()
    for variant in range(first, first + count):
        damage = damage_of(variant, files)
        for index, command in enumerate(COMMANDS):
            if variant == first and index < skip_commands:
                continue
            store = work / "store"
            materialize(base, store, damage, random.Random(variant))
            print(f"start {variant} {command}", flush=True)
            print(json.dumps(asdict(run_command(runner, variant, command, store, work))), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
