"""How the report's figures become PNGs and how their log axes are labelled, against matplotlib's own output.

The figure is drawn once and cut to what it drew (canvas.py), then written by png.py: for every kind of figure its
pixels must be matplotlib's own drawing of the figure on an ample canvas, cut by Pillow to the pixels that differ from
the background plus the padding (figure_oracle.py), and the cut no looser than matplotlib's own
`savefig(bbox_inches="tight")`; Pillow must read back every pixel, the alpha channel where there is one, the
resolution and the text. Log and symmetric-log tick
labels are written in plain text with Unicode superscripts (log_ticks.py): no label may go through matplotlib's
mathtext parser, every character must be in the font that draws it, and the ticks labelled must be those
matplotlib's own formatter labels.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from matplotlib import font_manager, ft2font, rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.mathtext import MathTextParser
from matplotlib.ticker import LogFormatterSciNotation
from PIL import Image

from structbench.report import build
from structbench.report.figures import plots, render
from structbench.report.figures.log_ticks import PlainLogFormatter
from structbench.report.figures.png import encode
from structbench.store import write as store
from tests.support.figure_oracle import drawn_by_matplotlib, keeping_figures, pixels, same_drawing
from tests.support.report_store import Point, write_run


def losses(start: float, end: float, steps: int = 40) -> list[Point]:
    """Evaluations every 10 steps, loss falling geometrically from start to end (accuracy rising with it)."""
    points = []
    for step in range(0, steps + 1, 10):
        loss = start * (end / start) ** (step / steps)
        points.append(Point(step, 0.05 * step, loss, 1 - loss / (2 * start), loss, 1 - loss / (2 * start)))
    return points


@pytest.fixture(scope="module")
def suite_store(tmp_path_factory) -> Path:
    """A suite with a log loss axis (a factor 300), a diverged run (failure markers in the legend), memory and
    step-time bars and an lr sweep."""
    out = tmp_path_factory.mktemp("png") / "results"
    store.prepare(out)
    for seed in range(2):
        write_run(out, f"adamw-{seed}", "adamw", seed, losses(3.0, 0.01 * (1 + seed)), hparams={"lr": 0.001})
        for lr, end in ((0.01, 0.05), (0.1, 0.02), (1.0, 0.3)):
            write_run(out, f"sgd-{lr}-{seed}", "sgd", seed, losses(3.0, end + 0.01 * seed), hparams={"lr": lr})
    write_run(out, "muon-0", "muon", 0, losses(3.0, 1.5)[:3], status="diverged", hparams={"lr": 0.02})
    return out


@pytest.fixture(scope="module")
def drawn(suite_store) -> list[tuple[str, Figure, bytes]]:
    """Every figure of the suite as (name, matplotlib figure, PNG bytes)."""
    with keeping_figures() as figures:
        files = render.render_figures(build.build_report(suite_store, plotted=True), workers=1, cache=False)
    assert [f.png for f in files] == [png for _, png in figures]
    return [(f.name, fig, png) for f, (fig, png) in zip(files, figures, strict=True)]


def test_every_png_is_matplotlibs_drawing_cut_to_what_it_drew(drawn):
    kinds = {name.removeprefix("vision-") for name, _, _ in drawn}
    assert {"loss-vs-step", "memory", "quality-vs-memory", "step-time", "sweeps"} <= kinds
    for name, fig, png in drawn:
        ours, theirs = pixels(png), drawn_by_matplotlib(fig).pixels
        assert same_drawing(ours, theirs), (name, ours.shape, theirs.shape)
        buffer = io.BytesIO()
        with rc_context(plots.STYLE):
            fig.savefig(buffer, format="png", dpi=plots.DPI, bbox_inches="tight", pad_inches=plots.PAD_INCHES)
        tight = pixels(buffer.getvalue())
        # The cut is by ink, the tight box by layout extents: these hold blank ascents and side bearings, but the ink
        # of a glyph or of a line's antialiased edge may reach a pixel or two past them; never more.
        assert ours.shape[0] <= tight.shape[0] + 4 and ours.shape[1] <= tight.shape[1] + 4, (name, tight.shape)


def zlib_level_class(png: bytes) -> int:
    """FLEVEL of the first IDAT chunk's zlib header (RFC 1950: 0 fastest, 1 fast, 2 default, 3 maximum)."""
    at = 8
    while True:
        length, kind = struct.unpack(">I4s", png[at : at + 8])
        if kind == b"IDAT":
            return png[at + 9] >> 6
        at += 12 + length


def test_pngs_are_compressed_at_the_fastest_zlib_level_and_carry_their_run_ids(drawn):
    for name, _, png in drawn:
        assert zlib_level_class(png) == 0, name
        assert Image.open(io.BytesIO(png)).text["Description"].startswith("runs: ")


def labels(ax: Axes, which: str = "major") -> list[str]:
    """The y axis' non-empty tick labels inside its view interval, bottom to top."""
    lo, hi = sorted(ax.yaxis.get_view_interval())
    ticks = [(t.get_position()[1], t.get_text()) for t in ax.yaxis.get_ticklabels(which=which)]
    return [text for y, text in sorted(ticks) if lo <= y <= hi and text]


def drawn_axes(scale: str, limits: tuple[float, float], **kwargs: float) -> Axes:
    fig = Figure(dpi=plots.DPI)
    ax = fig.add_subplot()
    ax.set_yscale(scale, **kwargs)
    ax.yaxis.set_major_formatter(PlainLogFormatter(base=10))
    ax.set_ylim(*limits)
    FigureCanvasAgg(fig).draw()
    return ax


