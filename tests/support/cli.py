"""The real Typer app run in-process."""

from __future__ import annotations

from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from structbench.cli.app import app


def invoke(*args: object) -> Result:
    """`structbench ARGS` in-process; click's Result (stdout and stderr separate). An exception propagates."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def usage_error(result: Result, out: Path) -> str:
    """The single stderr line of a usage error, after checking the exit code and that `out` was never created."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert not out.exists()
    return lines[0]
