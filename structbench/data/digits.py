"""scikit-learn's bundled 8x8 digits (``digits.csv.gz``: 1,797 rows of 64 pixels in 0..16, then the label).

Looked for at ``<root>/digits/digits.csv.gz``, then inside an installed scikit-learn at
``sklearn/datasets/data/digits.csv.gz`` (located with :func:`importlib.util.find_spec`, which does
not import scikit-learn). The file has no train/test split; :func:`stratified_split` makes a
seeded one, recorded in the returned metadata. Images are returned as uint8 (N, 1, 8, 8) with
values 0..16 (``pixel_max`` 16), labels as int64.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import torch

from structbench.data.checksums import Verdict, judge, md5_bytes, md5_file, notes_of, warn_mismatches
from structbench.data.errors import DataFormatError
from structbench.data.idx import decompress_if_gzip
from structbench.data.splits import ArraySplit, DatasetMeta, Found, Search
from structbench.errors import UsageError

DIGITS_FILE = "digits/digits.csv.gz"
SKLEARN_DIGITS_FILE = ("datasets", "data", "digits.csv.gz")
DIGITS_PIXELS = 64
DIGITS_PIXEL_MAX = 16
DIGITS_CLASSES = 10
DEFAULT_SEED = 0
DEFAULT_TEST_FRACTION = 0.2


def sklearn_digits_file() -> Path | None:
    """Path of ``digits.csv.gz`` inside an installed scikit-learn, or None; never imports sklearn."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(location).joinpath(*SKLEARN_DIGITS_FILE)
        if candidate.is_file():
            return candidate
    return None


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) row indices: per class, ``round(test_fraction * count)`` rows go to test.

    Uses ``numpy.random.RandomState(seed)``, whose stream numpy keeps fixed across versions, so
    a seed names the same split everywhere.
    """
    rng = np.random.RandomState(seed)
    is_test = np.zeros(labels.shape[0], dtype=bool)
    for cls in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == cls))
        is_test[rows[: round(test_fraction * rows.size)]] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def parse_digits_csv(payload: bytes, source: Path) -> tuple[np.ndarray, np.ndarray]:
    """Decode the (decompressed) CSV into (uint8 (N, 1, 8, 8) images, int64 (N,) labels)."""
    try:
        table = np.loadtxt(io.StringIO(payload.decode("ascii")), delimiter=",", ndmin=2)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DataFormatError(source, f"not a numeric CSV ({exc})") from exc
    if table.shape[0] == 0 or table.shape[1] != DIGITS_PIXELS + 1:
        raise DataFormatError(source, f"expected rows of {DIGITS_PIXELS} pixels and a label, found shape {table.shape}")
    pixels, labels = table[:, :DIGITS_PIXELS], table[:, DIGITS_PIXELS]
    if not np.array_equal(table, np.round(table)):
        raise DataFormatError(source, "non-integer values")
    if pixels.min() < 0 or pixels.max() > DIGITS_PIXEL_MAX:
        raise DataFormatError(source, f"pixels outside 0..{DIGITS_PIXEL_MAX}")
    if labels.min() < 0 or labels.max() >= DIGITS_CLASSES:
        raise DataFormatError(source, f"labels outside 0..{DIGITS_CLASSES - 1}")
    images = pixels.astype(np.uint8).reshape(-1, 1, 8, 8)
    return images, labels.astype(np.int64)


class DigitsReader:
    """Locates and reads the digits CSV and splits it with a recorded seed."""

    options = frozenset({"verify", "seed", "test_fraction"})

    def locate(self, data_root: Path) -> Search:
        """The data root's copy first, then scikit-learn's."""
        candidates = [data_root / DIGITS_FILE]
        looked_at = [str(candidates[0])]
        packaged = sklearn_digits_file()
        if packaged is None:
            looked_at.append("sklearn/datasets/data/digits.csv.gz (scikit-learn is not installed)")
        else:
            candidates.append(packaged)
            looked_at.append(str(packaged))
        for path in candidates:
            if path.is_file():
                return Search(Found("csv", path, {"csv": path}), tuple(looked_at))
        return Search(None, tuple(looked_at))

    def read(
        self,
        found: Found,
        *,
        seed: int = DEFAULT_SEED,
        test_fraction: float = DEFAULT_TEST_FRACTION,
        verify: bool = True,
    ) -> tuple[ArraySplit, ArraySplit, DatasetMeta]:
        """Read the CSV and split it: ``test_fraction`` of each class goes to test, chosen by ``seed``."""
        if not 0.0 < test_fraction < 1.0:
            raise UsageError(f"digits test_fraction must lie strictly between 0 and 1, got {test_fraction}")
        path = found.files["csv"]
        raw = path.read_bytes()
        verdicts = [judge("digits", path, md5_bytes(raw))] if verify else []
        warn_mismatches(verdicts)
        images, labels = parse_digits_csv(decompress_if_gzip(raw, path), path)
        train_rows, test_rows = stratified_split(labels, test_fraction, seed)
        meta = DatasetMeta(
            name="digits",
            num_classes=DIGITS_CLASSES,
            class_names=tuple("0123456789"),
            source=path,
            files=(path,),
            pixel_max=DIGITS_PIXEL_MAX,
            notes=notes_of(verdicts),
            options={"seed": seed, "test_fraction": test_fraction, "split": "stratified, numpy RandomState"},
        )
        return _subset(images, labels, train_rows), _subset(images, labels, test_rows), meta

    def check(self, found: Found) -> list[Verdict]:
        """Checksum verdicts (scikit-learn publishes none, so the file is reported unverified)."""
        path = found.files["csv"]
        return [judge("digits", path, md5_file(path))]


def _subset(images: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> ArraySplit:
    return ArraySplit(torch.from_numpy(images[rows]), torch.from_numpy(labels[rows]))
