"""Checks of hyperparameter values, shared by the optimizers' param-group validation."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int_at_least(value: Any, low: int) -> bool:
    """Whether `value` is an int (not a bool) >= `low`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_choice(name: str, value: Any, valid: Iterable[str]) -> None:
    """Raise ValueError, listing the valid options, unless `value` is one of them."""
    options = tuple(valid)
    if value not in options:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(options)}")
