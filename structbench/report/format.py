"""Number formatting shared by every output: significant digits, seconds, bytes, estimates with CIs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from structbench.report.stats import Estimate

NOT_REACHED = "not reached"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_num(value: Any, digits: int = 4) -> str:
    if _missing(value):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return f"{value:.{digits}g}"


def fmt_bytes(value: Any) -> str:
    if _missing(value):
        return "-"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def fmt_seconds(value: Any) -> str:
    if _missing(value):
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    sign, size = ("-" if value < 0 else ""), abs(value)
    if size == 0:
        return "0 s"
    if size < 1e-3:
        return f"{sign}{size * 1e6:.0f} µs"
    if size < 1:
        return f"{sign}{size * 1e3:.3g} ms"
    return f"{sign}{size:.3g} s"


def fmt_steps(value: Any) -> str:
    """Whole steps as integers; interpolated ones to 4 significant digits (whole numbers from 1,000 on)."""
    if _missing(value) or math.isinf(value) or abs(value) < 1000:
        return fmt_num(value)
    return f"{value:.0f}"


def fmt_signed(value: float, fmt: Callable[[Any], str]) -> str:
    """A difference with its sign always shown (a true minus sign for negatives)."""
    text = fmt(value)
    if _missing(value) or value == 0:
        return text
    return ("+" + text) if value > 0 else "−" + text.removeprefix("-")


def fmt_ratio(value: float) -> str:
    if _missing(value):
        return "-"
    if math.isinf(value):
        return "∞"
    return f"{value:.2f}x"


def fmt_percent(value: float) -> str:
    return "-" if _missing(value) else f"{100 * value:.0f}%"


def estimate_text(estimate: Estimate, fmt: Callable[[Any], str], infinite: str = NOT_REACHED) -> tuple[str, str]:
    """(median, "[lo, hi]" or "n=1") for a cell; an infinite median reads `infinite`."""
    if estimate.n == 0:
        return "-", ""
    median = infinite if math.isinf(estimate.median) and estimate.median > 0 else fmt(estimate.median)
    if not estimate.has_ci:
        return median, "n=1"
    return median, f"[{fmt(estimate.lo)}, {fmt(estimate.hi)}]"


def signed_estimate_text(estimate: Estimate, fmt: Callable[[Any], str]) -> tuple[str, str]:
    if estimate.n == 0:
        return "-", ""
    median = fmt_signed(estimate.median, fmt)
    if not estimate.has_ci:
        return median, "n=1"
    lo, hi = fmt_signed(estimate.lo or 0.0, fmt), fmt_signed(estimate.hi or 0.0, fmt)
    return median, f"[{lo}, {hi}] n={estimate.n}"
