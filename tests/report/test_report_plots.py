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
        ([1.0, 2.0, 20.0], "log", 0.0),  # positive, a factor 20: more than a decade
        ([1.0, 2.0, 9.0], "linear", 0.0),  # positive, within a decade
        ([-1000.0, -1.0, 0.0, 1.0, 1000.0], "symlog", 1.0),  # through zero; 10th percentile of 1, 1, 1000, 1000
        ([-2.0, -1.0, 1.0, 2.0], "linear", 0.0),  # through zero but within a factor 2
        ([0.0, 0.0], "linear", 0.0),
        ([np.nan, np.inf], "linear", 0.0),
    ],
)
def test_axis_scale(values, scale, threshold):
    found, limit = plots.axis_scale(np.array(values))
    # Exact: the symlog threshold is a magnitude present (1), the others are 0.0 literals.
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


def figure_axes(out, monkeypatch, title: str) -> list:
    """The first two axes of the figure titled `title` that a report of `out` draws."""
    drawn: list[Figure] = []
    original = plots._png
    monkeypatch.setattr(plots, "_png", lambda fig, title, ids: drawn.append(fig) or original(fig, title, ids))
    render.render_figures(build.build_report(out, plotted=True), workers=1, cache=False)
    [figure] = [fig for fig in drawn if fig.get_suptitle() == title]
    return figure.axes[:2]


def quality_memory_axes(out, monkeypatch) -> list:
    """The axes (peak memory, optimizer state) of the quality-vs-memory figure a report of `out` draws."""
    return figure_axes(out, monkeypatch, "vision: quality vs memory")


@pytest.mark.parametrize(
    ("state_bytes", "state_scale"),
    [
        ((4096, 8192, 4 * 2**20), "log"),  # two optimizers kilobytes apart beside one with megabytes
        ((0, 4096, 4 * 2**20), "symlog"),  # SGD without momentum keeps no state
        ((4096, 8192, 16384), "linear"),  # within a decade
    ],
)
def test_memory_spanning_decades_gets_a_log_axis_in_the_quality_vs_memory_figure(
    tmp_path, monkeypatch, state_bytes, state_scale
):
    out = tmp_path / "results"
    store.prepare(out)
    for (optim, peak), state in zip((("sgd", 2**20), ("adamw", 2**21), ("shampoo", 2**30)), state_bytes, strict=True):
        points = [Point(0, 0.0, 1.0, 0.5, 1.0, 0.5), Point(10, 1.0, 0.5, 0.6, 0.5, 0.6 + peak / 2**32)]
        write_run(out, optim, optim, 0, points, peak_mem_bytes=peak, state_bytes=state)
    peak_axes, state_axes = quality_memory_axes(out, monkeypatch)
    assert peak_axes.get_xscale() == "log"  # 1 MiB to 1 GiB
    assert state_axes.get_xscale() == state_scale
    assert peak_axes.get_yscale() == "linear"  # final metrics 0.60 to 0.85: within a decade


@pytest.mark.parametrize(
    ("state_bytes", "state_scale"),
    [((4096, 8192, 4 * 2**20), "log"), ((0, 4096, 4 * 2**20), "symlog"), ((4096, 8192, 16384), "linear")],
)
def test_memory_bars_spanning_decades_get_a_log_axis(tmp_path, monkeypatch, state_bytes, state_scale):
    out = tmp_path / "results"
    store.prepare(out)
    for (optim, peak), state in zip((("sgd", 2**20), ("adamw", 2**21), ("shampoo", 2**30)), state_bytes, strict=True):
        points = [Point(0, 0.0, 1.0, 0.5, 1.0, 0.5), Point(10, 1.0, 0.5, 0.6, 0.5, 0.6)]
        write_run(out, optim, optim, 0, points, peak_mem_bytes=peak, state_bytes=state)
    peak_axes, state_axes = figure_axes(out, monkeypatch, "vision: memory")
    assert peak_axes.get_xscale() == "log"  # 1 MiB to 1 GiB
    low, high = peak_axes.get_xlim()
    assert 0 < low <= 2**20 / 2**30 and high >= 1, "every bar inside the axis (1 MiB to 1 GiB, drawn in GiB)"
    assert state_axes.get_xscale() == state_scale


@pytest.mark.parametrize(("step_times", "scale"), [((0.002, 0.004, 0.5), "log"), ((0.002, 0.004, 0.01), "linear")])
def test_step_time_bars_spanning_decades_get_a_log_axis_that_shows_every_part(tmp_path, monkeypatch, step_times, scale):
    """SGD's 2 ms beside Shampoo's 500 ms (a factor 250): a log axis whose left end is below every bar's parts,
    optimizer shares (a tenth of each step) included; within a decade, linear from zero."""
    out = tmp_path / "results"
    store.prepare(out)
    for optim, step_time in zip(("sgd", "adamw", "shampoo"), step_times, strict=True):
        points = [Point(0, 0.0, 1.0, 0.5, 1.0, 0.5), Point(10, 1.0, 0.5, 0.6, 0.5, 0.6)]
        write_run(
            out, optim, optim, 0, points, step_time_median_s=step_time, optim_time_median_s=step_time / 10
        )  # fmt: skip
    [axes, *_] = figure_axes(out, monkeypatch, "vision: step time")
    assert axes.get_xscale() == scale
    low, high = axes.get_xlim()
    assert high >= 1e3 * max(step_times)
    assert low <= (1e3 * min(step_times) / 10 if scale == "log" else 0)


@pytest.mark.parametrize(
    ("values", "threshold", "ticks"),
    [
        ([0.0, 0.0039, 4.0], 0.0039, [0.0, 0.01, 0.1, 1.0]),  # no decade inside the linear region, next to zero
        ([-100.0, 0.0, 1.0, 100.0], 1.0, [-100.0, -10.0, -1.0, 0.0, 1.0, 10.0, 100.0]),
    ],
)
def test_symlog_ticks_are_zero_and_the_decades_outside_the_linear_region(values, threshold, ticks):
    assert plots._symlog_ticks(np.array(values), threshold) == pytest.approx(ticks)
