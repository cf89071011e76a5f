"""The HTML report in a real headless browser (Debian's chromium; CI installs it in .ci/run).

The page must load offline without console output, every embedded figure must decode (the page's own
check records "decoded/total" in the root element's data-figures attribute, read back from the DOM), and
screenshots in the light and the dark colour scheme must show a drawn page, not a blank one. At a 1400 px wide
window, with 21 optimizers and an experiment's long claims, no table may reach past the window unless it sits in a
horizontally scrolling container that itself fits (so every column can be scrolled to), and the page itself must
not scroll sideways; a script added to a copy of the page measures this in the browser. Every figure's legend must
lie inside its image: the figures are drawn here, in this process, and each legend's extent is placed in the saved
image's pixels (where the image lies in the figure comes from figure_oracle.py).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageStat

from structbench.report import build
from structbench.report.figures import plots, render
from structbench.report.views import html
from structbench.store import write as store
from tests.support.cli import invoke
from tests.support.figure_oracle import drawn_by_matplotlib, keeping_figures, pixels, same_drawing
from tests.support.report_store import Point
from tests.support.report_store import write_run as write_validated_run
from tests.support.store import adamw_and_muon_store, write_run

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.system_part("chromium")
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
    root = tmp_path_factory.mktemp("browser")
    out = adamw_and_muon_store(root / "results", seeds=3)
    write_run(out, "sgd-0", "sgd", 0, [(0, 0.0, 2.0, 0.1), (5, 0.5, 1.5, 0.2)], status="diverged")
    result = invoke("report", "--out", out, "--format", "html", "--to", root / "rep")
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


OPTIMIZERS = [
    "sgd",
    "adamw",
    "adagrad-norm",
    "muon",
    "shampoo",
    "shampoo-4bit",
    "shampoo-4bit-naive",
    "soap",
    "eigen-adam",
    "galore",
    "fira",
    "apollo-mini",
    "apollo-svd",
    "racs",
    "alice",
    "alice-0",
    "asgo",
    "dasgo",
    "sumo",
    "sumo-ns5",
    "fismo",
]
LAYOUT = """
<script>
window.addEventListener("load", function () {
  var width = window.innerWidth, tables = [];
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  document.querySelectorAll("table").forEach(function (table) {
    var box = table.getBoundingClientRect(), scroller = table.closest(".scroll");
    var first = table.querySelector("tbody td, thead th");
    tables.push({
      right: box.right,
      width: table.scrollWidth,
      scroller: scroller ? {
        right: scroller.getBoundingClientRect().right,
        overflow: getComputedStyle(scroller).overflowX,
        scrollWidth: scroller.scrollWidth,
        clientWidth: scroller.clientWidth
      } : null,
      sticky: first ? getComputedStyle(first).position : ""
    });
  });
  document.documentElement.setAttribute("data-layout", JSON.stringify({
    width: width, page: document.documentElement.scrollWidth, tables: tables
  }));
});
</script>
"""


def rise(final_accuracy: float, steps: int = 120) -> list[Point]:
    return [
        Point(s, 0.02 * s, 2.3 - 2 * final_accuracy * s / steps, 0.1 + (final_accuracy - 0.1) * s / steps,
              2.3 - 2 * final_accuracy * s / steps, 0.1 + (final_accuracy - 0.1) * s / steps)
        for s in range(0, steps + 1, 20)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """21 optimizers x 3 seeds on a suite with a target and a throughput, plus an experiment with long claims;
    the report built in this process and its figures drawn with every matplotlib figure kept for inspection."""
    root = tmp_path_factory.mktemp("many")
    out = root / "results"
    store.prepare(out)
    for i, optim in enumerate(OPTIMIZERS):
        for seed in range(3):
            write_validated_run(
                out, f"{optim}-{seed}", optim, seed, rise(0.55 + 0.02 * i - 0.01 * seed),
                target={"metric": "accuracy", "value": 0.6}, throughput_per_s=1000.0 + i, throughput_unit="images/s",
            )  # fmt: skip
    for optim in OPTIMIZERS[:5]:  # a second, worse learning rate: a sweeps figure of five panels, 1280 CSS px wide
        for seed in range(3):
            write_validated_run(
                out, f"{optim}-slow-{seed}", optim, seed, rise(0.3), hparams={"lr": 0.01},
                target={"metric": "accuracy", "value": 0.6}, throughput_per_s=900.0, throughput_unit="images/s",
            )  # fmt: skip
    claims = [
        {"source": "Paper §3, Lemma 3.2", "statement": "the quintic iteration's error falls below the bound " * 4,
         "holds": i % 2 == 0, "evidence": "spectrum sigma_min=1e-3: error 2.1e-4 <= bound 3.3e-4; " * 5}
        for i in range(3)
    ]  # fmt: skip
    write_run(out, "exp-0", "-", 0, [(0, 0.0, 0.0, 0.0)], suite="orth-error", task="experiment:orth-error",
              claims=json.dumps(claims), target=None)  # fmt: skip
    with keeping_figures() as drawn:
        report = build.build_report(out, plotted=True)
        figures = render.render_figures(report, workers=1, cache=False)
    (root / "rep").mkdir()
    page = html.write(html.layout(report), figures, root / "rep")
    return page, drawn


def test_every_figure_legend_lies_inside_its_image(many):
    _, drawn = many
    legends = 0
    for fig, png in drawn:
        image = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
        height, width = image.shape
        assert width > 1000  # drawn at DPI 200: a figure at 100 would be under 640 pixels wide
        # The PNG is matplotlib's drawing cut to its ink (test_report_png.py); the cut says where the image lies.
        cut = drawn_by_matplotlib(fig)
        assert same_drawing(pixels(png), cut.pixels), fig.get_suptitle()
        renderer = fig.canvas.get_renderer()
        origin_x, origin_y = cut.left * plots.DPI, cut.top * plots.DPI - height
        for legend in [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends):
            box = legend.get_window_extent(renderer)
            left, right = box.x0 - origin_x, box.x1 - origin_x
            bottom, top = box.y0 - origin_y, box.y1 - origin_y
            assert left >= -1 and right <= width + 1 and bottom >= -1 and top <= height + 1, (fig.get_suptitle(), box)
            region = image[height - int(top) : height - int(bottom), int(left) : int(right)]
            assert (region < 200).mean() > 0.01  # the legend's text is drawn there
            # In columns: a legend is never taller than the axes it sits beside (21 entries in one column would be).
            axes = next((ax for ax in fig.axes if ax.get_legend() is legend), fig.axes[0])
            assert box.height <= axes.get_window_extent(renderer).height * 1.02, fig.get_suptitle()
            legends += 1
    assert legends >= 5


def test_no_table_reaches_past_a_1400_px_window_without_a_scroll_container(many, tmp_path):
    page, _ = many
    probe = tmp_path / "layout.html"
    probe.write_text(page.read_text().replace("</body>", LAYOUT + "</body>"))
    result = chromium(probe, tmp_path / "profile", tmp_path / "shot.png", "--dump-dom", "--window-size=1400,2000")
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'data-layout="([^"]+)"', result.stdout)
    assert found is not None, "the layout probe did not run"
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    assert 'id="fig-vision-sweeps" class="wide"' in page.read_text()
    assert layout["width"] == 1400 and layout["page"] <= layout["width"]  # the page never scrolls sideways
    wide = [t for t in layout["tables"] if t["width"] > 1400]
    assert wide, "no table is wider than the window: the check would prove nothing"
    for table in layout["tables"]:
        scroller = table["scroller"]
        assert scroller is not None and scroller["overflow"] in ("auto", "scroll")
        assert scroller["right"] <= layout["width"]
        assert scroller["scrollWidth"] >= table["width"]  # every column can be scrolled to
        assert table["sticky"] == "sticky"
        if table["right"] > layout["width"]:
            assert scroller["scrollWidth"] > scroller["clientWidth"]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_screenshots_of_the_wide_report_at_1400_px(many, tmp_path, scheme):
    page, _ = many
    shot = tmp_path / f"{scheme}.png"
    extra = ["--window-size=1400,2400"] + (["--blink-settings=preferredColorScheme=0"] if scheme == "dark" else [])
    result = chromium(page, tmp_path / "profile", shot, *extra)
    assert result.returncode == 0, result.stderr[-2000:]
    image = Image.open(shot).convert("L")
    assert image.size[0] == 1400
    corner = ImageStat.Stat(image.crop((0, 0, 1400, 40))).mean[0]
    assert (corner < 60) if scheme == "dark" else (corner > 200)
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
