"""CIFAR-10 and CIFAR-100 from the "python version" pickles (https://www.cs.toronto.edu/~kriz/cifar.html).

Accepted forms under the data root (the archive is read in place with :mod:`tarfile`, nothing
is extracted to disk):

    cifar-10-batches-py/{data_batch_1..data_batch_5, test_batch, batches.meta}   or  cifar-10-python.tar.gz
    cifar-100-python/{train, test, meta}                                        or  cifar-100-python.tar.gz

Each batch is a pickled dict: ``b"data"`` a (N, 3072) uint8 array whose rows hold a 32x32
image as 1024 red, then 1024 green, then 1024 blue bytes, each plane row-major; labels are
``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` / ``b"coarse_labels"`` (CIFAR-100). Images are
returned as uint8 (N, 3, 32, 32), labels as int64.
"""

from __future__ import annotations

import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from structbench.data.checksums import Verdict, judge, md5_bytes, md5_file, notes_of, warn_mismatches
from structbench.data.errors import DataFormatError
from structbench.data.safe_pickle import load_pickle
from structbench.data.splits import ArraySplit, DatasetMeta, Found, Search
from structbench.errors import UsageError

CIFAR_ROW_BYTES = 3 * 32 * 32


@dataclass(frozen=True)
class LabelSet:
    """One labelling of a CIFAR dataset: the batch key, the meta key naming the classes, and the count."""

    batch_key: str
    names_key: str
    num_classes: int


@dataclass(frozen=True)
class CifarLayout:
    """The upstream file names of one CIFAR dataset."""

    name: str
    folder: str
    archive: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    label_sets: dict[str, LabelSet]
    default_labels: str

    @property
    def member_files(self) -> tuple[str, ...]:
        """Every file the folder must hold, in reading order."""
        return (*self.train_files, *self.test_files, self.meta_file)


CIFAR10 = CifarLayout(
    name="cifar10",
    folder="cifar-10-batches-py",
    archive="cifar-10-python.tar.gz",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_files=("test_batch",),
    meta_file="batches.meta",
    label_sets={"default": LabelSet("labels", "label_names", 10)},
    default_labels="default",
)

CIFAR100 = CifarLayout(
    name="cifar100",
    folder="cifar-100-python",
    archive="cifar-100-python.tar.gz",
    train_files=("train",),
    test_files=("test",),
    meta_file="meta",
    label_sets={
        "fine": LabelSet("fine_labels", "fine_label_names", 100),
        "coarse": LabelSet("coarse_labels", "coarse_label_names", 20),
    },
    default_labels="fine",
)


