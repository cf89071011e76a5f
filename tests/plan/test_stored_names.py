"""Names that become part of run file names (suite names, optimizer and --optim-alias names) are checked before any
work: a name that cannot be part of a file name is one usage-error line, exit 2, and the store is never created."""

from __future__ import annotations

import pytest

from structbench.store import paths

CLASS = "torch.optim:SGD"


@pytest.mark.parametrize(
    "alias",
    ["my/opt", "../../up", "back\\slash", "esc\x1b]0;title\x07", "zero\u200bwidth", "x" * (paths.NAME_MAX_BYTES + 1)],
)
def test_an_alias_that_cannot_name_a_file_is_refused_before_anything_runs(cli, tmp_path, alias):
    out = tmp_path / "results"
    result = cli("run", "--suite", "quadratic", "--optim-alias", f"{alias}={CLASS}", "--optim", alias, "--out", out)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --optim-alias name ") and len(result.stderr.splitlines()) == 1
    assert not out.exists()


def test_the_longest_alias_allowed_plans(cli, tmp_path):
    """A name of NAME_MAX_BYTES bytes (multi-byte characters counted as bytes) is accepted."""
    alias = "é" * (paths.NAME_MAX_BYTES // 2)
    result = cli("run", "--suite", "quadratic", "--optim-alias", f"{alias}={CLASS}", "--optim", alias, "--dry-run",
                 "--out", tmp_path / "results")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "3 runs: 0 cached, 3 to run" in result.stdout


def test_a_suite_file_whose_name_cannot_name_a_file_is_refused(cli, tmp_path):
    suite = tmp_path / "bad\x1b[2Jname.toml"
    suite.write_text('task = "quadratic"\noptims = ["sgd"]\nseeds = [0]\n')
    out = tmp_path / "results"
    result = cli("run", "--suite", suite, "--out", out)
    assert result.exit_code == 2
    assert "the suite name" in result.stderr and "\x1b" not in result.stderr
    assert not out.exists()


def test_the_longest_run_file_name_fits_a_file_system():
    """Two names of NAME_MAX_BYTES and the longest seed make a temporary name of at most 255 bytes."""
    from structbench.execution.runner import new_run_id

    name = "n" * paths.NAME_MAX_BYTES
    run_id = new_run_id(name, name, -(2**63))
    assert paths.is_run_id(run_id)
    assert len(f".{run_id}.parquet.tmp".encode()) <= 255
