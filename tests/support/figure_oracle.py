"""What a report figure's PNG must hold, worked out with matplotlib and Pillow alone: matplotlib's own drawing of the
figure on a canvas ROOM inches larger than the figure on every side, cut by Pillow to the pixels that differ from
the figure's background, plus the padding."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest
from matplotlib import rc_context
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox
from PIL import Image, ImageChops

from structbench.report.figures import plots

ROOM = 4.0
PAD = round(plots.PAD_INCHES * plots.DPI)


@dataclass(frozen=True)
class Cut:
    pixels: np.ndarray
    """(height, width, 4) RGBA."""
    left: float
    top: float
    """Inches from the figure's lower left corner to the cut's upper left corner."""


def drawn_by_matplotlib(fig: Figure, pad: int = PAD) -> Cut:
    width, height = fig.get_size_inches()
    canvas = Bbox.from_extents(-ROOM, -ROOM, width + ROOM, height + ROOM)
    buffer = io.BytesIO()
    with rc_context(plots.STYLE):
        fig.savefig(buffer, format="png", dpi=plots.DPI, bbox_inches=canvas)
    image = Image.open(buffer).convert("RGB")
    background = Image.new("RGB", image.size, to_hex(fig.get_facecolor()))
    box = ImageChops.difference(image, background).getbbox()
    assert box is not None
    left, top, right, bottom = box
    assert left > pad and top > pad and right < image.width - pad and bottom < image.height - pad, "ROOM too small"
    cut = image.crop((left - pad, top - pad, right + pad, bottom + pad)).convert("RGBA")
    return Cut(np.asarray(cut), (left - pad) / plots.DPI - ROOM, height + ROOM - (top - pad) / plots.DPI)


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def same_drawing(ours: np.ndarray, theirs: np.ndarray) -> bool:
    """Equal shapes and at most one pixel in a thousand different: a line whose position falls on a pixel's edge may
    be placed on either side of it depending on where the canvas starts (matplotlib snaps lines to whole pixels)."""
    return ours.shape == theirs.shape and float((ours != theirs).any(axis=2).mean()) <= 1e-3


@contextmanager
def keeping_figures() -> Iterator[list[tuple[Figure, bytes]]]:
    """While open, every figure the report draws is kept, in order, as (matplotlib figure, its PNG bytes)."""
    kept: list[tuple[Figure, bytes]] = []
    original = plots._png

    def keep(fig: Figure, title: str, run_ids: list[str]) -> bytes:
        png = original(fig, title, run_ids)
        kept.append((fig, png))
        return png

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "_png", keep)
        yield kept
