"""Exceptions that carry a meaning for the command line and the run record, and the name registries whose
unknown names are usage errors."""

import difflib
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


class UsageError(Exception):
    """Bad input from the user: reported as one line on stderr, exit code 2, nothing written."""


class MissingDataError(UsageError):
    """A dataset a suite needs is not on disk; the message names the expected files and how to get them, `summary`
    says what is missing and how to get it in one short line (for reports that list many, such as `claims`)."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary or message


class SolverError(RuntimeError):
    """A matrix solver (SVD, eigendecomposition) failed beyond recovery; the run ends `solver_error`."""


class StoreWriteError(Exception):
    """The results store could not be written (a full disk, a lost mount): one line naming the store, exit 1."""


class DeviceUnusableError(Exception):
    """A run left the device unusable for this process (a CUDA error poisons its context): the inline executor stops
    the grid with one line, exit 1; the runs not done run when the command is repeated."""


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """ " Did you mean 'x'?" for the known name closest to `name`, else "": the one that differs from it only in
    case (`FISMO` means `fismo`), else the closest with case ignored (difflib's ratio of at least 0.6)."""
    by_folded = {item.casefold(): item for item in known}
    close = difflib.get_close_matches(name.casefold(), list(by_folded), n=1)
    return f" Did you mean {by_folded[close[0]]!r}?" if close else ""


def unknown_name_message(kind: str, name: str, known: Sequence[str]) -> str:
    """The one-line usage error for a name that is not among `known`: "unknown task 'x'. Did you mean 'y'? Known:
    ..."."""
    return f"unknown {kind} {name!r}.{did_you_mean(name, known)} Known: {', '.join(known)}."


class Registry(dict[str, T]):
    """Items of one kind by name (tasks, experiments, papers, executors): a dict that refuses a name registered
    twice and whose `lookup` of an unknown name is a usage error naming the closest known one.

    `names()` lists the known names sorted, or in registration order with `sort=False`.
    """

    def __init__(self, kind: str, items: Iterable[tuple[str, T]] = (), *, sort: bool = True) -> None:
        super().__init__()
        self.kind = kind
        self.sort = sort
        for name, item in items:
            self.register(name, item)

    def register(self, name: str, item: T) -> T:
        """Add `item` under `name`; a name already registered is a ValueError. Returns `item`."""
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self[name] = item
        return item

    def lookup(self, name: str) -> T:
        """The item registered under `name`; an unknown name is a UsageError (`unknown_name_message`)."""
        if name not in self:
            raise UsageError(unknown_name_message(self.kind, name, self.names()))
        return self[name]

    def names(self) -> list[str]:
        return sorted(self) if self.sort else list(self)
