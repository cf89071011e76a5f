"""The report's figures (matplotlib, Agg backend, no global pyplot state), as PNG bytes with their run ids.

Per suite: training loss against step and against wall-clock, the evaluation metric against step (on the validation
split where the runs hold one out; median over seeds, band from the smallest to the largest seed's value), peak
memory and optimizer-state bytes, final metric against memory with the Pareto front marked (on CPU only against
optimizer-state bytes: a resident set is approximate), the step-time breakdown, and, where optimizers were run under
several hyperparameter settings, their sweeps in one figure of small multiples: for each optimizer and swept
hyperparameter a panel of the selection metric (never the test split) against the hyperparameter (sweeps.py).
Across suites: the performance profiles.
Curves show each optimizer's selected setting (build.py); a run that did not end ok is a marked point at
the step where it stopped, never a missing line. Every PNG carries the ids of the runs it draws in its
"Description" text chunk.

Readability: figures are drawn at twice the screen resolution (DPI 200); each optimizer keeps one look (colour and
line style, figure_file.optimizer_looks) in every figure; legends sit outside the axes, in as many columns as keep
them at most LEGEND_ROWS tall, and the saved image is cut to what the figure drew (canvas.py), legends included; a
curve's y axis, and both axes of the quality-vs-memory figure, are logarithmic when their values are positive and span
more than a factor WIDE (a decade), and symmetric-log when they reach zero or below and span more than WIDE times
their small magnitudes (so one noisy curve does not flatten the others, and optimizers a few kilobytes of state apart
do not sit on 0 beside one with megabytes).

Speed (a 5,000-run report draws some hundred figures): each figure is laid out and drawn once, on a canvas with room
around it (canvas.py), not measured first as savefig's bbox "tight" does; text is drawn without FreeType's hinting
(STYLE), which at 200 DPI changes no more than glyph spacing by a fraction of a pixel and costs, with matplotlib 3.11's
glyph-by-glyph text drawing, about a sixth of the drawing time; log-axis tick labels are plain text with superscripts
(log_ticks.py), not mathtext; the PNG is written as RGB at zlib level PNG_COMPRESSION (png.py); a sweep point's seed
count is written once per panel where most points share it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from structbench.report.analysis.curve_index import CurveIndex
from structbench.report.analysis.profiles import TAU_GRID, TAU_MAX, Profile
from structbench.report.analysis.selection import Score
from structbench.report.analysis.summary import VariantSummary
from structbench.report.analysis.sweeps import Axis, Sweep, value_text
from structbench.report.build import Report, SuiteReport
from structbench.report.figures import canvas, png
from structbench.report.figures.figure_file import PIXEL_RATIO, FigureFile, Look
from structbench.report.figures.log_ticks import PlainLogFormatter

DPI = 100 * PIXEL_RATIO
SIZE = (6.4, 3.6)
MAX_POINTS = 400
LEGEND_CHARS = 40
LEGEND_ROWS = 14
WIDE = 10.0
"""An axis whose values span more than this factor (a decade) is logarithmic (symmetric-log when they reach zero)."""
PAD_INCHES = 0.08
SWEEP_COLUMNS = 4
"""Panels to a row in a suite's sweeps figure."""
PANEL_SIZE = (3.2, 2.6)
"""Inches per panel of the sweeps figure, its titles, labels and the gaps included."""
TICK_FONT_WIDTH = 0.64
"""A tick label's width per character in units of the font size (DejaVu Sans digits: 0.64 em), for thinning."""
PNG_COMPRESSION = 1
"""zlib level of the PNGs (png.py): about two thirds of level 6's encoding time for files about 6% larger (one
figure of ten curves, 1280 x 720 pixels: 15.5 ms and 221 kB against 23.0 ms and 209 kB)."""
FAILURE_MARKERS = {"diverged": "X", "oom": "s", "solver_error": "D", "error": "P", "interrupted": "v"}
OPTIMIZER_FAILURES = ("diverged", "oom", "solver_error")
STYLE = {
    "font.size": 8.5,
    "axes.titlesize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "text.hinting": "no_hinting",
}


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text).strip("-").lower()


