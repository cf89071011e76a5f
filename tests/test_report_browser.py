"""The HTML report in a real headless browser (Debian's chromium; CI installs it in .ci/run).

The page must load offline without console output, every embedded figure must decode (the page's own
check records "decoded/total" in the root element's data-figures attribute, read back from the DOM), and
screenshots in the light and the dark colour scheme must show a drawn page, not a blank one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageStat

from structbench import store
from tests.test_report import adamw_evals, muon_evals, write_run

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it: apt-get install chromium)"
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,2000",
)


def chromium(page: Path, profile: Path, screenshot: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--screenshot={screenshot}",
            "--enable-logging=stderr",
            "--v=0",
            *extra,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def drawn(png: Path) -> tuple[int, float]:
    """(distinct colours, fraction of pixels that differ from the page's corner colour)."""
    rgb = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(np.int64)
    packed = rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]
    return len(np.unique(packed)), float((packed != packed[0]).mean())


@pytest.fixture(scope="module")
def html_report(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from structbench.cli import app

    root = tmp_path_factory.mktemp("browser")
    out = root / "results"
    store.prepare(out)
    for seed in range(3):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed))
        write_run(out, f"muon-{seed}", "muon", seed, muon_evals(seed))
    write_run(out, "sgd-0", "sgd", 0, [(0, 0.0, 2.0, 0.1), (5, 0.5, 1.5, 0.2)], status="diverged")
    result = CliRunner().invoke(app, ["report", "--out", str(out), "--format", "html", "--to", str(root / "rep")])
    assert result.exit_code == 0, result.output
    return root / "rep" / "report.html"


def test_html_loads_without_console_errors_and_every_figure_decodes(html_report, tmp_path):
    shot = tmp_path / "light.png"
    result = chromium(html_report, tmp_path / "profile", shot, "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == []
    figures = html_report.read_text().count("<img ")
    assert figures >= 7
    marker = re.search(r'data-figures="(\d+)/(\d+)"', result.stdout)
    assert marker is not None, "the page's load check did not run"
    assert marker.groups() == (str(figures), str(figures))
    colours, covered = drawn(shot)
    assert colours > 200 and covered > 0.05


def test_html_follows_the_dark_colour_scheme(html_report, tmp_path):
    shot = tmp_path / "dark.png"
    result = chromium(html_report, tmp_path / "profile", shot, "--blink-settings=preferredColorScheme=0")
    assert result.returncode == 0, result.stderr[-2000:]
    image = Image.open(shot).convert("L")
    assert ImageStat.Stat(image.crop((0, 0, 1280, 40))).mean[0] < 60  # a dark page background
    colours, covered = drawn(shot)
    assert colours > 200 and covered > 0.05
