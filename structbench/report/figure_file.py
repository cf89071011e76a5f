"""A drawn figure as the reports use it, the colours the figures share and the links under each figure.

Apart from plots.py, which draws the figures: a report whose figures all come from the figure cache never loads
matplotlib's drawing machinery (only its colour maps, for the colours).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import matplotlib

if TYPE_CHECKING:
    from structbench.report.build import Report


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


def optimizer_colors(names: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """One fixed colour per optimizer across every figure."""
    palette = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: palette(i % palette.N) for i, name in enumerate(sorted(names))}


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