def _png(fig: Figure, title: str, run_ids: Sequence[str]) -> bytes:
    """The figure as PNG bytes (png.py), drawn once and cut to what it drew plus PAD_INCHES (canvas.py), compressed
    at PNG_COMPRESSION."""
    rgba = canvas.drawn_pixels(fig, DPI, round(PAD_INCHES * DPI))
    metadata = {"Title": title, "Software": "structbench report", "Description": "runs: " + " ".join(run_ids)}
    return png.encode(rgba, DPI, metadata, PNG_COMPRESSION)


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's header chunk."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _figure(ncols: int = 1, size: tuple[float, float] = SIZE) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=size, dpi=DPI)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    fig.subplots_adjust(left=0.12 if ncols == 1 else 0.1, right=0.96, top=0.86, bottom=0.15, wspace=0.35)
    return fig, axes


def _finish(fig: Figure, title: str, name: str, caption: str, run_ids: Sequence[str], suite: str | None) -> FigureFile:
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    png = _png(fig, title, run_ids)
    width, height = png_size(png)
    return FigureFile(name, title, caption, png, tuple(run_ids), suite, width, height)


def _thin(steps: np.ndarray) -> np.ndarray:
    """At most MAX_POINTS steps, evenly spaced, always keeping the last."""
    if len(steps) <= MAX_POINTS:
        return steps
    keep = np.unique(np.linspace(0, len(steps) - 1, MAX_POINTS).round().astype(int))
    return steps[keep]


