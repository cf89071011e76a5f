"""benchmarks/command_speed.py: bad arguments are one line and exit 2, before anything is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--repeat", "0"], "--repeat"),
        (["--tree", "/nonexistent"], "--tree /nonexistent is not a structbench checkout"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(arguments: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.command_speed", *arguments], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error:") and message in done.stderr
    assert done.stdout == ""
