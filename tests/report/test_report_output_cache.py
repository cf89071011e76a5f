"""The report's output cache: the same report of an unchanged store is printed from the cache, byte for byte, without
building anything; any change to the store, the request or the written files makes it computed again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from structbench.report import build
from structbench.store import write as store
from tests.support.paths import ROOT
from tests.support.store import adamw_and_muon_store, muon_evals, write_run


@pytest.fixture
def small_store(tmp_path: Path) -> Path:
    return adamw_and_muon_store(tmp_path / "results")


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the reports built (build.build_report calls)."""
    calls: list[int] = []
    real = build.build_report

    def counted(*args: object, **kwargs: object) -> build.Report:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "build_report", counted)
    return calls


def test_same_report_of_an_unchanged_store_is_printed_without_building(cli, small_store, builds) -> None:
    first = cli("report", "--out", small_store)
    second = cli("report", "--out", small_store)
    assert first.exit_code == second.exit_code == 0
    assert "muon" in first.stdout and second.stdout == first.stdout
    assert len(builds) == 1


def test_a_new_run_a_rewritten_run_and_other_options_are_computed_again(cli, small_store, builds) -> None:
    before = cli("report", "--out", small_store).stdout
    write_run(small_store, "muon-2", "muon", 2, muon_evals(2))
    added = cli("report", "--out", small_store).stdout
    assert "(t, 4 runs)" in before and "(t, 5 runs)" in added and len(builds) == 2
    write_run(small_store, "muon-2", "muon", 2, [(0, 0.0, 2.0, 0.1), (20, 2.0, 0.01, 0.99)])  # rewritten in place
    rewritten = cli("report", "--out", small_store).stdout
    assert len(builds) == 3 and rewritten != added
    cli("report", "--out", small_store, "--baseline", "muon")
    cli("report", "--out", small_store, "--optim", "muon")
    assert len(builds) == 5
    cli("report", "--out", small_store, "--optim", "muon")
    assert len(builds) == 5


def test_a_deleted_html_report_is_written_again(cli, small_store, builds, tmp_path) -> None:
    target = tmp_path / "pages"
    first = cli("report", "--out", small_store, "--format", "html", "--to", target)
    page = target / "report.html"
    assert first.exit_code == 0 and page.is_file()
    cli("report", "--out", small_store, "--format", "html", "--to", target)
    assert len(builds) == 1  # unchanged: nothing written, the same line printed
    page.unlink()
    again = cli("report", "--out", small_store, "--format", "html", "--to", target)
    assert len(builds) == 2 and page.is_file() and again.stdout == first.stdout
    page.write_text(page.read_text() + "<!-- edited -->")
    cli("report", "--out", small_store, "--format", "html", "--to", target)
    assert len(builds) == 3 and "edited" not in page.read_text()


def test_markdown_figures_deleted_are_drawn_again(cli, small_store, builds, tmp_path) -> None:
    target = tmp_path / "md"
    cli("report", "--out", small_store, "--format", "md", "--to", target)
    pngs = sorted((target / "figures").glob("*.png"))
    assert pngs
    pngs[0].unlink()
    cli("report", "--out", small_store, "--format", "md", "--to", target)
    assert len(builds) == 2 and pngs[0].is_file()


def test_a_store_with_an_unreadable_file_is_read_every_time(cli, small_store, builds) -> None:
    (small_store / "runs" / "broken.parquet").write_bytes(b"not parquet")
    for _ in range(2):
        result = cli("report", "--out", small_store)
        assert result.exit_code == 0 and "broken.parquet" in result.stderr
    assert len(builds) == 2


PROBE = """
import json, sys
from typer.testing import CliRunner
from structbench.cli.app import app

result = CliRunner().invoke(app, ["report", "--out", sys.argv[1]], catch_exceptions=False)
assert result.exit_code == 0, result.output
loaded = sorted({name.split(".")[0] for name in sys.modules} & {"pandas", "pyarrow", "torch", "matplotlib"})
print(json.dumps({"loaded": loaded, "stdout": result.stdout}))
"""


def test_a_report_from_the_cache_loads_neither_pandas_nor_torch(small_store) -> None:
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(small_store)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "pandas" in outputs[0]["loaded"] and "torch" not in outputs[0]["loaded"]
    assert outputs[1]["loaded"] == [] and outputs[1]["stdout"] == outputs[0]["stdout"]


def test_debris_warnings_are_printed_from_the_cache_too(cli, small_store, builds) -> None:
    leftover = small_store / "runs" / f".adamw-9.parquet{store.TEMPORARY_SUFFIX}"
    leftover.write_bytes(b"half a file")
    warned = [cli("report", "--out", small_store).stderr for _ in range(2)]
    assert len(builds) == 1
    assert warned[0] == warned[1] and "1 leftover temporary file" in warned[0]
    leftover.unlink()
    assert cli("report", "--out", small_store).stderr == "" and len(builds) == 2


def test_a_file_whose_time_alone_changed_is_computed_again(cli, small_store, builds) -> None:
    """Same size, same inode, a new modification time (a copy tool that writes in place): the store may differ."""
    cli("report", "--out", small_store)
    run_file = store.runs_dir(small_store) / "muon-1.parquet"
    before = run_file.stat()
    os.utime(run_file, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    after = run_file.stat()
    assert (after.st_size, after.st_ino) == (before.st_size, before.st_ino)
    cli("report", "--out", small_store)
    assert len(builds) == 2
