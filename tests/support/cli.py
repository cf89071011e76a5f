"""The real Typer app run in-process."""

from __future__ import annotations

from click.testing import Result
from typer.testing import CliRunner

from structbench.cli.app import app


def invoke(*args: object) -> Result:
    """`structbench ARGS` in-process; click's Result (stdout and stderr separate). An exception propagates."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
