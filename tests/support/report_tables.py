"""Reading a report's tables back in tests."""

from __future__ import annotations

from structbench.report.views import tables


def cells(table: tables.Table, label: str) -> dict[str, tables.Cell]:
    """The cells of the row whose first cell reads `label`, by column name."""
    [row] = [r for r in table.rows if r[0].text == label]
    return {c.name: cell for c, cell in zip(table.columns, row, strict=True)}