def axis_scale(values: np.ndarray) -> tuple[str, float]:
    """("log", 0), ("symlog", its linear threshold) or ("linear", 0) for values on an axis (module docstring). The
    symmetric-log threshold is the 10th percentile of the nonzero magnitudes (the nearest one at or below it, so that
    a few values are not blurred together): below it the axis is linear."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return "linear", 0.0
    if (finite > 0).all():
        return ("log", 0.0) if finite.max() / finite.min() > WIDE else ("linear", 0.0)
    magnitudes = np.abs(finite[finite != 0])
    if not len(magnitudes):
        return "linear", 0.0
    threshold = float(np.quantile(magnitudes, 0.1, method="lower"))
    return ("symlog", threshold) if magnitudes.max() / threshold > WIDE else ("linear", 0.0)


def _log_if_wide(ax: Axes, values: np.ndarray, which: str = "y") -> None:
    """The scale axis_scale chooses for the `which` ("x" or "y") axis (no minor ticks on a log axis, tick labels
    without mathtext: faster)."""
    scale, threshold = axis_scale(values)
    axis = ax.yaxis if which == "y" else ax.xaxis
    set_scale = ax.set_yscale if which == "y" else ax.set_xscale
    if scale == "log":
        set_scale("log")
        axis.set_minor_locator(NullLocator())
    elif scale == "symlog":
        set_scale("symlog", linthresh=threshold)
        axis.set_major_locator(FixedLocator(_symlog_ticks(values, threshold)))
    if scale != "linear":
        axis.set_major_formatter(PlainLogFormatter(base=10))


def _symlog_ticks(values: np.ndarray, threshold: float) -> list[float]:
    """Zero and the powers of ten from the linear threshold out to the values' largest magnitude, on each side the
    values reach (a decade inside the linear region would print on top of zero)."""
    finite = values[np.isfinite(values)]
    top = float(np.abs(finite).max())
    decades = [10.0**k for k in range(math.ceil(math.log10(threshold)), math.floor(math.log10(top)) + 1)]
    return sorted({0.0, *([-d for d in decades] if (finite < 0).any() else []), *decades})


@dataclass(frozen=True)
class Band:
    steps: np.ndarray
    median: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    wall_s: np.ndarray


def band(index: CurveIndex, run_ids: Sequence[str], value: str) -> Band | None:
    """Per logged step: median, min and max of `value` over the runs, and their median cumulative wall-clock."""
    present = [r for r in run_ids if r in index]
    if not present:
        return None
    steps = np.unique(np.concatenate([index.get(r, "step") for r in present]))
    values = np.full((len(steps), len(present)), np.nan)
    walls = np.full_like(values, np.nan)
    for j, run_id in enumerate(present):
        at = np.searchsorted(steps, index.get(run_id, "step"))
        values[at, j] = index.get(run_id, value)
        walls[at, j] = index.get(run_id, "wall_s")
    rows = _thin(np.flatnonzero(np.isfinite(values).any(axis=1)))
    if not len(rows):
        return None
    values, walls = values[rows], walls[rows]
    return Band(
        steps[rows],
        np.nanmedian(values, axis=1),
        np.nanmin(values, axis=1),
        np.nanmax(values, axis=1),
        np.nanmedian(walls, axis=1),
    )


def _failure_points(v: VariantSummary, index: CurveIndex, value: str, x: str) -> list[tuple[str, float, float, bool]]:
    """(status, x, y, on the axis) for each run the optimizer lost (diverged, oom, solver_error): its last finite
    point, or the bottom of the axes when it logged none. `error` and `interrupted` runs are not the optimizer's
    outcome: the failure table lists them."""
    points = []
    for run_id, status, steps in zip(*(v.variant.values(c) for c in ("run_id", "status", "steps")), strict=True):
        if status not in OPTIMIZER_FAILURES:
            continue
        ys = index.get(run_id, value)
        finite = np.flatnonzero(np.isfinite(ys))
        if len(finite):
            points.append((str(status), float(index.get(run_id, x)[finite[-1]]), float(ys[finite[-1]]), False))
        elif x == "step" and not math.isnan(steps):
            points.append((str(status), float(steps), 0.03, True))
    return points


def _mark_failures(ax: Axes, points: list[tuple[str, float, float, bool]], color: tuple[float, ...]) -> set[str]:
    for status, x, y, on_axis in points:
        ax.scatter(
            [x],
            [y],
            marker=FAILURE_MARKERS.get(status, "P"),
            s=60,
            color=color,
            edgecolors="black",
            linewidths=0.8,
            zorder=5,
            clip_on=not on_axis,
            transform=ax.get_xaxis_transform() if on_axis else ax.transData,
        )
    return {p[0] for p in points}


def _outside_legend(fig: Figure, ax: Axes, shown: set[str]) -> None:
    """The axes' legend to the right of the plot (it never hides data), with a marker per failure status, in as
    many columns as keep it at most LEGEND_ROWS entries tall; the saved image grows to hold it (_png)."""
    handles, labels = ax.get_legend_handles_labels()
    for status in sorted(shown):
        handles.append(
            Line2D([], [], marker=FAILURE_MARKERS.get(status, "P"), color="grey", markeredgecolor="black", ls="")
        )
        labels.append(status)
    if handles:
        fig.subplots_adjust(right=0.74)
        short = [label if len(label) <= LEGEND_CHARS else label[: LEGEND_CHARS - 1] + "…" for label in labels]
        columns = math.ceil(len(handles) / LEGEND_ROWS)
        ax.legend(handles, short, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, ncols=columns)


def _curve_figure(
    suite: SuiteReport,
    index: CurveIndex,
    looks: dict[str, Look],
    value: str,
    x: str,
    ylabel: str,
    kind: str,
) -> FigureFile | None:
    fig, (ax,) = _figure()
    shown: set[str] = set()
    plotted: list[np.ndarray] = []
    run_ids: list[str] = []
    failures: list[tuple[list[tuple[str, float, float, bool]], tuple[float, ...]]] = []
    for optim, v in suite.selected.items():
        ids = v.variant.run_ids
        run_ids += ids
        curve = band(index, ids, value)
        if curve is not None:
            xs = curve.steps if x == "step" else curve.wall_s
            single = len(xs) == 1
            look = looks[optim]
            ax.plot(
                xs, curve.median, color=look.color, ls=look.dash, lw=1.4, label=v.label, marker="o" if single else None
            )
            if (curve.hi > curve.lo).any():
                ax.fill_between(xs, curve.lo, curve.hi, color=look.color, alpha=0.18, lw=0)
            plotted += [curve.lo, curve.hi]
        failures.append((_failure_points(v, index, value, x), looks[optim].color))
    if not plotted and not any(points for points, _ in failures):
        return None
    lo, hi = ax.get_xlim()
    for points, color in failures:
        shown |= _mark_failures(ax, points, color)
        lo, hi = min([lo, *(p[1] for p in points)]), max([hi, *(p[1] for p in points)])
    ax.set_xlim(lo, hi)
    target = suite.targets[0] if len(suite.targets) == 1 else None
    metric = suite.metric_name if value == "metric" else "loss"
    if target is not None and target.available and kind == "metric-vs-step" and target.metric == metric:
        ax.axhline(target.value, color="black", ls="--", lw=0.9, label=f"target {target.describe()}")
    if plotted:
        _log_if_wide(ax, np.concatenate(plotted))
    ax.set_xlabel("step" if x == "step" else "training wall-clock (s, evaluation excluded)")
    ax.set_ylabel(ylabel)
    _outside_legend(fig, ax, shown)
    title = f"{suite.name}: {ylabel} vs {'step' if x == 'step' else 'wall-clock'}"
    caption = (
        "Median over seeds of each optimizer's selected setting; the band spans the smallest to the largest seed. "
        + ("x: median over seeds of the cumulative training time at each step. " if x != "step" else "")
        + "Markers: runs that did not end ok, at their last logged point."
    )
    return _finish(fig, title, f"{_slug(suite.name)}-{kind}", caption, run_ids, suite.name)


def _bar_labels(suite: SuiteReport) -> tuple[list[VariantSummary], list[str]]:
    chosen = list(suite.selected.values())
    return chosen, [v.label for v in chosen]


def _bars(
    ax: Axes,
    ys: np.ndarray,
    widths: np.ndarray,
    chosen: Sequence[VariantSummary],
    looks: dict[str, Look],
    left: np.ndarray | None = None,
) -> None:
    """Horizontal bars in each optimizer's colour and fill."""
    for y, width, v, start in zip(ys, widths, chosen, left if left is not None else np.zeros(len(ys)), strict=True):
        look = looks[v.optim]
        ax.barh([y], [width], left=[start], height=0.6, color=look.color, hatch=look.hatch or None, edgecolor="white")


