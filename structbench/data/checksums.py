"""Published checksums of the upstream dataset files, and the verdict on a file against them.

Policy (structbench's, for the reason below): a mismatch warns, it never refuses. Files are re-packed in the
wild (Debian re-gzips Fashion-MNIST, so its ``.gz`` md5s differ from upstream's while the decoded
arrays are identical); only a file that cannot be parsed is an error, raised by the readers.
Where the outer file differs, the verdict falls back to the digest of its content (the
decompressed IDX bytes, or the batch files inside a CIFAR archive) when that digest is known.
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from structbench.inert import inert

PUBLISHED_MD5: dict[str, dict[str, str]] = {
    # https://www.cs.toronto.edu/~kriz/cifar.html (archives); batch files as pinned by torchvision.
    "cifar10": {
        "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
        "data_batch_1": "c99cafc152244af753f735de768cd75f",
        "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
        "test_batch": "40351d587109b95175f43aff81a1287e",
        "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
    },
    "cifar100": {
        "cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85",
        "train": "16019d7e3df5f24257cddd939b257f8d",
        "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
        "meta": "7973b15100ade9c7d40fb424638fde48",
    },
    # The gzipped IDX files as distributed upstream (pinned by torchvision).
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    # Fashion-MNIST README (github.com/zalandoresearch/fashion-mnist).
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}
"""md5 of each upstream file as distributed, per dataset, keyed by file name."""

CONTENT_MD5: dict[str, dict[str, str]] = {
    # Decompressed IDX files of Debian's dataset-fashion-mnist 0.0~git20200523.55506a9-1
    # (hashed from that package's files); upstream publishes no digest of the decompressed files.
    "fashion-mnist": {
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}
"""md5 of the content inside a compressed file, for when the compressed file was re-packed."""

Status = Literal["ok", "content-ok", "mismatch", "unpublished"]


class ChecksumWarning(UserWarning):
    """A dataset file's digest differs from the published one; the data are used anyway."""


@dataclass(frozen=True)
class Verdict:
    """The checksum outcome for one file.

    ``ok``: matches the published digest. ``content-ok``: the file differs but its content
    matches (a re-packed copy). ``mismatch``: neither matches; the data are used with a warning.
    ``unpublished``: no digest is known for this file.
    """

    file: Path
    status: Status
    note: str | None


def md5_bytes(data: bytes) -> str:
    """Hex md5 of ``data``."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_file(path: Path) -> str:
    """Hex md5 of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def judge(
    dataset: str,
    path: Path,
    digest: str,
    content_digests: Callable[[], dict[str, str]] | None = None,
) -> Verdict:
    """Compare ``digest`` (md5 of the file at ``path``) with the known md5 for its name.

    On a mismatch, ``content_digests`` (called only then) returns ``{content name: md5}`` for
    what the file holds (for a gzip file: its name without ``.gz``; for an archive: its members);
    if every one of those matches its known content digest, the file is a re-packed copy.
    """
    known = CONTENT_MD5.get(dataset, {}) | PUBLISHED_MD5.get(dataset, {})
    expected = known.get(path.name)
    if expected is None:
        return Verdict(path, "unpublished", f"{path.name}: no published checksum, not verified")
    if digest == expected:
        return Verdict(path, "ok", None)
    contents = content_digests() if content_digests is not None else {}
    if contents and all(known.get(name) == md5 for name, md5 in contents.items()):
        return Verdict(
            path,
            "content-ok",
            f"{path.name}: re-compressed or re-packed copy (md5 differs from upstream, content matches)",
        )
    return _mismatch(path, digest, expected)


def _mismatch(path: Path, digest: str, expected: str) -> Verdict:
    return Verdict(
        path,
        "mismatch",
        f"{path}: md5 {digest} differs from the published {expected}; the file may have been "
        "re-compressed or modified, using it anyway",
    )


def warn_mismatches(verdicts: Iterable[Verdict]) -> None:
    """Emit a :class:`ChecksumWarning` for every mismatching file."""
    for verdict in verdicts:
        if verdict.status == "mismatch":
            warnings.warn(verdict.note or str(verdict.file), ChecksumWarning, stacklevel=2)


def show_checksum_warnings_as_lines() -> None:
    """Print each :class:`ChecksumWarning` that reaches the terminal as one ``warning: ...`` line (no source line,
    no category name); other warnings print as before. Called by the command line and its worker processes;
    idempotent. Filters still apply (``-W error::...ChecksumWarning``, ``pytest.warns``)."""
    previous = warnings.showwarning
    if getattr(previous, "prints_checksum_lines", False):
        return

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, ChecksumWarning):
            print(f"warning: {inert(' '.join(str(message).splitlines()))}", file=file or sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    show_hook: Any = show
    show_hook.prints_checksum_lines = True
    warnings.showwarning = show_hook


def notes_of(verdicts: Iterable[Verdict]) -> tuple[str, ...]:
    """The notes worth recording with a run: everything but plain matches."""
    return tuple(v.note for v in verdicts if v.note is not None)
