"""Number formatting shared by every output: significant digits, seconds, bytes, medians with their intervals."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from structbench.report.analysis.stats import Estimate

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


def interval_text(estimate: Estimate, fmt: Callable[[Any], str], signed: bool = False) -> str:
    """What is shown below a median: "n=1", "min–max [lo, hi] n=3" below 5 seeds, "95% CI [lo, hi] n=7" from 5."""
    if estimate.kind == "":
        return f"n={estimate.n}"
    shown = (lambda v: fmt_signed(v, fmt)) if signed else fmt
    label = "min–max" if estimate.kind == "range" else "95% CI"
    return f"{label} [{shown(estimate.lo)}, {shown(estimate.hi)}] n={estimate.n}"


def estimate_text(estimate: Estimate, fmt: Callable[[Any], str], infinite: str = NOT_REACHED) -> tuple[str, str]:
    """(median, its interval as interval_text says) for a cell; an infinite median reads `infinite`."""
    if estimate.n == 0:
        return "-", ""
    median = infinite if math.isinf(estimate.median) and estimate.median > 0 else fmt(estimate.median)
    return median, interval_text(estimate, fmt)


def signed_estimate_text(estimate: Estimate, fmt: Callable[[Any], str]) -> tuple[str, str]:
    if estimate.n == 0:
        return "-", ""
    return fmt_signed(estimate.median, fmt), interval_text(estimate, fmt, signed=True)
