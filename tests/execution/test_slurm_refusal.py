"""A Slurm submission that sbatch refuses (here: no reachable controller, from an `sbatch` on the PATH that answers as
Slurm's does) is one line, exit 2, and leaves neither submitit's folder nor the grid's manifest behind; a submitted
grid's folder is this user's alone (submitit's pickles, which compute nodes unpickle, live there)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

SBATCH_ERROR = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"


def _fake_sbatch(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(script)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)


def test_a_refused_submission_is_one_line_exit_2_and_leaves_nothing(cli, tmp_path: Path, monkeypatch):
    script = f"#!/bin/sh\necho 'sbatch: some detail first' >&2\necho '{SBATCH_ERROR}' >&2\nexit 1\n"
    _fake_sbatch(tmp_path / "bin", script)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "results"
    result = cli("run", "--suite", "quadratic", "--optim", "sgd", "--steps", "3", "--executor", "slurm", "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == f"error: sbatch refused the job array: {SBATCH_ERROR}"
    assert "Traceback" not in result.output
    assert not (out / ".submitit").exists()
    assert list(out.glob(".grids/*.json")) == []


def test_a_submitted_grid_folder_is_private(tmp_path: Path, monkeypatch):
    from structbench.execution import slurm

    class Refused(Exception):
        pass

    folder = tmp_path / ".submitit" / "grid"
    made: list[int] = []

    def record_mode(*args, **kwargs):
        made.append(stat.S_IMODE(folder.stat().st_mode))
        raise Refused

    monkeypatch.setattr(slurm.quiet_submitit().AutoExecutor, "map_array", record_mode)
    with pytest.raises(Refused):
        slurm.submit_slurm([], slurm.SlurmOptions(), folder)
    assert made == [0o700]
