"""A report that cannot be written (a full disk) leaves the previous report as it was and says so in one line."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from PIL import Image

from structbench.store import write as store
from tests.support.store import adamw_evals, muon_evals, write_run


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_a_full_disk_keeps_the_previous_report_and_exits_1(cli, tmp_path, monkeypatch, fmt):
    out, to = tmp_path / "results", tmp_path / "rep"
    store.prepare(out)
    for seed in range(2):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed))
    assert cli("report", "--out", out, "--format", fmt, "--to", to).exit_code == 0
    before = files(to)
    report = to / f"report.{fmt}"
    assert report.name in before
    # New runs, so the report that fails to be written differs from the one on disk.
    for seed in range(2):
        write_run(out, f"muon-{seed}", "muon", seed, muon_evals(seed))

    failed: list[Path] = []

    def half_then_full(path: Path, data: bytes | str) -> None:
        """Write half of a report file's bytes, then fail as a full disk does; other files are written."""
        raw = data.encode() if isinstance(data, str) else data
        if "report." not in path.name:
            with open(path, "wb") as handle:
                handle.write(raw)
            return
        with open(path, "wb") as handle:
            handle.write(raw[: len(raw) // 2])
        failed.append(path)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", lambda self, data: half_then_full(self, data))
    monkeypatch.setattr(Path, "write_text", lambda self, data, *a, **k: half_then_full(self, data))
    result = cli("report", "--out", out, "--format", fmt, "--to", to)
    monkeypatch.undo()

    assert failed  # the write did start, and failed midway
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [f"error: cannot write the report to {to}: No space left on device"]
    after = files(to)
    assert after[report.name] == before[report.name]  # byte-identical
    assert not [name for name in after if Path(name).name.startswith(".")]  # no temporary left behind
    assert set(after) >= set(before)
    for name in after:
        if name.endswith(".png"):
            Image.open(to / name).verify()  # every figure beside report.md is whole, old or new
