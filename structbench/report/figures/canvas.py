"""A figure drawn once and cut to what it drew.

matplotlib's `savefig(bbox_inches="tight")` lays the figure out twice: once to measure the extent of everything it
draws (legends outside the axes included), and again to draw it on a canvas of that extent. Here the figure is drawn
once, on a canvas that holds the figure and its legends (their extents measured alone: they sit outside the axes and
may reach past the figure) with MARGIN inches around them, and the pixels are cut to those that differ from the
figure's background, plus a padding. Whatever else is drawn outside the figure (tick labels, axis labels, titles)
lies against what is inside it, less than GAP away; so when the drawing comes within GAP of the canvas's edge,
something may have been cut off there, and the figure is drawn again on its full measured extent
(`Figure.get_tightbbox`).

The canvas's corners lie on the figure's own pixel grid, so a figure is drawn with the same pixel phase whatever
room it gets: its pixels are those matplotlib draws for it at its own size.
"""

from __future__ import annotations

import io
import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba_array
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

MARGIN = 1.0
"""Inches of canvas around the figure and its legends in the first drawing: room for tick labels that reach past the
figure (a bar chart's optimizer labels, up to about 30 characters) without a second drawing. Measured on the report
of 5,000 runs (benchmarks/report_scale.py): at 0.25 inches a fifth of the figures were drawn twice, at 0.6 none; a
wider canvas costs little (about 1% more drawing time at 1.0 than at 0.6)."""
GAP = 0.125
"""Inches: more than matplotlib leaves between the ink of a text and what it is placed against (an axes title sits
6 points above the axes, an axis label 4 points beside the tick labels, each plus its text's blank ascent or descent).
A drawing that comes nearer than this to the first canvas's edge is drawn again on its measured extent."""


def drawn_pixels(fig: Figure, dpi: float, pad: int) -> np.ndarray:
    """The figure's (height, width, 4) uint8 RGBA pixels at `dpi`, cut to the pixels it drew plus `pad` pixels of
    background on every side."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    legends = [legend.get_window_extent(renderer) for legend in _legends(fig)]
    room = Bbox.union([fig.bbox, *legends]).transformed(fig.dpi_scale_trans.inverted()).padded(MARGIN)
    background = _background(fig)
    rgba = _draw(fig, _on_grid(room, dpi), dpi)
    found = _drawn_box(rgba, background)
    if found is None or not _clear_of_edges(found, rgba.shape, max(pad, math.ceil(GAP * dpi))):
        extent = fig.get_tightbbox(renderer).padded(MARGIN)
        rgba = _draw(fig, _on_grid(extent, dpi), dpi)
        found = _drawn_box(rgba, background)
        if found is None:
            return rgba
    top, bottom, left, right = found
    height, width, _ = rgba.shape
    return rgba[max(top - pad, 0) : min(bottom + pad, height), max(left - pad, 0) : min(right + pad, width)]


def _legends(fig: Figure) -> list:
    return [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)


def _on_grid(box: Bbox, dpi: float) -> Bbox:
    """`box` (inches) grown outwards to whole pixels of the figure's grid (whose origin is the figure's corner)."""
    x0, y0 = math.floor(box.x0 * dpi), math.floor(box.y0 * dpi)
    x1, y1 = math.ceil(box.x1 * dpi), math.ceil(box.y1 * dpi)
    return Bbox.from_extents(x0 / dpi, y0 / dpi, x1 / dpi, y1 / dpi)


def _draw(fig: Figure, box: Bbox, dpi: float) -> np.ndarray:
    """The figure drawn on the canvas `box` (inches, on the pixel grid) as (height, width, 4) RGBA pixels, top row
    first."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="rgba", dpi=dpi, bbox_inches=box)
    height = round(box.height * dpi)
    return np.frombuffer(buffer.getbuffer(), np.uint8).reshape(height, -1, 4)


def _background(fig: Figure) -> np.uint32:
    """The figure's background colour as one RGBA pixel read as an unsigned 32-bit integer."""
    rgba = np.round(to_rgba_array(fig.get_facecolor())[0] * 255).astype(np.uint8)
    return rgba.view(np.uint32)[0]


def _drawn_box(rgba: np.ndarray, background: np.uint32) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right), bottom and right exclusive, of the pixels that differ from `background`; None when
    none does."""
    drawn = np.ascontiguousarray(rgba).view(np.uint32)[..., 0] != background
    rows, columns = np.flatnonzero(drawn.any(axis=1)), np.flatnonzero(drawn.any(axis=0))
    if not len(rows):
        return None
    return int(rows[0]), int(rows[-1]) + 1, int(columns[0]), int(columns[-1]) + 1


def _clear_of_edges(box: tuple[int, int, int, int], shape: tuple[int, ...], clearance: int) -> bool:
    """Whether the drawn `box` keeps `clearance` pixels from every edge of a canvas of `shape`."""
    top, bottom, left, right = box
    height, width = shape[0], shape[1]
    return top >= clearance and left >= clearance and bottom <= height - clearance and right <= width - clearance
