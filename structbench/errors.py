"""Exceptions that carry a meaning for the command line and the run record."""


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
