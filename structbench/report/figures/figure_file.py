"""A drawn figure as the reports use it, the look (colour and line style) the figures give each optimizer, and the
links under each figure.

Apart from plots.py, which draws the figures: a report whose figures all come from the figure cache never loads
matplotlib's drawing machinery (only its colour maps, for the colours).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import matplotlib

if TYPE_CHECKING:
    from structbench.report.build import Report


PIXEL_RATIO = 2
"""Figures are drawn at this many image pixels per CSS pixel (plots.DPI), so they stay sharp on high-density screens;
the HTML report shows each at its image size divided by this."""


@dataclass(frozen=True)
class FigureFile:
    name: str
    title: str
    caption: str
    png: bytes
    run_ids: tuple[str, ...]
    suite: str | None
    width: int
    height: int


DASHES = ("-", "--", ":", "-.")
"""Line styles, one per block of ten optimizers (in name order)."""
HATCHES = ("", "////", "....", "xxxx")
"""Bar fills, one per round of the palette: bars beyond the palette's colours differ in their fill."""


class Look(NamedTuple):
    """How every figure draws one optimizer."""

    color: tuple[float, ...]
    dash: str
    hatch: str


def palette() -> list[tuple[float, ...]]:
    """21 colours: tab10's ten, tab20's ten light ones (each the light partner of a tab10 colour, so drawn dashed,
    never beside its partner's solid line) and black."""
    strong = [matplotlib.colormaps["tab10"](i) for i in range(10)]
    light = [matplotlib.colormaps["tab20"](2 * i + 1) for i in range(10)]
    return [*strong, *light, (0.0, 0.0, 0.0, 1.0)]


def optimizer_looks(names: Sequence[str]) -> dict[str, Look]:
    """One fixed look per optimizer across every figure: in name order, the i-th takes palette colour i mod 21,
    line style DASHES[i // 10 mod 4] (solid for the strong colours, dashed for their light partners, dotted for
    black) and bar fill HATCHES[i // 21 mod 4]; no two of the first 42 optimizers look alike."""
    colours = palette()
    return {
        name: Look(colours[i % len(colours)], DASHES[i // 10 % len(DASHES)], HATCHES[i // len(colours) % len(HATCHES)])
        for i, name in enumerate(sorted(names))
    }


def figure_links(figure: FigureFile, report: Report) -> list[tuple[str, str]]:
    """(label, run-list anchor) of every setting whose runs the figure draws."""
    ids = set(figure.run_ids)
    return [
        (v.label if figure.suite else f"{s.name}: {v.label}", v.variant.anchor)
        for s in report.suites
        if figure.suite in (None, s.name)
        for v in s.variants
        if not ids.isdisjoint(v.variant.run_ids)
    ]
