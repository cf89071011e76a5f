"""The figures' readability rules: one look per optimizer, log and symmetric-log axes, twice the resolution."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from structbench.report import build
from structbench.report.figures import plots, render
from structbench.report.figures.figure_file import optimizer_looks
from structbench.store import write as store
from tests.support.report_store import Point, write_run


def test_twenty_one_optimizers_get_twenty_one_colours_and_no_two_look_alike():
    names = [f"optim-{i:02d}" for i in range(42)]
    looks = optimizer_looks(names)
    first = [looks[n] for n in sorted(names)[:21]]
    assert len({look.color for look in first}) == 21
    assert len({(look.color, look.dash) for look in looks.values()}) == 42
    # A light colour is the partner of a strong one (tab20 pairs them): the two never share a line style.
    for strong, light in zip(first[:10], first[10:20], strict=True):
        assert strong.dash != light.dash
    assert all(to_rgba(look.color) == look.color for look in first)


@pytest.mark.parametrize(
    ("values", "scale", "threshold"),
    [
        ([1.0, 2.0, 100.0], "log", 0.0),  # positive, a factor 100
        ([1.0, 2.0, 20.0], "linear", 0.0),  # positive, a factor 20
        ([-1000.0, -1.0, 0.0, 1.0, 1000.0], "symlog", 1.0),  # through zero; 10th percentile of 1, 1, 1000, 1000
        ([-2.0, -1.0, 1.0, 2.0], "linear", 0.0),  # through zero but within a factor 2
        ([0.0, 0.0], "linear", 0.0),
        ([np.nan, np.inf], "linear", 0.0),
    ],
)
def test_axis_scale(values, scale, threshold):
    found, limit = plots.y_scale(np.array(values))
    # Exact: the symlog threshold interpolates between two equal magnitudes (1 and 1), the others are 0.0 literals.
    assert found == scale and limit == threshold


def test_one_noisy_curve_puts_the_loss_axis_on_a_log_scale(tmp_path, monkeypatch):
    """One optimizer's training loss jumps to 1000 while the others stay near 1: a linear axis would flatten them."""
    out = tmp_path / "results"
    store.prepare(out)
    for optim, peak in (("adamw", 1.0), ("muon", 0.9), ("shampoo-4bit", 1000.0)):
        points = [Point(s, 0.01 * s, 1.0, 0.5, peak if s == 50 else 1.0 - s / 1000, 0.5) for s in range(0, 101, 25)]
        write_run(out, optim, optim, 0, points)
    drawn: list[Figure] = []
    original = plots._png
    monkeypatch.setattr(plots, "_png", lambda fig, title, ids: drawn.append(fig) or original(fig, title, ids))
    figures = render.render_figures(build.build_report(out, plotted=True), workers=1, cache=False)
    [loss] = [fig for fig in drawn if fig.get_suptitle() == "vision: training loss vs step"]
    assert loss.axes[0].get_yscale() == "log"
    [png] = [f for f in figures if f.name == "vision-loss-vs-step"]
    assert png.width > 1000  # a 6.4-inch figure at DPI 200 (at 100 it would be under 640 pixels)