def _bytes_axis(values: np.ndarray) -> tuple[float, str]:
    top = np.nanmax(values) if np.isfinite(values).any() else 1.0
    for scale, unit in ((1024.0**3, "GiB"), (1024.0**2, "MiB"), (1024.0, "KiB")):
        if top >= scale:
            return scale, unit
    return 1.0, "B"


def _bar_axis(ax: Axes, values: np.ndarray) -> None:
    """The value axis of horizontal bars: log (symmetric-log with a zero) where the values span more than a decade
    (axis_scale), with room to the right for the annotations; a log axis starts at half the smallest bar."""
    finite = values[np.isfinite(values)]
    if not len(finite) or finite.max() <= 0:
        return
    _log_if_wide(ax, values, "x")
    if ax.get_xscale() == "log":
        ax.set_xlim(finite.min() / 2, finite.max() * 3)
    else:
        ax.set_xlim(0, finite.max() * (3 if ax.get_xscale() == "symlog" else 1.35))


def _memory_figure(suite: SuiteReport, looks: dict[str, Look]) -> FigureFile:
    chosen, labels = _bar_labels(suite)
    fig, (left, right) = _figure(2, (SIZE[0], max(SIZE[1], 0.9 + 0.28 * len(chosen))))
    fig.subplots_adjust(left=0.17)
    ys = np.arange(len(chosen))
    peak = np.array([v.peak_mem_bytes for v in chosen], float)
    scale, unit = _bytes_axis(peak)
    _bars(left, ys, peak / scale, chosen, looks)
    for y, v, x in zip(ys, chosen, np.nan_to_num(peak / scale), strict=True):
        failed = {s: n for s, n in v.statuses.items() if s in OPTIMIZER_FAILURES and n}
        if failed:
            left.annotate(
                " ".join(f"{s}×{n}" for s, n in failed.items()),
                (x, y),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                color="#b00020",
                fontsize=7,
            )
    _bar_axis(left, peak / scale)
    sources = sorted({v.mem_source for v in chosen})
    left.set_xlabel(f"peak memory ({unit}; source: {', '.join(sources)})")
    left.set_yticks(ys, labels)
    left.invert_yaxis()
    state = np.array([v.state_bytes for v in chosen], float)
    analytic = np.array([v.analytic_state_bytes for v in chosen], float)
    sscale, sunit = _bytes_axis(np.concatenate([state, analytic]))
    _bars(right, ys, state / sscale, chosen, looks)
    _bar_axis(right, np.concatenate([state, analytic]) / sscale)
    has_analytic = bool(np.isfinite(analytic).any())
    if has_analytic:
        right.scatter(analytic / sscale, ys, marker="|", s=260, color="black", zorder=4)
    right.set_xlabel(f"optimizer state ({sunit})" + ("; |: analytic" if has_analytic else ""))
    right.set_yticks(ys, [])
    right.invert_yaxis()
    run_ids = [r for v in chosen for r in v.variant.run_ids]
    caption = "Medians over the runs that ended ok; failures are annotated beside the bar."
    return _finish(fig, f"{suite.name}: memory", f"{_slug(suite.name)}-memory", caption, run_ids, suite.name)


