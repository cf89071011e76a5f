"""Tick labels of logarithmic and symmetric-log axes in plain text: "10⁻³", "−10²", "2×10⁻³", "0".

Matplotlib's own log formatter (ticker.LogFormatterSciNotation) writes the same labels as mathtext
("$\\mathdefault{10^{-3}}$"), which is parsed (pyparsing) for every label of every figure drawn: about a tenth
of a figure's drawing time. Here the exponent is written in Unicode superscript digits, which DejaVu Sans,
matplotlib's default font, holds. Which ticks are labelled (decades only, or the minor ticks matplotlib labels
when an axis spans little more than a decade) is the parent class's choice, unchanged.
"""

from __future__ import annotations

import math

import matplotlib as mpl
from matplotlib.ticker import LogFormatterSciNotation

SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
MINUS = "\N{MINUS SIGN}"
TIMES = "\N{MULTIPLICATION SIGN}"


def superscript(exponent: int) -> str:
    """The integer in superscript digits: -3 -> "⁻³"."""
    return str(exponent).translate(SUPERSCRIPT)


def _is_close_to_int(value: float) -> bool:
    return abs(value - round(value)) < 1e-10


class PlainLogFormatter(LogFormatterSciNotation):
    """LogFormatterSciNotation's labels (the same ticks labelled, the same numbers) without mathtext."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        if x == 0:
            return "0"
        sign = MINUS if x < 0 else ""
        base = self._base
        exponent_float = math.log(abs(x)) / math.log(base)
        decade = _is_close_to_int(exponent_float)
        exponent = round(exponent_float) if decade else math.floor(exponent_float)
        coefficient = base ** (exponent_float - exponent)
        if self.labelOnlyBase and not decade:
            return ""
        if self._sublabels is not None and round(coefficient) not in self._sublabels:
            return ""
        base_text = f"{base:g}"
        if abs(exponent_float) < mpl.rcParams["axes.formatter.min_exponent"]:
            return f"{sign}{abs(x):g}"
        if decade:
            return f"{sign}{base_text}{superscript(exponent)}"
        if _is_close_to_int(coefficient):
            coefficient = round(coefficient)
        return f"{sign}{coefficient:g}{TIMES}{base_text}{superscript(exponent)}"
