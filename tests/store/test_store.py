"""The results store: atomic writes, schema, tolerant reading."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from structbench.errors import StoreWriteError
from structbench.store import read as load
from structbench.store import write as store


def make_row(run_id: str, **changes):
    row = {field.name: None for field in store.RUN_SCHEMA}
    now = datetime.now(UTC)
    row.update(
        run_id=run_id,
        schema_version=store.SCHEMA_VERSION,
        suite="s",
        task="quadratic",
        optim="sgd",
        seed=0,
        hparams="{}",
        spec="{}",
        status="ok",
        started_at=now,
        finished_at=now,
        steps=3,
        wall_s=1.0,
        final_eval_loss=0.5,
    )
    row.update(changes)
    return row


CURVE = [
    {
        "step": 1,
        "wall_s": 0.1,
        "split": "train",
        "loss": 1.0,
        "metric": None,
        "lr": 0.1,
        "step_time_s": 0.1,
        "optim_time_s": 0.01,
    }
]


def test_written_run_reads_back_with_pandas(tmp_path):
    store.prepare(tmp_path)
    store.write_run(tmp_path, make_row("r1"), CURVE)
    runs = pd.read_parquet(tmp_path / "runs")
    assert runs.run_id.tolist() == ["r1"] and runs.schema_version.tolist() == [1]
    curves = pd.read_parquet(tmp_path / "curves")
    assert curves.run_id.tolist() == ["r1"] and curves.loss.tolist() == [1.0]
    assert math.isnan(curves.metric.iloc[0])


def test_a_write_that_fails_midway_leaves_no_file(tmp_path):
    store.prepare(tmp_path)

    def half_write(table, path):
        path.write_bytes(b"PAR1 partial")
        raise OSError("disk full")

    with pytest.raises(StoreWriteError, match=f"results store {tmp_path}: disk full"):
        store.write_run(tmp_path, make_row("r2"), CURVE, writer=half_write)
    assert sorted(p.name for p in tmp_path.rglob("*")) == [".lock", "curves", "runs", "tables"]


def test_run_row_write_failure_removes_the_curve_already_written(tmp_path):
    store.prepare(tmp_path)
    calls = {"n": 0}

    def fail_second(table, path):
        calls["n"] += 1
        if calls["n"] == 2:
            path.write_bytes(b"partial")
            raise OSError("crash")
        pq.write_table(table, path)

    store.write_run(tmp_path, make_row("before"), CURVE)
    with pytest.raises(StoreWriteError):
        store.write_run(tmp_path, make_row("r3"), CURVE, writer=fail_second)
    assert calls["n"] == 2
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["before.parquet"]
    assert [p.name for p in (tmp_path / "curves").iterdir()] == ["before.parquet"]


def test_rows_missing_contract_columns_or_with_bad_status_are_refused(tmp_path):
    store.prepare(tmp_path)
    row = make_row("r4")
    del row["wall_s"]
    with pytest.raises(ValueError, match="wall_s"):
        store.write_run(tmp_path, row, CURVE)
    with pytest.raises(ValueError, match="status"):
        store.write_run(tmp_path, make_row("r5", status="fine"), CURVE)
    assert not list(tmp_path.rglob("*.parquet"))


def test_corrupt_files_are_reported_by_doctor_and_the_report_and_skipped(tmp_path):
    """A run file that is not Parquet: `unreadable_files` (what `doctor` lists) names it and the report's loader reads
    the good rows without it; a hidden temporary file is neither a run nor a problem."""
    store.prepare(tmp_path)
    store.write_run(tmp_path, make_row("good"), CURVE)
    (tmp_path / "runs" / "bad.parquet").write_bytes(b"garbage")
    (tmp_path / "runs" / ".hidden.parquet.tmp").write_bytes(b"garbage")
    (tmp_path / "curves" / "bad.parquet").write_bytes(b"garbage")
    assert [(p.path.parent.name, p.path.name) for p in store.unreadable_files(tmp_path)] == [
        ("runs", "bad.parquet"),
        ("curves", "bad.parquet"),
    ]
    runs, problems = load.load_runs(tmp_path)
    assert runs.run_id.tolist() == ["good"]
    assert [p.path.name for p in problems] == ["bad.parquet"]


def set_schema_version(path, version):
    """Rewrite a run file with another `schema_version` (None: null; "absent": no such column)."""
    table = pq.read_table(path)
    i = table.column_names.index("schema_version")
    if version == "absent":
        table = table.remove_column(i)
    else:
        table = table.set_column(i, "schema_version", pa.array([version], pa.int32()))
    pq.write_table(table, path)


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        (0, "schema_version 0 is not supported (this structbench reads 1)"),
        (99, "written by a newer structbench (schema 99): upgrade to read them"),
        (None, "schema_version is missing (this structbench reads 1)"),
        ("absent", "schema_version is missing (this structbench reads 1)"),
    ],
)
def test_run_files_of_another_schema_version_are_reported_and_skipped(tmp_path, version, reason):
    """The report skips them with the reason; doctor calls the older and unknown ones unreadable (to quarantine) and
    the newer one newer (never touched)."""
    store.prepare(tmp_path)
    store.write_run(tmp_path, make_row("good", run_key="key-good"), CURVE)
    store.write_run(tmp_path, make_row("other", run_key="key-other"), CURVE)
    set_schema_version(tmp_path / "runs" / "other.parquet", version)
    runs, problems = load.load_runs(tmp_path)
    assert runs.run_id.tolist() == ["good"]
    assert [(p.path.name, p.reason) for p in problems] == [("other.parquet", reason)]
    survey = store.survey_files(tmp_path)
    listed = survey.newer if version == 99 else survey.unreadable
    assert [(p.path.name, p.reason) for p in listed] == [("other.parquet", reason)]
    assert [*survey.newer, *survey.unreadable] == listed
    assert store.run_keys(tmp_path).run_id.tolist() == ["good"]
    assert store.final_run_keys(tmp_path) == {"key-good": "good"}


def test_prepare_rejects_an_unwritable_directory(tmp_path):
    from structbench.errors import UsageError

    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not writable"):
        store.prepare(tmp_path / "file" / "out")


def test_the_stores_files_are_its_plain_files_by_name(tmp_path):
    """Run ids come from the run files' names; curve files without a run are orphans, listed by name. Hidden
    temporaries, `_`-prefixed files and directories are not store files (a temporary is debris of its own)."""
    out = tmp_path / "results"
    store.prepare(out)
    runs, curves = store.runs_dir(out), store.curves_dir(out)
    for name in ("b.parquet", "a.parquet", "_meta.parquet", ".a.parquet" + store.TEMPORARY_SUFFIX):
        (runs / name).write_bytes(b"")
    (runs / "d.parquet").mkdir()
    orphans = [f"o{i:02d}.parquet" for i in range(40)]
    created = ["b.parquet", "_x.parquet", *orphans[::2], *orphans[1::2][::-1]]  # neither order (nor its reverse)
    for name in created:  # is the names' order, which a directory's listing need not follow
        (curves / name).write_bytes(b"")
    (curves / "c.parquet").mkdir()
    assert store.run_ids(out) == {"a", "b"}
    debris = store.find_debris(out)
    assert debris.orphans == [curves / name for name in orphans]
    assert debris.temporaries == [runs / (".a.parquet" + store.TEMPORARY_SUFFIX)]
    assert store.run_ids(tmp_path / "elsewhere") == set()