def pareto_front(points: Sequence[tuple[float, float]], maximize: bool) -> list[int]:
    """Indices of the points no other point beats: less or equal x and at least as good y, one strictly."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (ox <= x and (oy >= y if maximize else oy <= y)) and (ox < x or oy != y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _quality_memory_figure(suite: SuiteReport, looks: dict[str, Look]) -> FigureFile:
    chosen, _ = _bar_labels(suite)
    fig, axes = _figure(2, (SIZE[0] * 1.25, SIZE[1]))
    fig.subplots_adjust(left=0.08, right=0.8, wspace=0.35)
    maximize = suite.metric_mode == "max"
    resident = any("rss" in v.mem_source for v in chosen)
    panels: list[tuple[Axes, Callable[[VariantSummary], float], str, bool]] = [
        (
            axes[0],
            lambda v: v.peak_mem_bytes,
            "peak memory" + (" (CPU resident set, approximate)" if resident else ""),
            not resident,
        ),
        (axes[1], lambda v: v.state_bytes, "optimizer state", True),
    ]
    for ax, memory, name, with_front in panels:
        xs = np.array([memory(v) for v in chosen], float)
        scale, unit = _bytes_axis(xs)
        ok = [i for i, v in enumerate(chosen) if np.isfinite(xs[i]) and not math.isnan(v.final_metric.median)]
        points = [(xs[i] / scale, chosen[i].final_metric.median) for i in ok]
        for (x, y), i in zip(points, ok, strict=True):
            look = looks[chosen[i].optim]
            ax.scatter([x], [y], color=look.color, s=30, zorder=3, label=chosen[i].optim, hatch=look.hatch or None)
        front = pareto_front(points, maximize) if with_front else []
        if not with_front:
            for (x, y), i in zip(points, ok, strict=True):
                ax.annotate(chosen[i].optim, (x, y), xytext=(5, 4), textcoords="offset points", fontsize=7)
            ax.set_title("no front: a resident set depends on the process", fontsize=8, color="#6e6e6e")
        for i in front:
            ax.annotate(chosen[ok[i]].optim, points[i], xytext=(5, 4), textcoords="offset points", fontsize=7)
        if front:
            fx, fy = zip(*(points[i] for i in front), strict=True)
            ax.step(fx, fy, where="post", color="black", lw=0.8, ls=":")
            ax.scatter(fx, fy, s=110, facecolors="none", edgecolors="black", lw=0.8, zorder=4)
        for i, v in enumerate(chosen):
            if i not in ok and np.isfinite(xs[i]):
                status = next((s for s, n in v.statuses.items() if n and s != "ok"), "error")
                ax.scatter(
                    [xs[i] / scale],
                    [0.97],
                    transform=ax.get_xaxis_transform(),
                    marker=FAILURE_MARKERS.get(status, "P"),
                    s=60,
                    color=looks[v.optim].color,
                    edgecolors="black",
                    lw=0.8,
                    clip_on=False,
                )
                ax.annotate(
                    f"{v.optim}: no ok run",
                    (xs[i] / scale, 0.97),
                    xycoords=ax.get_xaxis_transform(),
                    xytext=(5, -3),
                    textcoords="offset points",
                    fontsize=7,
                    color="#b00020",
                )
        _log_if_wide(ax, xs / scale, "x")
        _log_if_wide(ax, np.array([y for _, y in points], float))
        ax.margins(x=0.2, y=0.12)
        ax.set_xlabel(f"{name} ({unit})")
        split = "exact" if suite.eval_split == "exact" else "test"
        ax.set_ylabel(f"final {split} {suite.metric_name} ({'higher' if maximize else 'lower'} is better)")
    _outside_legend(fig, axes[1], set())
    fig.subplots_adjust(right=0.8)
    run_ids = [r for v in chosen for r in v.variant.run_ids]
    caption = (
        "Median final test metric against median memory of each optimizer's selected setting; ringed, named and "
        "joined by the dotted line: the Pareto front (no other optimizer uses less memory and does at least as well)."
        + (
            " On CPU the peak is the process's resident set, which allocator caches and earlier runs make approximate:"
            " the front is drawn against optimizer-state bytes only."
            if resident
            else ""
        )
    )
    return _finish(
        fig, f"{suite.name}: quality vs memory", f"{_slug(suite.name)}-quality-vs-memory", caption, run_ids, suite.name
    )


def _step_time_figure(suite: SuiteReport, looks: dict[str, Look]) -> FigureFile | None:
    chosen, labels = _bar_labels(suite)
    step = np.array([v.step_time_s for v in chosen], float) * 1e3
    if not np.isfinite(step).any():
        return None
    share = np.array([v.optim_share for v in chosen], float)
    optim_ms = np.nan_to_num(step * share)
    rest = np.nan_to_num(step) - optim_ms
    fig, (ax,) = _figure(1, (SIZE[0], max(SIZE[1], 0.9 + 0.28 * len(chosen))))
    fig.subplots_adjust(left=0.22)
    ys = np.arange(len(chosen))
    _bars(ax, ys, optim_ms, chosen, looks)
    ax.barh(ys, rest, left=optim_ms, height=0.6, color="#b8b8b8")
    for y, v, total in zip(ys, chosen, step, strict=True):
        if np.isfinite(total) and not math.isnan(v.compile_s):
            ax.annotate(
                f"compile {v.compile_s * 1e3:.3g} ms",
                (total, y),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms); coloured: optimizer step, grey: the rest")
    _bar_axis(ax, step)
    if ax.get_xscale() == "log":
        parts = np.concatenate([step, optim_ms])
        ax.set_xlim(left=np.nanmin(parts[parts > 0]) / 2)
    run_ids = [r for v in chosen for r in v.variant.run_ids]
    caption = "Median step time split into the optimizer step and the rest; the first timed step is apart."
    if ax.get_xscale() != "linear":
        caption += (
            " The times span more than a decade: on this log axis the coloured part ends at the optimizer step's time"
            " and the grey one at the whole step's; their lengths are not in proportion."
        )
    return _finish(fig, f"{suite.name}: step time", f"{_slug(suite.name)}-step-time", caption, run_ids, suite.name)


def seeds_text(score: Score) -> str:
    """The ok seeds behind a sweep point: "n=5", or "n=3/5, 2 diverged" when some of its runs did not count."""
    text = f"n={score.n}" if score.n == score.runs else f"n={score.n}/{score.runs}"
    return text + "".join(f", {n} {status}" for status, n in score.failures.items())


def tick_text(value: object) -> str:
    """A swept value as a tick label: floats to three significant digits (the sweep table has them in full)."""
    return f"{value:.3g}" if isinstance(value, float) else value_text(value)


def labelled_ticks(count: int, anchor: int, label_width: float, spacing: float) -> list[int]:
    """Which of `count` evenly spaced ticks carry a label: every k-th, counted from `anchor` (the selected value's),
    k the smallest step at which labels `label_width` wide keep a fifth of their width apart at `spacing` between
    neighbouring ticks (both in points)."""
    step = max(1, math.ceil(label_width * 1.2 / spacing)) if spacing > 0 else 1
    return [i for i in range(count) if (i - anchor) % step == 0]


def _value_ticks(ax: Axes, axis: Axis, positions: list[float], width: float) -> None:
    """Ticks at the swept values of a log or categorical axis (`width`: the axes' width in points). Labels of a log
    axis are thinned to labelled_ticks (its values are usually a geometric grid); categories are all labelled."""
    texts = [tick_text(p.value) for p in axis.points]
    keep = list(range(len(texts)))
    if axis.log and len(positions) > 1:
        logs = np.log(positions)
        span = math.log(ax.get_xlim()[1] / ax.get_xlim()[0])
        spacing = width * float(np.diff(logs).min()) / span
        label_width = max(map(len, texts)) * TICK_FONT_WIDTH * float(STYLE["font.size"])
        anchor = next((i for i, p in enumerate(axis.points) if p.selected), 0)
        keep = labelled_ticks(len(texts), anchor, label_width, spacing)
    ax.set_xticks([positions[i] for i in keep], [texts[i] for i in keep])


def _panel(ax: Axes, sweep: Sweep, axis: Axis, color: tuple[float, ...], ylabel: bool, width: float) -> None:
    """One optimizer's swept key: the selection metric's median (bars: min to max over seeds) at each value, the
    selected setting ringed, settings without an ok run marked at the top with their status. The ok seeds are
    written once, in the panel's title, when most points share them, and upright above each point that differs
    (upright, neighbouring points' texts stay apart)."""
    positions = [float(p.value) for p in axis.points] if axis.numeric else list(range(len(axis.points)))
    scored = [(x, p) for x, p in zip(positions, axis.points, strict=True) if p.score.n]
    seeds = "no ok run"
    if scored:
        xs = [x for x, _ in scored]
        ys = np.array([p.score.median for _, p in scored])
        lo = ys - np.array([p.score.lo for _, p in scored])
        hi = np.array([p.score.hi for _, p in scored]) - ys
        ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker="o", ms=4, lw=1.2, capsize=2.5)
        texts = [seeds_text(p.score) for _, p in scored]
        common = Counter(texts).most_common(1)[0][0]
        for (x, p), text in zip(scored, texts, strict=True):
            if text != common:
                ax.annotate(
                    text,
                    (x, p.score.hi),
                    xytext=(0, 4),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    rotation=90,
                    fontsize=6.5,
                )
        seeds = f"{common} at each point" if len(set(texts)) == 1 else f"{common} unless marked"
        _log_if_wide(ax, np.concatenate([ys - lo, ys + hi]))
    for x, p in zip(positions, axis.points, strict=True):
        if p.selected and p.score.n:
            ax.scatter([x], [p.score.median], s=150, facecolors="none", edgecolors="black", lw=1.1, zorder=4)
        if not p.score.n:
            status = next((s for s, n in p.variant.statuses.items() if n and s != "ok"), "error")
            ax.scatter(
                [x],
                [0.97],
                transform=ax.get_xaxis_transform(),
                marker=FAILURE_MARKERS.get(status, "P"),
                s=60,
                color=color,
                edgecolors="black",
                lw=0.8,
                clip_on=False,
            )
            ax.annotate(
                status,
                (x, 0.97),
                xycoords=ax.get_xaxis_transform(),
                xytext=(5, -3),
                textcoords="offset points",
                fontsize=7,
                color="#b00020",
            )
    if axis.log:
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(min(positions) / 1.5, max(positions) * 1.5)
    elif len(positions) > 1:
        span = max(positions) - min(positions)
        ax.set_xlim(min(positions) - 0.1 * span, max(positions) + 0.1 * span)
    if axis.log or not axis.numeric:
        _value_ticks(ax, axis, positions, width)
    ax.set_xlabel(axis.name + (f"  ({axis.fixed_text})" if axis.fixed else ""))
    if ylabel:
        ax.set_ylabel(f"final {sweep.criterion.name} {sweep.criterion.arrow}")
    ax.set_title(f"{sweep.optim}\n{seeds}", loc="left", fontsize=8)
    if axis.warning:
        ax.set_title("edge of the grid", loc="right", color="#b00020", fontsize=7.5)


def sweeps_figure(sweeps: Sequence[Sweep], looks: Mapping[str, Look]) -> Figure:
    """A suite's sweeps as small multiples: one panel per optimizer and swept key (sweeps.py), each in the
    optimizer's colour, SWEEP_COLUMNS to a row; one panel alone is drawn at SIZE. The y axis is labelled on the
    first column only when every optimizer was selected on the same metric."""
    panels = [(sweep, axis) for sweep in sweeps for axis in sweep.axes]
    columns = min(len(panels), SWEEP_COLUMNS)
    rows = math.ceil(len(panels) / columns)
    same_metric = len({s.criterion.name for s in sweeps}) == 1
    width, height = SIZE if len(panels) == 1 else (PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows)
    left, right, top, bottom = 0.75, 0.15, 0.8, 0.5
    row_gap, column_gap = 0.85, 0.55 if same_metric else 0.85
    axes_width = (width - left - right - (columns - 1) * column_gap) / columns
    axes_height = (height - top - bottom - (rows - 1) * row_gap) / rows
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, height), dpi=DPI)
        fig.subplots_adjust(
            left=left / width,
            right=1 - right / width,
            top=1 - top / height,
            bottom=bottom / height,
            wspace=column_gap / axes_width,
            hspace=row_gap / axes_height,
        )
        for i, (sweep, axis) in enumerate(panels):
            ax = fig.add_subplot(rows, columns, i + 1)
            ylabel = i % columns == 0 or not same_metric
            _panel(ax, sweep, axis, looks[sweep.optim].color, ylabel, axes_width * 72)
    return fig


