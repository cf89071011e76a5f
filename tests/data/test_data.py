"""Dataset readers: fixtures written in the exact upstream on-disk formats, read back through the real code.

Expected values come from how each format is defined (the CIFAR row layout, the IDX header, the
published digests recomputed here with hashlib), never from the readers' own output.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import tarfile
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import structbench.data.digits as digits_module
from structbench.data import (
    DATASETS,
    ChecksumWarning,
    DataFormatError,
    dataset_status,
    load,
    resolve_data_root,
)
from structbench.data.checksums import CONTENT_MD5, PUBLISHED_MD5
from structbench.data.digits import sklearn_digits_file, stratified_split
from structbench.data.idx import parse_idx, read_idx
from structbench.data.mnist import DEBIAN_FASHION_MNIST_DIR, IDX_FILES
from structbench.data.safe_pickle import load_pickle
from structbench.errors import MissingDataError, UsageError
from tests.support.datasets import cifar_batch, write_cifar10, write_cifar100, write_digits_csv, write_pickle

IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B, np.dtype(">f4"): 0x0D}


# ---------------------------------------------------------------- writers of the upstream formats


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def tar_folder(folder: Path, archive: Path) -> None:
    """The upstream archive: the batch folder at the top level of a .tar.gz."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX as the format defines it: 0, 0, type code, ndim, big-endian uint32 dims, big-endian data."""
    stored = array.astype(array.dtype.newbyteorder(">")) if array.dtype.itemsize > 1 else array
    header = bytes([0, 0, IDX_CODES[stored.dtype], array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + stored.tobytes(order="C")


def write_idx(path: Path, array: np.ndarray, gz: bool) -> Path:
    data = idx_bytes(array)
    target = path.with_name(path.name + ".gz") if gz else path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(data) if gz else data)
    return target


def write_idx_set(
    directory: Path, n_train: int = 5, n_test: int = 3, gz: tuple[bool, ...] = (True,) * 4, seed: int = 0
):
    """The four MNIST-style files; returns {role: array written}."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test-images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test-labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for (role, base), zipped in zip(IDX_FILES.items(), gz, strict=True):
        write_idx(directory / base, arrays[role], zipped)
    return arrays


@pytest.fixture
def no_system_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide data outside the data root (Debian's Fashion-MNIST, scikit-learn's digits)."""
    reader = DATASETS["fashion-mnist"].reader
    monkeypatch.setattr(reader, "layout", replace(reader.layout, system_dirs=()))
    monkeypatch.setattr(digits_module, "sklearn_digits_file", lambda: None)


# ---------------------------------------------------------------- data root


def test_data_root_precedence_cli_over_env_over_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STRUCTBENCH_DATA", raising=False)
    assert resolve_data_root(None) == tmp_path / "home" / ".cache" / "structbench" / "data"
    monkeypatch.setenv("STRUCTBENCH_DATA", str(tmp_path / "env"))
    assert resolve_data_root(None) == tmp_path / "env"
    assert resolve_data_root(tmp_path / "cli") == tmp_path / "cli"
    assert resolve_data_root(str(tmp_path / "cli")) == tmp_path / "cli"


def test_data_root_expands_home_and_ignores_empty_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("STRUCTBENCH_DATA", "")
    assert resolve_data_root("") == tmp_path / ".cache" / "structbench" / "data"
    assert resolve_data_root("~/mydata") == tmp_path / "mydata"
    assert not (tmp_path / ".cache").exists()


# ---------------------------------------------------------------- CIFAR


def test_cifar_pixel_order_is_rgb_planes_row_major(tmp_path: Path) -> None:
    written = write_cifar10(tmp_path, per_batch=2)
    rows = np.zeros((2, 3072), dtype=np.uint8)
    # A row is 1024 red bytes, then green, then blue, each plane row-major 32x32:
    # (c, h, w) sits at byte c*1024 + h*32 + w.
    placed = {(0, 5, 7): 11, (1, 31, 0): 22, (2, 0, 31): 33, (2, 17, 3): 44}
    for (c, h, w), value in placed.items():
        rows[1, c * 1024 + h * 32 + w] = value
    write_pickle(tmp_path / "cifar-10-batches-py" / "test_batch", cifar_batch(rows, {b"labels": [3, 9]}))

    train, test, meta = load("cifar10", tmp_path, verify=False)

    assert test.inputs.shape == (2, 3, 32, 32) and test.inputs.dtype == torch.uint8
    assert test.labels.tolist() == [3, 9] and test.labels.dtype == torch.int64
    for (c, h, w), value in placed.items():
        assert test.inputs[1, c, h, w].item() == value
    assert int(test.inputs.count_nonzero()) == len(placed)
    assert train.inputs.shape == (10, 3, 32, 32)
    expected_train = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
    assert torch.equal(train.inputs.reshape(10, 3072), torch.from_numpy(expected_train))
    assert train.labels.tolist() == [label for i in range(1, 6) for label in written[f"data_batch_{i}"][1]]
    assert meta.num_classes == 10 and meta.class_names[0] == "airplane" and meta.class_names[9] == "truck"
    assert meta.source == tmp_path / "cifar-10-batches-py" and meta.layout == "N,C,H,W" and meta.pixel_max == 255


def test_cifar10_archive_read_in_place_equals_folder(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "unpacked")
    archive_root = tmp_path / "archive_only"
    archive_root.mkdir()
    tar_folder(tmp_path / "unpacked" / "cifar-10-batches-py", archive_root / "cifar-10-python.tar.gz")

    from_folder = load("cifar10", tmp_path / "unpacked", verify=False)
    from_archive = load("cifar10", archive_root, verify=False)

    assert sorted(p.name for p in archive_root.iterdir()) == ["cifar-10-python.tar.gz"]
    assert from_archive[2].source == archive_root / "cifar-10-python.tar.gz"
    for a, b in zip(from_folder[:2], from_archive[:2], strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)


def test_cifar100_fine_labels_by_default_coarse_on_request(tmp_path: Path) -> None:
    written = write_cifar100(tmp_path / "root")
    archive_root = tmp_path / "archive_only"
    archive_root.mkdir()
    tar_folder(tmp_path / "root" / "cifar-100-python", archive_root / "cifar-100-python.tar.gz")

    for root in (tmp_path / "root", archive_root):
        train, test, meta = load("cifar100", root, verify=False)
        assert train.inputs.shape == (4, 3, 32, 32) and test.inputs.shape == (2, 3, 32, 32)
        assert torch.equal(train.inputs.reshape(4, 3072), torch.from_numpy(written["train"][0]))
        assert train.labels.tolist() == written["train"][1] and test.labels.tolist() == written["test"][1]
        assert meta.num_classes == 100 and len(meta.class_names) == 100 and meta.options["labels"] == "fine"

        train, test, meta = load("cifar100", root, labels="coarse", verify=False)
        assert train.labels.tolist() == written["train"][2] and test.labels.tolist() == written["test"][2]
        assert meta.num_classes == 20 and meta.class_names[19] == "coarse19"

    with pytest.raises(UsageError, match="no label set 'medium'"):
        load("cifar100", tmp_path / "root", labels="medium", verify=False)
    with pytest.raises(UsageError, match="takes no option labels"):
        load("cifar10", tmp_path / "root", labels="coarse")


def test_cifar_corrupt_batch_names_the_file(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:100])
    with pytest.raises(DataFormatError, match="data_batch_3"):
        load("cifar10", tmp_path, verify=False)

    write_pickle(batch, cifar_batch(np.zeros((2, 1024), dtype=np.uint8), {b"labels": [0, 1]}))
    with pytest.raises(DataFormatError, match=r"data_batch_3.*shape \(N, 3072\)"):
        load("cifar10", tmp_path, verify=False)


