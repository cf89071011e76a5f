"""Stored strings reach the terminal inert: `report`, `status`, `doctor`, `export`, the table `run` ends with and the
one-line errors print no terminal control character (ESC, BEL, C1, bidirectional controls...) that a store held, and
show each as its escape, so the reader still sees that the value was odd.

The store is written through the store's own writer, with every kind of escape (tests.support.terminal_text) in every
string column of its runs and claims, in the hyperparameters' names and values, in a grid manifest's names, in the
names of an unreadable and a temporary file, and in the store's own directory name.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import Result
from rich.console import Console

from structbench.report.views import terminal
from structbench.store import grids
from structbench.store import write as store
from tests.support.cli import invoke
from tests.support.store import adamw_evals, muon_evals, write_run
from tests.support.terminal_text import ESCAPE_KINDS, HOSTILE, HOSTILE_NAME, VISIBLE, active_characters

STRUCTURAL = {"run_id", "suite", "optim", "status", "hparams", "spec", "routing", "claims"}
"""Run columns the test sets on their own (the writer's arguments) or that must hold JSON or a known status."""
SUITE, OPTIM = f"suite{HOSTILE}", f"optim{HOSTILE}"


def hostile_fields() -> dict[str, str]:
    """Every other string column of a run, each holding its name and every kind of escape."""
    names = [f.name for f in store.RUN_SCHEMA if str(f.type) == "string" and f.name not in STRUCTURAL]
    return {name: f"{name}{HOSTILE}" for name in names}


def write_hostile_runs(out: Path) -> None:
    """Two optimizers over two seeds, and a run that failed, every string of each hostile."""
    hparams = {"lr": 0.1, f"mode{HOSTILE}": HOSTILE}
    fields = hostile_fields()
    for seed in range(2):
        write_run(out, f"base-{seed}", "adamw", seed, adamw_evals(seed), suite=SUITE, hparams=hparams, **fields)
        write_run(out, f"evil-{seed}", OPTIM, seed, muon_evals(seed), suite=SUITE, hparams=hparams, **fields)
    failed = {**fields, "error": f"error{HOSTILE}", "run_key": f"failed-key{HOSTILE}"}
    write_run(out, "failed", OPTIM, 2, [(0, 0.0, 2.0, 0.1)], suite=SUITE, status="error", hparams=hparams, **failed)


def write_hostile_claim(out: Path) -> None:
    """A claim's verdict with every string column hostile; its paper and claim id, the table's first column (which
    does not wrap), with one short escape each, so that the other columns have room to be printed."""
    strings = {f.name: f"{f.name}{HOSTILE}" for f in store.CLAIMS_SCHEMA if str(f.type) == "string"}
    strings |= {"paper": "paper\x1b]0;t\x07", "claim_id": "claim\u202e"}
    numbers = {"schema_version": 1, "wall_s": 1.0, "started_at": datetime(2025, 3, 1, tzinfo=UTC)}
    store.write_claim(out, {**strings, **numbers, "claim_row_id": "claim-0"})


def write_hostile_manifest(out: Path) -> None:
    """A grid whose cells name hostile suites and optimizers, none of them run."""
    cells = [{"key": f"key-{i}{HOSTILE}", "suite": SUITE, "optim": f"missing{HOSTILE}", "seed": i} for i in range(2)]
    grids.write_manifest(out, "grid-0", {"created": "2025-03-01", "executor": "inline", "cells": cells})


def write_hostile_files(out: Path) -> None:
    """An unreadable run file and a writer's temporary file, both with hostile names."""
    (store.runs_dir(out) / f"{HOSTILE_NAME}.parquet").write_bytes(b"not parquet")
    (store.curves_dir(out) / f".{HOSTILE_NAME}.parquet{store.TEMPORARY_SUFFIX}").write_bytes(b"half")


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("inert") / f"store{HOSTILE_NAME}"
    store.prepare(out)
    write_hostile_runs(out)
    write_hostile_claim(out)
    write_hostile_manifest(out)
    write_hostile_files(out)
    return out


def assert_inert(result: Result, *, visible: bool = True) -> None:
    """No terminal control character in what the command printed, and (when `visible`) the escaped forms shown."""
    printed = result.stdout + result.stderr
    assert active_characters(printed) == [], sorted(set(active_characters(printed)))
    assert "Traceback" not in printed
    if visible:
        for escaped in VISIBLE:
            assert escaped in printed, (escaped, printed[-2000:])


def test_report_prints_stored_strings_inert(hostile_store):
    result = invoke("report", "--out", hostile_store)
    assert result.exit_code == 0, result.output
    assert_inert(result)
    assert "\\x1b]8;;u\\x1b\\L" in result.stderr  # the warning naming the hostile unreadable file
    assert "paper\\x1b]0;t\\x07/claim\\u202e" in result.stdout  # the claims section, from the stored claim
    assert "reason\\x1b]8;;" in result.stdout  # the line below a verdict (its reason)


def test_status_prints_stored_strings_inert(hostile_store):
    result = invoke("status", "--out", hostile_store)
    assert result.exit_code == 0, result.output
    assert_inert(result)
    assert "missing\\x1b" in result.stdout  # the manifest's optimizer, escaped


def test_doctor_prints_file_names_inert(hostile_store):
    result = invoke("doctor", "--out", hostile_store)
    assert result.exit_code == 1, result.output
    assert_inert(result)
    assert "\\x1b]8;;u\\x1b\\L" in result.stdout  # the hostile file names, whole


def test_export_messages_are_inert(hostile_store, tmp_path):
    dest = tmp_path / f"csv{HOSTILE_NAME}"
    result = invoke("export", dest, "--to", "csv", "--out", hostile_store)
    assert result.exit_code == 0, result.output
    assert_inert(result)
    assert "warning: skipped unreadable file" in result.stderr
    assert "exported 5 run(s)" in result.stdout


def test_an_error_quoting_stored_names_is_inert(hostile_store):
    result = invoke("report", "--out", hostile_store, "--optim", "none-such")
    assert result.exit_code == 2, result.output
    assert_inert(result)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_an_error_quoting_a_path_is_inert(tmp_path):
    result = invoke("status", "--out", tmp_path / f"gone{HOSTILE_NAME}")
    assert result.exit_code == 2, result.output
    assert_inert(result)
    assert result.stderr.startswith("error: results directory ")


def test_the_runs_table_of_run_is_inert():
    row = {name: f"{name}{HOSTILE}" for name in ("suite", "optim", "setting", "status", "eval_metric_name")}
    row |= {"seed": 0, "steps": 10, "final_eval_loss": 0.5, "final_eval_metric": 0.9, "wall_s": 1.0}
    row |= {"step_time_median_s": 0.01, "peak_mem_bytes": 1 << 20, "state_bytes": 1024}
    console = Console(file=io.StringIO(), width=2000, color_system=None)
    console.print(terminal.runs_table([row]))
    printed = console.file.getvalue()
    assert active_characters(printed) == []
    for escaped in VISIBLE:
        assert escaped in printed
    assert printed.count("[red]red[/red]") == 5  # each hostile column's markup printed as written


def test_the_hostile_store_holds_the_escapes(hostile_store):
    """The strings the tests above print really hold the raw escapes: the store kept them as written."""
    runs = json.loads(store.run_keys(hostile_store).to_json(orient="records"))
    assert {run["optim"] for run in runs} == {"adamw", OPTIM}
    assert all(run["suite"] == SUITE for run in runs)


def test_list_prints_a_suite_files_text_inert(tmp_path, monkeypatch):
    """A suite file of the working directory (one from a colleague) whose task, optimizers and description hold every
    kind of escape: `list suites` shows them escaped. Its optimizer list holds one kind each, so that each is printed
    whole (the table cuts a long cell without spaces short)."""
    fields = {"description": f"description{HOSTILE}", "task": f"task{HOSTILE}", "optims": list(ESCAPE_KINDS.values())}
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "hostile.toml").write_text(
        "\n".join(f"{key} = {json.dumps(value)}" for key, value in fields.items()), encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    result = invoke("list", "suites")
    assert result.exit_code == 0, result.output
    assert_inert(result)
