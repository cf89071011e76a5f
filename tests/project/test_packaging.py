"""The built wheel carries every suite file, so an installed structbench finds its suites."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.support.paths import ROOT


def test_wheel_contains_every_suite(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("structbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    suites = sorted((ROOT / "structbench" / "suites").glob("*.toml"))
    assert suites
    assert {f"structbench/suites/{s.name}" for s in suites} <= names