def test_cifar_pickle_with_numpy_1_global_names_loads() -> None:
    # The upstream files were pickled by Python 2 / numpy 1, whose arrays name numpy.core.multiarray._reconstruct.
    rows = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    blob = pickle.dumps(cifar_batch(rows, {b"labels": [4, 5]}), protocol=2)
    assert b"numpy._core.multiarray\n_reconstruct" in blob
    old_style = blob.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    # SHORT_BINSTRING ("U"): how Python 2 wrote a str, read back as bytes.
    py2_dict = b"\x80\x02}q\x00U\x06labelsq\x01]q\x02(K\x04K\x05es."
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = load_pickle(old_style, "data_batch_1")
        assert load_pickle(py2_dict, "data_batch_1") == {b"labels": [4, 5]}
    assert isinstance(batch, dict) and np.array_equal(batch[b"data"], rows) and batch[b"labels"] == [4, 5]


def test_cifar_pickle_cannot_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with pytest.raises(DataFormatError, match="refusing to load global"):
        load_pickle(pickle.dumps({b"data": Exploit()}, protocol=2), "evil_batch")
    assert not marker.exists()


def test_cifar_archive_checksum_mismatch_warns_and_loads(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "src")
    tar_folder(tmp_path / "src" / "cifar-10-batches-py", tmp_path / "cifar-10-python.tar.gz")
    with pytest.warns(ChecksumWarning, match="cifar-10-python.tar.gz"):
        train, _, meta = load("cifar10", tmp_path)
    assert len(train) == 15
    assert any("cifar-10-python.tar.gz" in note for note in meta.notes)