class CifarReader:
    """Locates, verifies and reads one CIFAR dataset described by a :class:`CifarLayout`."""

    def __init__(self, layout: CifarLayout) -> None:
        self.layout = layout
        self.options = frozenset({"verify", "labels"} if len(layout.label_sets) > 1 else {"verify"})

    def locate(self, data_root: Path) -> Search:
        """Find the extracted folder (preferred) or the original archive directly under ``data_root``."""
        folder = data_root / self.layout.folder
        archive = data_root / self.layout.archive
        files = {name: folder / name for name in self.layout.member_files}
        looked_at = (*(str(path) for path in files.values()), str(archive))
        present = [name for name, path in files.items() if path.is_file()]
        if len(present) == len(files):
            return Search(Found("folder", folder, files), looked_at)
        if archive.is_file():
            return Search(Found("archive", archive, {"archive": archive}), looked_at)
        partial: tuple[str, ...] = ()
        if present:
            missing = ", ".join(name for name in files if name not in present)
            partial = (f"{folder} is incomplete (missing: {missing})",)
        return Search(None, looked_at, partial)

    def read(
        self, found: Found, *, labels: str | None = None, verify: bool = True
    ) -> tuple[ArraySplit, ArraySplit, DatasetMeta]:
        """Read both splits from ``found``; ``labels`` picks a label set (CIFAR-100: ``fine`` or ``coarse``).

        With ``verify``, every file is checked against the published md5 (a mismatch warns).
        """
        label_name = labels or self.layout.default_labels
        if label_name not in self.layout.label_sets:
            choices = ", ".join(self.layout.label_sets)
            raise UsageError(f"{self.layout.name} has no label set {label_name!r} (choose: {choices})")
        label_set = self.layout.label_sets[label_name]
        contents = self._read_contents(found)
        verdicts = self._verify(found, contents) if verify else []
        warn_mismatches(verdicts)
        sources = {name: self._source_name(found, name) for name in contents}
        class_names = self._class_names(contents[self.layout.meta_file], sources[self.layout.meta_file], label_set)
        train = self._read_split(self.layout.train_files, contents, sources, label_set)
        test = self._read_split(self.layout.test_files, contents, sources, label_set)
        meta = DatasetMeta(
            name=self.layout.name,
            num_classes=label_set.num_classes,
            class_names=class_names,
            source=found.where,
            files=tuple(found.files.values()),
            notes=notes_of(verdicts),
            options={"labels": label_name},
        )
        return train, test, meta

    def check(self, found: Found) -> list[Verdict]:
        """Checksum verdicts for ``found`` without parsing it."""
        return self._verify(found, None)

    def _verify(self, found: Found, contents: dict[str, bytes] | None) -> list[Verdict]:
        if found.kind == "archive":
            archive = found.files["archive"]

            def member_digests() -> dict[str, str]:
                members = contents if contents is not None else self._read_contents(found)
                return {name: md5_bytes(blob) for name, blob in members.items()}

            return [judge(self.layout.name, archive, md5_file(archive), member_digests)]
        return [
            judge(self.layout.name, path, md5_bytes(contents[name]) if contents is not None else md5_file(path))
            for name, path in found.files.items()
        ]

    def _read_contents(self, found: Found) -> dict[str, bytes]:
        if found.kind == "folder":
            return {name: path.read_bytes() for name, path in found.files.items()}
        return self._read_archive(found.files["archive"])

    def _read_archive(self, archive: Path) -> dict[str, bytes]:
        """Read the batch files out of the archive in one pass, without extracting anything to disk."""
        wanted = {f"{self.layout.folder}/{name}": name for name in self.layout.member_files}
        contents: dict[str, bytes] = {}
        try:
            with tarfile.open(archive, mode="r:*") as tar:
                for member in tar:
                    name = wanted.get(member.name.removeprefix("./"))
                    if name is None or not member.isfile():
                        continue
                    handle = tar.extractfile(member)
                    if handle is not None:
                        contents[name] = handle.read()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise DataFormatError(archive, f"not a readable tar archive ({exc})") from exc
        missing = [member for member, name in wanted.items() if name not in contents]
        if missing:
            raise DataFormatError(archive, f"archive lacks {', '.join(missing)}")
        return contents

    def _source_name(self, found: Found, name: str) -> str:
        if found.kind == "archive":
            return f"{found.files['archive']}:{self.layout.folder}/{name}"
        return str(found.files[name])

    def _class_names(self, blob: bytes, source: str, label_set: LabelSet) -> tuple[str, ...]:
        names = _str_keys(load_pickle(blob, source), source).get(label_set.names_key)
        if not isinstance(names, list) or len(names) != label_set.num_classes:
            raise DataFormatError(source, f"expected {label_set.num_classes} names under {label_set.names_key!r}")
        return tuple(n.decode("latin-1") if isinstance(n, bytes) else str(n) for n in names)

    def _read_split(
        self, files: tuple[str, ...], contents: dict[str, bytes], sources: dict[str, str], label_set: LabelSet
    ) -> ArraySplit:
        parts = [_parse_batch(contents[name], sources[name], label_set) for name in files]
        images = np.concatenate([images for images, _ in parts])
        labels = np.concatenate([labels for _, labels in parts])
        return ArraySplit(torch.from_numpy(images), torch.from_numpy(labels))


def _str_keys(obj: object, source: str) -> dict[str, object]:
    """The unpickled dict with its (Python-2 ``bytes``) keys decoded to ``str``."""
    if not isinstance(obj, dict):
        raise DataFormatError(source, f"expected a pickled dict, found {type(obj).__name__}")
    return {k.decode("latin-1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _parse_batch(blob: bytes, source: str, label_set: LabelSet) -> tuple[np.ndarray, np.ndarray]:
    """One batch as (uint8 (N, 3, 32, 32) images, int64 (N,) labels)."""
    batch = _str_keys(load_pickle(blob, source), source)
    data = batch.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != CIFAR_ROW_BYTES:
        found = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataFormatError(source, f"'data' must be a uint8 array of shape (N, {CIFAR_ROW_BYTES}), found {found}")
    if label_set.batch_key not in batch:
        raise DataFormatError(source, f"no {label_set.batch_key!r} entry")
    try:
        labels = np.asarray(batch[label_set.batch_key], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataFormatError(source, f"{label_set.batch_key!r} is not a list of integers") from exc
    if labels.shape != (data.shape[0],):
        raise DataFormatError(source, f"{data.shape[0]} images but {label_set.batch_key!r} has shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= label_set.num_classes):
        raise DataFormatError(
            source,
            f"{label_set.batch_key!r} outside 0..{label_set.num_classes - 1} ({labels.min()}..{labels.max()})",
        )
    return data.reshape(-1, 3, 32, 32), labels
