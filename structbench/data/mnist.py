"""MNIST and Fashion-MNIST from their four IDX files, gzipped or not.

Searched in order, the first directory holding all four files wins (each file may be ``.gz``
or plain; the ``.gz`` is preferred because upstream publishes its checksum):

    MNIST:          <root>/mnist/, <root>/MNIST/raw/   (torchvision's layout)
    Fashion-MNIST:  <root>/fashion-mnist/, <root>/FashionMNIST/raw/, /usr/share/datasets/fashion-mnist/
                    (the last is where Debian's ``dataset-fashion-mnist`` package installs it)

Files: ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte``. Images are returned as uint8 (N, 1, H, W), labels as int64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from structbench.data.checksums import Verdict, judge, md5_bytes, md5_file, notes_of, warn_mismatches
from structbench.data.errors import DataFormatError
from structbench.data.idx import GZIP_MAGIC, decompress_if_gzip, parse_idx
from structbench.data.splits import ArraySplit, DatasetMeta, Found, Search

IDX_FILES: dict[str, str] = {
    "train-images": "train-images-idx3-ubyte",
    "train-labels": "train-labels-idx1-ubyte",
    "test-images": "t10k-images-idx3-ubyte",
    "test-labels": "t10k-labels-idx1-ubyte",
}
"""Role -> upstream file name without the ``.gz`` suffix."""

DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class IdxLayout:
    """Where one IDX dataset may live: directories under the data root, then system directories."""

    name: str
    root_dirs: tuple[str, ...]
    system_dirs: tuple[Path, ...]
    class_names: tuple[str, ...]


MNIST = IdxLayout(
    name="mnist",
    root_dirs=("mnist", "MNIST/raw"),
    system_dirs=(),
    class_names=tuple("0123456789"),
)

FASHION_MNIST = IdxLayout(
    name="fashion-mnist",
    root_dirs=("fashion-mnist", "FashionMNIST/raw"),
    system_dirs=(DEBIAN_FASHION_MNIST_DIR,),
    class_names=(
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
)


class IdxReader:
    """Locates, verifies and reads one IDX dataset described by an :class:`IdxLayout`."""

    options = frozenset({"verify"})

    def __init__(self, layout: IdxLayout) -> None:
        self.layout = layout

    def search_dirs(self, data_root: Path) -> tuple[Path, ...]:
        """The directories searched, in order."""
        return (*(data_root / rel for rel in self.layout.root_dirs), *self.layout.system_dirs)

    def locate(self, data_root: Path) -> Search:
        """Find the first directory holding all four IDX files."""
        looked_at: list[str] = []
        partial: list[str] = []
        for directory in self.search_dirs(data_root):
            files = {role: _gz_or_plain(directory, base) for role, base in IDX_FILES.items()}
            looked_at.extend(f"{directory / base}[.gz]" for base in IDX_FILES.values())
            present = {role: path for role, path in files.items() if path is not None}
            if len(present) == len(IDX_FILES):
                return Search(Found("idx", directory, present), tuple(looked_at))
            if present:
                missing = ", ".join(IDX_FILES[role] for role in IDX_FILES if role not in present)
                partial.append(f"{directory} is incomplete (missing: {missing})")
        return Search(None, tuple(looked_at), tuple(partial))

    def read(self, found: Found, *, verify: bool = True) -> tuple[ArraySplit, ArraySplit, DatasetMeta]:
        """Read both splits from ``found``; with ``verify``, check every file's md5 (a mismatch warns)."""
        payloads: dict[str, bytes] = {}
        verdicts: list[Verdict] = []
        for role, path in found.files.items():
            raw = path.read_bytes()
            payloads[role] = decompress_if_gzip(raw, path)
            if verify:
                gzipped = raw[:2] == GZIP_MAGIC
                verdicts.append(
                    _judge_idx(self.layout.name, path, md5_bytes(raw), gzipped, partial(payloads.__getitem__, role))
                )
        warn_mismatches(verdicts)
        train = self._split(found, payloads, "train")
        test = self._split(found, payloads, "test")
        meta = DatasetMeta(
            name=self.layout.name,
            num_classes=len(self.layout.class_names),
            class_names=self.layout.class_names,
            source=found.where,
            files=tuple(found.files.values()),
            notes=notes_of(verdicts),
        )
        return train, test, meta

    def check(self, found: Found) -> list[Verdict]:
        """Checksum verdicts for ``found`` without parsing it (decompressing only on a mismatch)."""
        verdicts = []
        for path in found.files.values():
            with path.open("rb") as handle:
                head = handle.read(2)
            gzipped = head == GZIP_MAGIC
            verdicts.append(_judge_idx(self.layout.name, path, md5_file(path), gzipped, partial(_payload, path)))
        return verdicts

    def _split(self, found: Found, payloads: dict[str, bytes], split: str) -> ArraySplit:
        images_path, labels_path = found.files[f"{split}-images"], found.files[f"{split}-labels"]
        images = parse_idx(payloads[f"{split}-images"], images_path)
        labels = parse_idx(payloads[f"{split}-labels"], labels_path)
        if images.dtype != np.uint8 or images.ndim != 3:
            raise DataFormatError(images_path, f"expected uint8 images (N, H, W), found {images.dtype} {images.shape}")
        if labels.dtype != np.uint8 or labels.ndim != 1:
            raise DataFormatError(labels_path, f"expected uint8 labels (N,), found {labels.dtype} {labels.shape}")
        if labels.shape[0] != images.shape[0]:
            raise DataFormatError(
                labels_path, f"{labels.shape[0]} labels for {images.shape[0]} images in {images_path}"
            )
        num_classes = len(self.layout.class_names)
        if labels.size and labels.max() >= num_classes:
            raise DataFormatError(labels_path, f"label {labels.max()} outside 0..{num_classes - 1}")
        n, height, width = images.shape
        return ArraySplit(
            torch.from_numpy(images.reshape(n, 1, height, width)), torch.from_numpy(labels.astype(np.int64))
        )


def _gz_or_plain(directory: Path, base: str) -> Path | None:
    """``directory/base.gz`` if it is a file, else ``directory/base`` if it is, else None."""
    for candidate in (directory / f"{base}.gz", directory / base):
        if candidate.is_file():
            return candidate
    return None


def _payload(path: Path) -> bytes:
    """The decompressed bytes of the IDX file at ``path``."""
    return decompress_if_gzip(path.read_bytes(), path)


def _judge_idx(dataset: str, path: Path, digest: str, gzipped: bool, payload: Callable[[], bytes]) -> Verdict:
    """Judge an IDX file; for a gzip file whose md5 differs, fall back to its decompressed content."""
    if not gzipped:
        return judge(dataset, path, digest)
    content_name = path.name.removesuffix(".gz")
    return judge(dataset, path, digest, lambda: {content_name: md5_bytes(payload())})