def test_cifar_repacked_archive_with_upstream_members_is_a_note_not_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_cifar10(tmp_path / "src")
    folder = tmp_path / "src" / "cifar-10-batches-py"
    tar_folder(folder, tmp_path / "cifar-10-python.tar.gz")
    member_md5 = {p.name: md5_of(p) for p in folder.iterdir()}
    monkeypatch.setitem(PUBLISHED_MD5, "cifar10", {**PUBLISHED_MD5["cifar10"], **member_md5})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChecksumWarning)
        _, _, meta = load("cifar10", tmp_path)
    assert meta.notes == (
        "cifar-10-python.tar.gz: re-compressed or re-packed copy (md5 differs from upstream, content matches)",
    )


# ---------------------------------------------------------------- IDX: MNIST and Fashion-MNIST


def test_idx_header_and_big_endian_payload(tmp_path: Path) -> None:
    shorts = np.array([[258, -2], [0, 32767]], dtype=np.int16)  # 258 = 0x0102: byte order matters
    floats = np.array([1.5, -0.25, 3e8], dtype=np.float32)
    signed = np.array([-128, 0, 127], dtype=np.int8)
    for array in (shorts, floats, signed):
        path = write_idx(tmp_path / f"a_{array.dtype}", array, gz=False)
        raw = path.read_bytes()
        assert raw[:2] == b"\x00\x00" and raw[3] == array.ndim
        decoded = read_idx(path)
        assert decoded.dtype.isnative and np.array_equal(decoded, array)
    assert int.from_bytes(idx_bytes(shorts)[12:14], "big") == 258


def test_mnist_gz_and_plain_files_read_as_n1hw(tmp_path: Path) -> None:
    arrays = write_idx_set(tmp_path / "mnist", gz=(True, False, False, True))
    train, test, meta = load("mnist", tmp_path, verify=False)
    assert train.inputs.shape == (5, 1, 28, 28) and test.inputs.shape == (3, 1, 28, 28)
    assert train.inputs.dtype == torch.uint8 and train.labels.dtype == torch.int64
    assert torch.equal(train.inputs[:, 0], torch.from_numpy(arrays["train-images"]))
    assert torch.equal(test.inputs[:, 0], torch.from_numpy(arrays["test-images"]))
    assert train.labels.tolist() == arrays["train-labels"].tolist()
    assert test.labels.tolist() == arrays["test-labels"].tolist()
    assert meta.source == tmp_path / "mnist" and meta.num_classes == 10
    assert (tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in meta.files
    assert (tmp_path / "mnist" / "train-labels-idx1-ubyte") in meta.files


def test_mnist_torchvision_raw_layout_is_found_after_flat_layout(tmp_path: Path) -> None:
    write_idx_set(tmp_path / "MNIST" / "raw", gz=(False,) * 4, seed=1)
    assert load("mnist", tmp_path, verify=False)[2].source == tmp_path / "MNIST" / "raw"
    write_idx_set(tmp_path / "mnist", seed=2)
    assert load("mnist", tmp_path, verify=False)[2].source == tmp_path / "mnist"


def test_truncated_idx_file_is_a_clear_error(tmp_path: Path) -> None:
    write_idx_set(tmp_path / "mnist", gz=(False,) * 4)
    images = tmp_path / "mnist" / "t10k-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-10])
    with pytest.raises(DataFormatError, match=r"t10k-images-idx3-ubyte: truncated IDX file.*\(3, 28, 28\)"):
        load("mnist", tmp_path, verify=False)


def test_truncated_gzip_and_bad_magic_are_clear_errors(tmp_path: Path) -> None:
    write_idx_set(tmp_path / "mnist")
    labels = tmp_path / "mnist" / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:15])
    with pytest.raises(DataFormatError, match=r"train-labels-idx1-ubyte\.gz: not a readable gzip file"):
        load("mnist", tmp_path, verify=False)
    with pytest.raises(DataFormatError, match="not an IDX file"):
        parse_idx(b"\x01\x00\x08\x01\x00\x00\x00\x01\x07", Path("bogus"))
    with pytest.raises(DataFormatError, match="unknown IDX element type code 0x07"):
        parse_idx(b"\x00\x00\x07\x01\x00\x00\x00\x01\x07", Path("bogus"))


