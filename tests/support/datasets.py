"""Tiny datasets written in the upstream on-disk formats: CIFAR's pickled batches and sklearn's digits.csv.gz."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np

CIFAR10_NAMES = [
    b"airplane",
    b"automobile",
    b"bird",
    b"cat",
    b"deer",
    b"dog",
    b"frog",
    b"horse",
    b"ship",
    b"truck",
]


def write_pickle(path: Path, obj: object) -> None:
    """Pickle as the CIFAR files are: a dict with bytes keys, protocol 2 (Python-2 era)."""
    path.write_bytes(pickle.dumps(obj, protocol=2))


def cifar_batch(images: np.ndarray, label_keys: dict[bytes, list[int]]) -> dict[bytes, object]:
    """A batch dict with the real keys; ``images`` is uint8 (N, 3072)."""
    n = images.shape[0]
    return {
        b"batch_label": b"testing batch 1 of 1",
        b"data": images,
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        **{key: list(values) for key, values in label_keys.items()},
    }


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def write_cifar10(root: Path, per_batch: int = 3, seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    """cifar-10-batches-py/ with 5 train batches, a test batch and batches.meta; returns what was written."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        rows, labels = random_rows(rng, per_batch), rng.integers(0, 10, per_batch).tolist()
        write_pickle(folder / name, cifar_batch(rows, {b"labels": labels}))
        written[name] = (rows, labels)
    write_pickle(
        folder / "batches.meta",
        {b"num_cases_per_batch": per_batch, b"label_names": CIFAR10_NAMES, b"num_vis": 3072},
    )
    return written


def write_cifar100(root: Path, n_train: int = 4, n_test: int = 2) -> dict[str, tuple[np.ndarray, list[int], list[int]]]:
    rng = np.random.default_rng(1)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    written = {}
    for name, n in (("train", n_train), ("test", n_test)):
        rows = random_rows(rng, n)
        fine, coarse = rng.integers(0, 100, n).tolist(), rng.integers(0, 20, n).tolist()
        write_pickle(folder / name, cifar_batch(rows, {b"fine_labels": fine, b"coarse_labels": coarse}))
        written[name] = (rows, fine, coarse)
    write_pickle(
        folder / "meta",
        {
            b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
        },
    )
    return written


def write_digits_csv(path: Path, n_per_class: int = 10, seed: int = 0) -> np.ndarray:
    """sklearn's digits.csv.gz format: integer rows of 64 pixels (0..16) then the label, comma-separated."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(10), n_per_class)
    table = np.concatenate([rng.integers(0, 17, (labels.size, 64)), labels[:, None]], axis=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(",".join(str(v) for v in row) for row in table) + "\n"
    path.write_bytes(gzip.compress(text.encode("ascii")))
    return table
