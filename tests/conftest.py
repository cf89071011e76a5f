from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from structbench.cli import app


@pytest.fixture
def cli():
    """Invoke the real Typer app in-process; returns click's Result (stdout and stderr separate)."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


def read_runs(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "runs")


def read_curves(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "curves")