def test_idx_checksums_published_recompressed_and_mismatched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "fashion-mnist"
    write_idx_set(directory)
    gz_md5 = {p.name: md5_of(p) for p in directory.iterdir()}
    content_md5 = {
        p.name.removesuffix(".gz"): hashlib.md5(gzip.decompress(p.read_bytes())).hexdigest()
        for p in directory.iterdir()
    }
    reader = DATASETS["fashion-mnist"].reader
    monkeypatch.setattr(reader, "layout", replace(reader.layout, system_dirs=()))

    monkeypatch.setitem(PUBLISHED_MD5, "fashion-mnist", gz_md5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChecksumWarning)
        assert load("fashion-mnist", tmp_path)[2].notes == ()

    # A re-gzipped copy (as Debian ships): the .gz md5s differ but the decompressed content matches.
    monkeypatch.setitem(PUBLISHED_MD5, "fashion-mnist", {name: "0" * 32 for name in gz_md5})
    monkeypatch.setitem(CONTENT_MD5, "fashion-mnist", content_md5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChecksumWarning)
        notes = load("fashion-mnist", tmp_path)[2].notes
    assert len(notes) == 4 and all("re-compressed" in note for note in notes)

    monkeypatch.setitem(CONTENT_MD5, "fashion-mnist", {})
    with pytest.warns(ChecksumWarning) as record:
        train, _, meta = load("fashion-mnist", tmp_path)
    assert len(train) == 5
    messages = sorted(str(w.message) for w in record if w.category is ChecksumWarning)
    assert len(messages) == 4 and messages == sorted(meta.notes)
    for name in gz_md5:
        assert any(
            f"{directory / name}: md5 {gz_md5[name]} differs from the published {'0' * 32}" in m for m in messages
        )


# ---------------------------------------------------------------- digits


def test_digits_from_data_root_with_seeded_stratified_split(tmp_path: Path, no_system_data: None) -> None:
    table = write_digits_csv(tmp_path / "digits" / "digits.csv.gz", n_per_class=10)
    train, test, meta = load("digits", tmp_path)
    assert train.inputs.shape == (80, 1, 8, 8) and test.inputs.shape == (20, 1, 8, 8)
    assert train.inputs.dtype == torch.uint8 and test.labels.dtype == torch.int64
    assert meta.pixel_max == 16 and meta.options["seed"] == 0 and meta.options["test_fraction"] == 0.2
    assert torch.bincount(test.labels, minlength=10).tolist() == [2] * 10
    rows = {tuple(r) for r in table.tolist()}
    for split in (train, test):
        flat = torch.cat([split.inputs.reshape(len(split), 64), split.labels[:, None]], dim=1)
        assert {tuple(r) for r in flat.tolist()} <= rows
    assert len({tuple(r) for r in torch.cat([train.inputs, test.inputs]).reshape(100, 64).tolist()}) == len(rows)

    again = load("digits", tmp_path, seed=0)[1]
    other = load("digits", tmp_path, seed=1)[1]
    assert torch.equal(again.inputs, test.inputs)
    assert not torch.equal(other.inputs, test.inputs)


def test_stratified_split_partitions_every_class() -> None:
    labels = np.repeat(np.arange(3), [10, 5, 20])
    train, test = stratified_split(labels, 0.2, seed=7)
    assert np.intersect1d(train, test).size == 0 and np.union1d(train, test).tolist() == list(range(35))
    assert np.bincount(labels[test]).tolist() == [2, 1, 4]


def test_digits_bad_values_name_the_file(tmp_path: Path, no_system_data: None) -> None:
    path = tmp_path / "digits" / "digits.csv.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b"0,1,2\n3,4,5\n"))
    with pytest.raises(DataFormatError, match=r"digits.csv.gz: expected rows of 64 pixels"):
        load("digits", tmp_path)
    path.write_bytes(gzip.compress((",".join(["17"] * 64) + ",3\n").encode()))
    with pytest.raises(DataFormatError, match=r"pixels outside 0..16"):
        load("digits", tmp_path)


# ---------------------------------------------------------------- missing data and status


