"""Files the report writes are replaced whole: written under a temporary name in the same directory, flushed to
disk, then renamed into place (`os.replace`, atomic within a file system). A failed write (a full disk, a crash)
leaves the previous file as it was and no temporary behind; readers see the old file or the new one, never a part.

Temporary names start with "." (`.report.html.<pid>.<random>.tmp`), so the store's readers and the report's own
globs (`*.png`) never take one for a real file.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _sync(path: Path) -> None:
    """Flush a written file (or each file of a written directory) to disk before it is renamed into place."""
    for file in sorted(path.iterdir()) if path.is_dir() else [path]:
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, not yet created, for the block to write a file (or a directory of files)
    at. When the block ends normally it is flushed and renamed over `path` (a directory only replaces an absent or
    empty one); when anything fails it is removed and the exception goes on."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        _sync(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (module docstring)."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` in UTF-8 (module docstring)."""
    write_bytes_atomic(path, text.encode("utf-8"))
