"""Contention on record (issue 35, item 6): each run stores the 1-minute load average at its start and end, its
process CPU time and its usable cores; `run` warns once when the load exceeds the usable cores; the report marks
contended runs and flags step-time outliers among the seeds of one setting. The load is set with a monkeypatched
os.getloadavg, the cores with a monkeypatched environment.usable_cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from structbench import environment
from structbench.execution import record
from structbench.report.analysis.measurement import _outlier_seeds
from tests.support.store import read_runs

QUICK = ("run", "--suite", "quadratic", "--steps", "10", "--optim", "sgd", "--seed", "0", "--seed", "1", "--quiet")
WARNING = "warning: the 1-minute load average is"


def machine(monkeypatch: pytest.MonkeyPatch, load: float | None, cores: int = 2) -> None:
    """A machine with this 1-minute load average (None: the system reports none) and this many usable cores."""

    def getloadavg() -> tuple[float, float, float]:
        if load is None:
            raise OSError("no load average here")
        return (load, 0.0, 0.0)

    monkeypatch.setattr(os, "getloadavg", getloadavg)
    monkeypatch.setattr(environment, "usable_cores", lambda: cores)


def test_a_busy_machine_is_warned_of_once_recorded_and_marked_in_the_report(cli, monkeypatch, tmp_path: Path) -> None:
    machine(monkeypatch, load=9.0)
    result = cli(*QUICK, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stderr.count(WARNING) == 1
    assert "9.0, above the 2 usable cores" in result.stderr
    runs = read_runs(tmp_path)
    assert len(runs) == 2
    assert runs.load_avg_start.tolist() == [9.0, 9.0] and runs.load_avg_end.tolist() == [9.0, 9.0]
    assert runs.cpu_usable.tolist() == [2, 2]
    report = cli("report", "--out", tmp_path)
    assert report.exit_code == 0, report.output
    assert "measured under contention: sgd (seed 0, 1)" in " ".join(report.stdout.split())


def test_a_quiet_machine_gets_no_warning_and_no_mark(cli, monkeypatch, tmp_path: Path) -> None:
    machine(monkeypatch, load=1.5)
    result = cli(*QUICK, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert WARNING not in result.stderr
    assert read_runs(tmp_path).load_avg_start.tolist() == [1.5, 1.5]
    report = cli("report", "--out", tmp_path)
    assert "measured under contention" not in report.stdout


def test_a_system_without_a_load_average_stores_none_and_runs_on(cli, monkeypatch, tmp_path: Path) -> None:
    machine(monkeypatch, load=None)
    result = cli(*QUICK, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert WARNING not in result.stderr
    runs = read_runs(tmp_path)
    assert runs.load_avg_start.isna().all() and runs.load_avg_end.isna().all()
    assert (runs.status == "ok").all()


def test_cpu_time_is_the_process_time_between_start_and_end(monkeypatch) -> None:
    clock = iter([10.0, 13.5])
    monkeypatch.setattr(record.time, "process_time", lambda: next(clock))
    machine(monkeypatch, load=3.0)
    columns = record.LoadProbe.start().columns()
    assert columns == {"load_avg_start": 3.0, "load_avg_end": 3.0, "cpu_time_s": 3.5}


@pytest.mark.parametrize(
    ("times", "outliers"),
    [
        # The AdamW config: 236 ms and 14.5 ms per step on one machine, minutes apart.
        ([0.236, 0.0145], [0]),
        # One slow seed among three: 3.0 > 2 x 1.0.
        ([1.0, 1.1, 3.0], [2]),
        # Within a factor 2 of the fastest: no flag (2.0 exactly is not above it).
        ([1.0, 1.9], []),
        ([1.0, 2.0, 0.8], [1]),
        ([1.0, 2.0], []),
        # One seed has nothing to compare with; unknown times are left out.
        ([1.0], []),
        ([1.0, float("nan"), 5.0], [2]),
    ],
)
def test_a_seed_more_than_twice_its_settings_fastest_seed_is_an_outlier(times, outliers) -> None:
    assert _outlier_seeds(list(range(len(times))), times) == outliers
