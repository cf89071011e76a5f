"""The one builder of a run's row fills the store's schema, and only the store's schema."""

from __future__ import annotations

import pytest

from structbench.execution import record
from structbench.store import write as store


def test_a_row_has_every_schema_column_in_schema_order_and_nulls_where_no_source_names_one():
    row = record.run_row(first={"suite": "s", "seed": 3}, second={"seed": 4, "status": "ok"})
    assert list(row) == store.RUN_SCHEMA.names
    assert (row["suite"], row["seed"], row["status"]) == ("s", 4, "ok"), "a later source wins"
    assert all(value is None for name, value in row.items() if name not in ("suite", "seed", "status"))


def test_a_source_naming_a_column_outside_the_schema_is_refused():
    assert "no_such_column" not in store.RUN_SCHEMA.names
    with pytest.raises(ValueError, match="'extra' names columns outside the store's schema: \\['no_such_column'\\]"):
        record.run_row(identity={"suite": "s"}, extra={"no_such_column": 1})