def _sweeps_file(suite: SuiteReport, looks: dict[str, Look]) -> FigureFile | None:
    if not suite.sweeps:
        return None
    fig = sweeps_figure(suite.sweeps, looks)
    run_ids = list(
        dict.fromkeys(
            r for sweep in suite.sweeps for axis in sweep.axes for p in axis.points for r in p.variant.variant.run_ids
        )
    )
    criteria = {s.criterion.describe() for s in suite.sweeps}
    caption = (
        "One panel per optimizer and swept hyperparameter: the median over the ok seeds of the final metric that "
        "selected the setting, against the hyperparameter's values; bars: the smallest to the largest seed; ringed: "
        "the selected setting; n: ok seeds (of the runs), in the panel's title when most points share it and beside "
        "each point that differs; a marker at the top: a setting without an ok run, with its status. Tick labels are "
        "thinned where they would overlap: the sweep tables list every setting."
    )
    if any(len(s.axes) > 1 for s in suite.sweeps):
        caption += " A panel of an optimizer that swept several hyperparameters holds the others at the selected "
        caption += "setting's values (in brackets)."
    title = f"{suite.name}: sweeps" + (f", {next(iter(criteria))}" if len(criteria) == 1 else "")
    return _finish(fig, title, suite.sweeps[0].figure_name, caption, run_ids, suite.name)


