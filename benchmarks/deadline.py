"""A benchmark's time budget: loops over optimizers stop starting new work once it is spent, and say what they left
out, so that a suite of parts finishes inside its machine time and prints every result it has."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    """A point on the monotonic clock (None: no budget)."""

    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        return cls(None if seconds is None else time.monotonic() + seconds)

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def left(self) -> float | None:
        """Seconds left (at least 0), None without a budget."""
        return None if self.at is None else max(0.0, self.at - time.monotonic())


def cut_note(left_out: list[str]) -> str:
    """The line a loop prints when the budget stopped it before `left_out`."""
    return f"cut at the time budget: not measured: {', '.join(left_out)}"
