"""Issue 35, item 5: `run --suite orth-error` prints its result table split into tables that fit the terminal, as
the report's tables are, instead of cutting its numbers to `…`."""

from __future__ import annotations

import pandas as pd

from structbench.cli.app import console
from tests.support.store import read_runs

WIDTH = 80


def test_an_experiment_table_on_a_narrow_terminal_shows_every_number(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(console, "width", WIDTH)
    out = tmp_path / "results"
    result = cli("run", "--suite", "orth-error", "--out", out)
    assert result.exit_code == 0, result.output
    assert set(read_runs(out)["status"]) == {"ok"}
    [stored] = list((out / "tables").glob("*.parquet"))
    table = pd.read_parquet(stored).drop(columns="run_id")  # the store's link to the run row, not printed
    assert table.shape[1] > 10  # far wider than 80 columns in one table
    lines = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert "…" not in result.stdout and "None" not in result.stdout and "<NA>" not in result.stdout
    assert lines and all(len(line) <= WIDTH for line in lines)
    cells = {cell.strip() for line in lines if line.startswith("│") for cell in line.strip("│").split("│")}
    for name in table.columns:
        assert any(name in line for line in lines), name
    numbers = {f"{v:.4g}" for column in table.select_dtypes("float") for v in table[column].dropna()}
    assert numbers and numbers <= cells, sorted(numbers - cells)[:5]