def _profile_figure(report: Report, looks: dict[str, Look]) -> FigureFile | None:
    panels = [(p, basis) for p, basis in ((report.profile_seconds, "time"), (report.profile_steps, "steps")) if p]
    if not panels:
        return None
    fig, axes = _figure(len(panels), (SIZE[0] * 1.25, SIZE[1]))
    for ax, (profile, basis) in zip(axes, panels, strict=True):
        assert isinstance(profile, Profile)
        rho = profile.rho(TAU_GRID)
        coverage = profile.coverage
        for optim in rho.columns:
            if coverage[optim] == 0:
                continue
            look = looks[optim]
            label = (
                optim
                if coverage[optim] == len(profile.suites)
                else f"{optim} ({coverage[optim]} of {len(profile.suites)})"
            )
            ax.step(TAU_GRID, rho[optim], where="post", color=look.color, ls=look.dash, lw=1.4, label=label)
        ax.set_xlim(1, TAU_MAX)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("τ (ratio to the fastest)")
        ax.set_ylabel(f"fraction of the suites run within τ ({basis})")
    _outside_legend(fig, axes[-1], set())
    fig.subplots_adjust(left=0.08, right=0.8)
    suites = [s for s in report.aggregated if s.timed]
    run_ids = [r for s in suites for v in s.selected.values() for r in v.variant.run_ids]
    caption = (
        "AlgoPerf-style performance profiles over the suites with a target: the fraction of the suites an optimizer "
        "ran on which it reaches the target within a factor τ of the fastest optimizer's median time (steps); in "
        "brackets, how many of the suites it ran when not all."
    )
    return _finish(fig, "Performance profiles", "performance-profiles", caption, run_ids, None)


