"""A dataset file whose md5 differs from the published one is read with a warning that reaches the terminal as one
clean `warning: ...` line per file: no source line, no category name (was Python's raw warning format)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.datasets import write_cifar10

CIFAR10_FILES = (
    "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch", "batches.meta",
)


@pytest.mark.parametrize("executor", ["inline", "local"])
def test_a_checksum_mismatch_prints_one_warning_line_per_file(tmp_path: Path, executor: str) -> None:
    data = tmp_path / "D"
    write_cifar10(data, per_batch=2)  # generated files: none has the published md5
    command = [
        sys.executable, "-m", "structbench", "run", "--suite", "cifar", "--optim", "adamw", "--seed", "0",
        "--steps", "1", "--data-dir", str(data), "--out", str(tmp_path / "out"), "--quiet",
        "--executor", executor, "--set", "task_args.model_options={width_div=32}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    checksum_lines = [line for line in result.stderr.splitlines() if "differs from the published" in line]
    batches = data / "cifar-10-batches-py"
    assert all(line.startswith(f"warning: {batches}/") and line.endswith("using it anyway") for line in checksum_lines)
    assert {line.split(":")[1].strip() for line in checksum_lines} == {str(batches / b) for b in CIFAR10_FILES}
    assert "ChecksumWarning" not in result.stderr and "warn_mismatches" not in result.stderr
