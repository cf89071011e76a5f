"""Command-line parsing the benchmark scripts share: a bad argument is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

import torch

USAGE_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse, with errors printed as one line (`error: ...`), without the usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)


def at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def device(text: str) -> torch.device:
    """An argument type: a torch device this machine has (`cpu`, or `cuda[:i]` where CUDA sees that device)."""
    try:
        found = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if found.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: torch sees no CUDA device on this machine")
        if found.index is not None and found.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    elif found.type != "cpu":
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu and cuda devices are benchmarked")
    return found
