"""Objects frozen out of the garbage collector (gc.freeze), counted so that several holders can share one freeze.

A full collection walks every tracked object: after importing torch, pandas and matplotlib that is some hundred
thousand objects and about 0.2 s on a 2-core machine. Work that collects often (the memory probe collects before each
run; a report's figure workers) freezes what already exists, so its collections walk only what it made since.
gc.unfreeze gives every frozen object back at once, so only the last holder's `thaw` calls it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_holders = 0
"""How many holders keep what they froze out of the garbage collector."""


def freeze() -> None:
    """Freeze every object that exists now out of the garbage collector, until the matching `thaw`."""
    global _holders
    gc.freeze()
    _holders += 1


def thaw() -> None:
    """Let go of one `freeze`: the last one gives every frozen object back to the garbage collector."""
    global _holders
    _holders -= 1
    if _holders == 0:
        gc.unfreeze()


@contextmanager
def frozen() -> Iterator[None]:
    """What exists on entry frozen out of the garbage collector until exit."""
    freeze()
    try:
        yield
    finally:
        thaw()
