"""A figure drawn once and cut to what it drew (report/canvas.py), against matplotlib's own drawing of it on an ample
canvas cut by Pillow (figure_oracle.py): legends far outside the figure are kept, a drawing that reaches past the
first canvas is drawn again whole, the cut follows the figure's own background colour, and the canvas keeps the
figure's pixel grid wherever its legends push the canvas's corner."""

from __future__ import annotations

import pytest
from matplotlib import rc_context
from matplotlib.figure import Figure

from structbench.report.figures import canvas, plots
from tests.support.figure_oracle import PAD, drawn_by_matplotlib, same_drawing


def figure(facecolor: str = "white") -> Figure:
    with rc_context(plots.STYLE):
        fig = Figure(figsize=plots.SIZE, dpi=plots.DPI, facecolor=facecolor)
        fig.subplots_adjust(left=0.12, right=0.96, top=0.86, bottom=0.15)
        ax = fig.add_subplot()
        for k in range(3):
            ax.plot([0, 1, 2, 3], [k, k + 1, k * 2, 3], label=f"curve {k}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        fig.suptitle("a figure", x=0.02, ha="left")
    return fig


@pytest.fixture
def drawings(monkeypatch) -> list[tuple[float, float, float, float]]:
    """The canvases (inches) drawn on, in order."""
    seen: list[tuple[float, float, float, float]] = []
    draw = canvas._draw
    monkeypatch.setattr(canvas, "_draw", lambda fig, box, dpi: seen.append(tuple(box.extents)) or draw(fig, box, dpi))
    return seen


def drawn(fig: Figure):
    with rc_context(plots.STYLE):
        return canvas.drawn_pixels(fig, plots.DPI, PAD)


def test_a_figure_inside_its_bounds_is_drawn_once_and_cut_to_its_ink(drawings):
    fig = figure()
    ours = drawn(fig)
    assert same_drawing(ours, drawn_by_matplotlib(fig).pixels)
    assert len(drawings) == 1
    width, height = fig.get_size_inches()
    assert ours.shape[1] < width * plots.DPI and ours.shape[0] < height * plots.DPI  # the blank border is cut away


def test_legends_far_outside_the_figure_are_kept_and_the_pixel_grid_with_them(drawings):
    """One legend begins an inch and a half past the right edge (nothing drawn leads to it), another hangs below the
    figure by a length that is no whole number of pixels, which would move the canvas's corner off the figure's pixel
    grid."""
    fig = figure()
    ax = fig.axes[0]
    ax.legend(loc="upper left", bbox_to_anchor=(1.3, 1.0), ncols=2)
    fig.legend(["one", "two"], loc="upper center", bbox_to_anchor=(0.5, -0.1033))
    ours = drawn(fig)
    theirs = drawn_by_matplotlib(fig)
    assert same_drawing(ours, theirs.pixels), (ours.shape, theirs.pixels.shape)
    assert theirs.pixels.shape[1] > (fig.get_figwidth() + 1.5) * plots.DPI  # the far legend is in the oracle's cut
    assert len(drawings) == 1
    left, bottom, _, _ = drawings[0]
    # A corner on the pixel grid is k / dpi for a whole k, so (k / dpi) * dpi is within 2 u |k| of k (two float64
    # roundings); a corner off the grid (the figure legend hangs by no whole number of pixels) is a fraction of a
    # pixel away from every whole k.
    for corner in (left, bottom):
        pixels = corner * plots.DPI
        assert pixels == pytest.approx(round(pixels), rel=0, abs=2 * 2.0**-53 * abs(pixels))
    # Both corners are whole pixels, so a moved corner is >= 1 pixel away: half a pixel tells moved from not moved.
    assert bottom * plots.DPI != pytest.approx(-canvas.MARGIN * plots.DPI, abs=0.5)  # the legend moved the corner


def test_a_drawing_that_reaches_past_the_first_canvas_is_drawn_again_whole(drawings):
    fig = figure()
    ax = fig.axes[0]
    ax.set_yticks([0, 3, 6], ["a label longer than the margin and canvas", "b", "c"])
    ours = drawn(fig)
    theirs = drawn_by_matplotlib(fig)
    assert same_drawing(ours, theirs.pixels), (ours.shape, theirs.pixels.shape)
    assert theirs.left < -canvas.MARGIN  # the label starts beyond the first canvas
    assert len(drawings) == 2


def test_the_cut_follows_the_figures_background_colour(drawings):
    fig = figure(facecolor="#eef2f7")
    ours = drawn(fig)
    assert same_drawing(ours, drawn_by_matplotlib(fig).pixels)
    assert len(drawings) == 1
    assert tuple(ours[0, 0]) == (0xEE, 0xF2, 0xF7, 0xFF)


def test_a_text_past_the_canvas_edge_behind_a_gap_narrower_than_gap_is_drawn_again(drawings):
    """Text beside text, as an axis label beside tick labels: the inner one begins 0.1 inch inside the first canvas's
    edge (more than the padding, less than GAP), the outer one lies wholly past that edge."""
    fig = figure()
    inner = -(canvas.MARGIN - 0.1)
    outer = -(canvas.MARGIN + 0.02)
    fig.text(inner / fig.get_figwidth(), 0.5, "inner", ha="left", va="center")
    fig.text(outer / fig.get_figwidth(), 0.5, "outer", ha="right", va="center")
    ours = drawn(fig)
    theirs = drawn_by_matplotlib(fig)
    assert theirs.left < -canvas.MARGIN - 0.2
    assert same_drawing(ours, theirs.pixels), (ours.shape, theirs.pixels.shape)
    assert len(drawings) == 2
