"""What may become a path in a results store, and the check that a path stays inside it.

Nothing read from a stored row names a file the store deletes or writes: a run's files are found by listing the
store's directories, and a run id taken from anywhere (a row, a file name) is used only when it has the form
`structbench.execution.runner.new_run_id` gives it. Names that become part of a run id (suite names, optimizer names
and `--optim-alias` names) are checked before any run starts, so a run never trains and then fails to store.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from structbench.errors import UsageError

RUN_ID = re.compile(r"\d{8}T\d{6}-[^/\\\x00]+-s-?\d+-[0-9a-f]{6}")
"""A run id as new_run_id makes it: `<UTC stamp>-<suite>-<optimizer>-s<seed>-<6 hex digits>`."""
RUN_KEY = re.compile(r"[0-9a-f]{20}")
"""A run key as structbench.plan.grid.run_key makes it (20 hex digits of a SHA-256): it names a run's checkpoint
directory and its claim, so nothing else is taken as one."""
NAME_MAX_BYTES = 96
"""The longest suite or optimizer name (UTF-8 bytes): two such names and any seed make a run's longest file name (its
temporary, `.<run id>.parquet.tmp`) at most 251 bytes, within the 255 a file system takes (ext4, XFS, NFS)."""


def is_run_id(text: str) -> bool:
    """Whether `text` has the form of a run id (so `<text>.parquet` is one file name, with no directory part)."""
    return RUN_ID.fullmatch(text) is not None and not _has_control_character(text)


def is_run_key(text: str) -> bool:
    """Whether `text` is a run key (so it is one file name, with no directory part)."""
    return isinstance(text, str) and RUN_KEY.fullmatch(text) is not None


def is_plain_name(text: str) -> bool:
    """Whether `text` is one visible file name: not empty, no directory part, no control character, not hidden."""
    return bool(text) and "/" not in text and "\\" not in text and not text.startswith(".") and not (
        _has_control_character(text)
    )


def _has_control_character(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def check_name(kind: str, name: str) -> None:
    """A UsageError unless `name` can be part of a run's file name: not empty, at most NAME_MAX_BYTES bytes, no `/` or
    `\\`, no control character."""
    if not name or "/" in name or "\\" in name or _has_control_character(name):
        raise UsageError(
            f"{kind} {name!r} cannot name stored runs: it must be non-empty, without '/', '\\' or control characters."
        )
    size = len(name.encode("utf-8", "surrogateescape"))
    if size > NAME_MAX_BYTES:
        raise UsageError(f"{kind} {name!r} is {size} bytes long; names of stored runs are at most {NAME_MAX_BYTES}.")


def inside(out: Path, path: Path) -> bool:
    """Whether `path` is inside the store `out` once every link is followed: its directory resolves under `out`, and
    a directory (which would be removed with its contents) is no link. The name of a file itself may be a link: it is
    the link that is removed or replaced, never what it points to."""
    root = out.resolve()
    if path.name in ("", ".", ".."):
        return False
    if path.is_dir() and (path.is_symlink() or not path.resolve().is_relative_to(root)):
        return False
    return path.parent.resolve().is_relative_to(root)
