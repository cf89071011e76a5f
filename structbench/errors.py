"""Exceptions that carry a meaning for the command line and the run record."""

import difflib
from collections.abc import Sequence


class UsageError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2, nothing written."""


class MissingDataError(UsageError):
    """A dataset a suite needs is not on disk; the message names the expected files and how to get them."""


class SolverError(RuntimeError):
    """A matrix solver (SVD, eigendecomposition) failed beyond recovery; the run ends `solver_error`."""


class StoreWriteError(Exception):
    """The results store could not be written (a full disk, a lost mount): one line naming the store, exit 1."""


class DeviceUnusableError(Exception):
    """A run left the device unusable for this process (a CUDA error poisons its context): the inline executor stops
    the grid with one line, exit 1; the runs not done run when the command is repeated."""


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """ " Did you mean 'x'?" for the known name closest to `name` (difflib's ratio of at least 0.6), else ""."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""