def test_missing_dataset_names_every_path_and_how_to_get_it(tmp_path: Path, no_system_data: None) -> None:
    with pytest.raises(MissingDataError) as cifar:
        load("cifar10", tmp_path)
    message = str(cifar.value)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        assert str(tmp_path / "cifar-10-batches-py" / name) in message
    assert str(tmp_path / "cifar-10-python.tar.gz") in message
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in message and "\n" not in message

    with pytest.raises(MissingDataError) as mnist:
        load("mnist", tmp_path)
    for directory in (tmp_path / "mnist", tmp_path / "MNIST" / "raw"):
        for base in IDX_FILES.values():
            assert f"{directory / base}[.gz]" in str(mnist.value)
    assert f"{tmp_path}/mnist/" in str(mnist.value)

    with pytest.raises(MissingDataError, match="apt-get install dataset-fashion-mnist"):
        load("fashion-mnist", tmp_path)
    with pytest.raises(MissingDataError, match=str(tmp_path / "digits" / "digits.csv.gz")):
        load("digits", tmp_path)


def test_incomplete_copy_is_missing_and_says_what_is_lacking(tmp_path: Path, no_system_data: None) -> None:
    write_idx_set(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(MissingDataError, match=r"mnist is incomplete \(missing: t10k-labels-idx1-ubyte\)"):
        load("mnist", tmp_path)


def test_unknown_dataset_and_option_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="unknown dataset 'imagenet'; known: cifar10, cifar100, digits"):
        load("imagenet", tmp_path)
    with pytest.raises(UsageError, match="takes no option seed"):
        load("mnist", tmp_path, seed=3)


def test_registry_expected_files_are_relative_and_instructions_present() -> None:
    assert set(DATASETS) == {"cifar10", "cifar100", "mnist", "fashion-mnist", "digits"}
    for info in DATASETS.values():
        assert info.expected_files and all(not Path(f).is_absolute() for f in info.expected_files)
        assert info.how_to_get and info.num_classes in (10, 100)


def test_dataset_status_on_empty_and_populated_root(tmp_path: Path, no_system_data: None) -> None:
    empty = dataset_status(tmp_path)
    assert [row["name"] for row in empty] == list(DATASETS)
    assert all(row["present"] is False and row["where"] is None and row["note"] is None for row in empty)

    write_cifar10(tmp_path)
    write_idx_set(tmp_path / "mnist")
    write_digits_csv(tmp_path / "digits" / "digits.csv.gz")
    write_idx_set(tmp_path / "fashion-mnist")
    (tmp_path / "fashion-mnist" / "train-images-idx3-ubyte.gz").unlink()
    rows = {row["name"]: row for row in dataset_status(tmp_path)}

    assert rows["cifar10"]["present"] and rows["cifar10"]["where"] == tmp_path / "cifar-10-batches-py"
    assert "data_batch_1: md5" in rows["cifar10"]["note"]
    assert rows["mnist"]["present"] and rows["mnist"]["where"] == tmp_path / "mnist"
    assert rows["digits"]["where"] == tmp_path / "digits" / "digits.csv.gz"
    assert rows["digits"]["note"] == "digits.csv.gz: no published checksum, not verified"
    assert {k: v for k, v in rows["cifar100"].items() if k != "fetch"} == {
        "name": "cifar100",
        "present": False,
        "where": None,
        "note": None,
    }
    assert not rows["fashion-mnist"]["present"] and "missing: train-images-idx3-ubyte" in rows["fashion-mnist"]["note"]
    assert all(row["note"] is None for row in dataset_status(tmp_path, verify=False) if row["present"])


# ---------------------------------------------------------------- the real files, where this machine has them

@pytest.mark.system_part("fashion-mnist")
def test_real_debian_fashion_mnist(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ChecksumWarning)  # re-gzipped, but the decompressed content is verified
        train, test, meta = load("fashion-mnist", tmp_path)
    assert meta.source == DEBIAN_FASHION_MNIST_DIR
    assert train.inputs.shape == (60000, 1, 28, 28) and test.inputs.shape == (10000, 1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    mean = train.inputs.sum(dtype=torch.int64).item() / train.inputs.numel() / 255
    assert round(mean, 4) == 0.2860  # the published Fashion-MNIST train mean


def test_real_sklearn_digits(tmp_path: Path) -> None:
    train, test, meta = load("digits", tmp_path)
    assert len(train) + len(test) == 1797 and meta.source == sklearn_digits_file()
    labels = torch.cat([train.labels, test.labels])
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert int(torch.cat([train.inputs, test.inputs]).max()) == 16