def test_log_and_symlog_tick_labels_are_superscript_powers_of_ten():
    assert labels(drawn_axes("log", (1e-3, 10))) == ["10⁻³", "10⁻²", "10⁻¹", "10⁰", "10¹"]
    symlog = drawn_axes("symlog", (-1000, 1000), linthresh=1)
    assert labels(symlog) == ["−10³", "−10²", "−10¹", "−10⁰", "0", "10⁰", "10¹", "10²", "10³"]
    formatter = PlainLogFormatter(base=10)
    assert [formatter(x) for x in (0.002, 300.0, -0.05, 0.0, 1.0)] == ["2×10⁻³", "3×10²", "−5×10⁻²", "0", "10⁰"]
    assert PlainLogFormatter(base=10, labelOnlyBase=True)(0.002) == ""


MINOR_LABELLED = {(2.0, 9.0): ["2×10⁰", "3×10⁰", "4×10⁰", "6×10⁰"], (1.0, 20.0): ["10⁰", "10¹"]}


@pytest.mark.parametrize("limits", [(1.0, 20.0), (2.0, 9.0), (0.03, 0.5), (1e-4, 1e4)])
def test_the_same_minor_ticks_are_labelled_as_by_matplotlibs_formatter(limits):
    """Where an axis spans little of a decade matplotlib labels some minor ticks: the same ones here."""
    labelled = []
    for formatter in (LogFormatterSciNotation, PlainLogFormatter):
        fig = Figure(dpi=plots.DPI)
        ax = fig.add_subplot()
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(formatter(base=10, labelOnlyBase=False, minor_thresholds=(1, 0.4)))
        ax.yaxis.set_major_formatter(formatter(base=10))
        ax.set_ylim(*limits)
        FigureCanvasAgg(fig).draw()
        texts = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both")]
        labelled.append([text != "" for text in texts])
        if formatter is PlainLogFormatter:
            assert all("$" not in text for text in texts)
            if limits in MINOR_LABELLED:
                assert labels(ax, which="both") == MINOR_LABELLED[limits]
    assert labelled[0] == labelled[1]
    assert sum(labelled[1]) >= 2


def test_every_tick_label_character_is_in_the_font_that_draws_it(drawn):
    log_axes = 0
    for _, fig, _ in drawn:
        for ax in fig.axes:
            log_axes += ax.get_yscale() != "linear"
            for label in ax.yaxis.get_ticklabels() + ax.xaxis.get_ticklabels():
                font = ft2font.FT2Font(font_manager.findfont(label.get_fontproperties()))
                missing = [c for c in label.get_text() if font.get_char_index(ord(c)) == 0]
                assert not missing, (label.get_text(), font.fname)
    assert log_axes >= 1


def test_drawing_a_suites_figures_parses_no_mathtext(suite_store, drawn, monkeypatch):
    """Counted at matplotlib's mathtext parser; the count is checked to see matplotlib's own log labels first."""
    calls = []
    parse = MathTextParser.parse
    monkeypatch.setattr(MathTextParser, "parse", lambda self, *a, **k: calls.append(a[0]) or parse(self, *a, **k))
    fig = Figure(dpi=plots.DPI)
    fig.add_subplot().set_yscale("log")
    FigureCanvasAgg(fig).draw()
    assert calls  # matplotlib's own formatter writes "$\\mathdefault{10^{0}}$"
    calls.clear()
    assert any(ax.get_yscale() == "log" for _, fig, _ in drawn for ax in fig.axes)
    figures = render.render_figures(build.build_report(suite_store, plotted=True), workers=1, cache=False)
    assert len(figures) == len(drawn)
    assert calls == []


def test_png_encoder_round_trips_pixels_alpha_resolution_and_text_through_pillow():
    rng = np.random.default_rng(0)
    opaque = rng.integers(0, 256, (7, 5, 4), dtype=np.uint8)
    opaque[..., 3] = 255
    translucent = opaque.copy()
    translucent[3, 2, 3] = 17
    metadata = {"Title": "suite τ: loss", "Description": "runs: a b"}  # τ is not Latin-1: an iTXt chunk
    for rgba, mode in ((opaque, "RGB"), (translucent, "RGBA")):
        image = Image.open(io.BytesIO(encode(rgba, 200, metadata, 1)))
        assert image.mode == mode and image.size == (5, 7)
        assert np.array_equal(np.asarray(image.convert("RGBA")), rgba)
        assert image.text == metadata
        # PNG's pHYs chunk holds whole pixels per metre: 200 dpi is stored as round(200 / 0.0254) = 7874 and read
        # back as 7874 * 0.0254 = 199.9996, within half a unit (0.0254 / 2 dpi) of it, plus a few float64 roundings.
        # A resolution dropped (72 dpi) or written as pixels per metre is off by >= 128.
        assert image.info["dpi"] == pytest.approx((200, 200), rel=0, abs=0.0254 / 2 + 4 * 2.0**-53 * 200)


def test_every_figure_draws_its_text_without_hinting(suite_store, monkeypatch):
    """Read where the Agg renderer asks which FreeType hinting to apply, while every figure of the suite is drawn."""
    from matplotlib.backends import backend_agg

    asked = []
    flag = backend_agg.get_hinting_flag
    monkeypatch.setattr(backend_agg, "get_hinting_flag", lambda: asked.append(flag()) or asked[-1])
    with rc_context({"text.hinting": "no_hinting"}):
        unhinted = flag()
    with rc_context({"text.hinting": "default"}):
        assert flag() != unhinted
    figures = render.render_figures(build.build_report(suite_store, plotted=True), workers=1, cache=False)
    assert len(figures) >= 5
    assert len(asked) > 100 and set(asked) == {unhinted}