def cross_suite_figures(report: Report, looks: dict[str, Look]) -> list[FigureFile]:
    with matplotlib.rc_context(STYLE):
        figure = _profile_figure(report, looks)
    return [figure] if figure is not None else []


SUITE_PARTS = 3
"""A suite's figures come in this many parts of about equal drawing time (the curves; memory, quality against
memory and step time; the sweeps), which separate processes may draw."""


def suite_figures(suite: SuiteReport, looks: dict[str, Look], part: int | None = None) -> list[FigureFile]:
    """The suite's figures (`part` of SUITE_PARTS, or all), in reading order; the metric is plotted on the validation
    split where there is one."""
    train = CurveIndex(suite.curves, "train")
    evals = CurveIndex(suite.curves, "val" if suite.validated else "eval")
    split = "validation" if suite.validated else ("exact" if suite.eval_split == "exact" else "test")
    parts: list[list[Callable[[], FigureFile | None]]] = [
        [
            lambda: _curve_figure(suite, train, looks, "loss", "step", "training loss", "loss-vs-step"),
            lambda: _curve_figure(suite, train, looks, "loss", "wall_s", "training loss", "loss-vs-time"),
            lambda: _curve_figure(
                suite, evals, looks, "metric", "step", f"{split} {suite.metric_name}", "metric-vs-step"
            ),
        ],
        [
            lambda: _memory_figure(suite, looks),
            lambda: _quality_memory_figure(suite, looks),
            lambda: _step_time_figure(suite, looks),
        ],
        [lambda: _sweeps_file(suite, looks)],
    ]
    with matplotlib.rc_context(STYLE):
        figures = [draw() for chosen in (parts if part is None else [parts[part]]) for draw in chosen]
    return [f for f in figures if f is not None]
