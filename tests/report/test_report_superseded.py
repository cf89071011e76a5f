"""Which run of a seed that ran more than once counts: the latest with a final status, else the latest.

A rerun stopped by Ctrl-C (`interrupted`) or by a crash (`error`) says nothing about the optimizer, so it must
not hide an earlier result; a later result (`diverged`) does replace an earlier one; a seed whose only runs have
no result still shows its failure. Expected numbers are the final losses written below, worked out by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import pytest

from structbench.report import build
from structbench.store import write as store
from tests.support.store import T0, write_run

HOUR = timedelta(hours=1)


def nonzero(statuses: Mapping[str, int]) -> dict[str, int]:
    return {status: n for status, n in statuses.items() if n}


def evals(final_loss: float) -> list[tuple[int, float, float, float]]:
    return [(0, 0.0, 2.0, 0.1), (10, 1.0, 1.0, 0.5), (20, 2.0, final_loss, 0.8)]


@pytest.fixture(scope="module")
def rerun_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("reruns") / "results"
    store.prepare(out)
    # adamw: seed 0 ok (final loss 0.3), then a rerun interrupted; seed 1 ok (0.5), then reruns that hit an error
    # and were interrupted.
    write_run(out, "adamw-0-ok", "adamw", 0, evals(0.3), started=T0)
    write_run(out, "adamw-0-int", "adamw", 0, evals(9.0)[:2], status="interrupted", started=T0 + HOUR)
    write_run(out, "adamw-1-ok", "adamw", 1, evals(0.5), started=T0)
    write_run(out, "adamw-1-err", "adamw", 1, evals(9.0)[:2], status="error", started=T0 + HOUR)
    write_run(out, "adamw-1-int", "adamw", 1, evals(9.0)[:2], status="interrupted", started=T0 + 2 * HOUR)
    # muon: seed 0 ok (0.1), then a rerun that diverged: a result, so it counts.
    write_run(out, "muon-0-ok", "muon", 0, evals(0.1), started=T0)
    write_run(out, "muon-0-div", "muon", 0, evals(9.0)[:2], status="diverged", started=T0 + HOUR)
    # sgd: seed 0 interrupted twice and never finished: the latest interrupted run counts.
    write_run(out, "sgd-0-int-a", "sgd", 0, evals(9.0)[:2], status="interrupted", started=T0)
    write_run(out, "sgd-0-int-b", "sgd", 0, evals(9.0)[:2], status="interrupted", started=T0 + HOUR)
    return out


def test_an_interrupted_or_error_rerun_never_hides_an_earlier_result(rerun_store):
    suite = build.build_report(rerun_store).suites[0]
    adamw = suite.selected["adamw"]
    assert sorted(adamw.variant.run_ids) == ["adamw-0-ok", "adamw-1-ok"]
    assert nonzero(adamw.statuses) == {"ok": 2}
    # Exact: the median of the two stored losses is (0.3 + 0.5) / 2, the same float64 operations on the same
    # values (Parquet returns them bit for bit); a median that took the interrupted rerun's 9.0 is off by 4.
    assert adamw.final_loss.n == 2 and adamw.final_loss.median == (0.3 + 0.5) / 2
    assert set(suite.superseded["run_id"]) >= {"adamw-0-int", "adamw-1-err", "adamw-1-int"}


def test_a_later_final_status_replaces_an_earlier_result(rerun_store):
    suite = build.build_report(rerun_store).suites[0]
    muon = suite.selected["muon"]
    assert muon.variant.run_ids == ["muon-0-div"]
    assert nonzero(muon.statuses) == {"diverged": 1}
    assert muon.final_loss.n == 0  # the ok run's 0.1 does not count
    assert "muon-0-ok" in set(suite.superseded["run_id"])


def test_without_a_result_the_latest_failure_counts(rerun_store):
    suite = build.build_report(rerun_store).suites[0]
    sgd = suite.selected["sgd"]
    assert sgd.variant.run_ids == ["sgd-0-int-b"]
    assert nonzero(sgd.statuses) == {"interrupted": 1}
    assert list(suite.failures.loc[suite.failures["variant"] == "sgd", "run_id"]) == ["sgd-0-int-b"]
    assert set(suite.superseded["run_id"]) == {"adamw-0-int", "adamw-1-err", "adamw-1-int", "muon-0-ok", "sgd-0-int-a"}


def test_the_reports_list_superseded_runs_and_count_the_rest(cli, rerun_store, tmp_path):
    result = cli("report", "--out", rerun_store, "--format", "all", "--to", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    assert "2 ok" in result.stdout and "1 diverged" in result.stdout and "1 interrupted" in result.stdout
    markdown = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    for run_id, status in (("adamw-0-int", "interrupted"), ("adamw-1-err", "error"), ("muon-0-ok", "ok")):
        assert f"| {run_id} | " in markdown and f"| {status} (superseded) |" in markdown
    assert "5 run(s) of a seed that ran more than once are superseded" in markdown
