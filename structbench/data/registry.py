"""The dataset registry: what each dataset needs on disk, how to get it, and loading by name.

Reading never downloads (docs/data.md): only ``structbench data fetch`` does, when asked. A dataset
that is not on disk raises :class:`~structbench.errors.MissingDataError` naming every path looked
at and how to get the files (the fetch command first); it is never replaced by synthetic data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from structbench.data.checksums import Verdict, notes_of
from structbench.data.cifar import CIFAR10, CIFAR100, CifarReader
from structbench.data.digits import DIGITS_FILE, DigitsReader
from structbench.data.mnist import DEBIAN_FASHION_MNIST_DIR, FASHION_MNIST, IDX_FILES, MNIST, IdxReader
from structbench.data.root import DATA_ROOT_ENV
from structbench.data.splits import ArraySplit, DatasetMeta, Found, Search
from structbench.errors import MissingDataError, UsageError

ROOT_PLACEHOLDER = "<data root>"


class DatasetReader(Protocol):
    """What the registry needs from a reader.

    ``read(found, **options) -> (train, test, meta)`` accepts exactly the keyword names in
    ``options``; ``locate`` never raises for absent data; ``check`` checksums without parsing.
    """

    options: frozenset[str]

    @property
    def read(self) -> Callable[..., tuple[ArraySplit, ArraySplit, DatasetMeta]]: ...

    def locate(self, data_root: Path) -> Search: ...

    def check(self, found: Found) -> list[Verdict]: ...


@dataclass(frozen=True)
class DatasetInfo:
    """One registered dataset.

    ``image_shape`` is one image's (channels, height, width), as its reader returns it. ``expected_files`` is the
    primary layout, relative to the data root (``[.gz]``: the file may be gzipped); ``also_accepted`` lists the
    other places and forms that are recognised; ``how_to_get`` says how to obtain the files by hand (``<data root>``
    stands for the root), ``get`` the shortest way in a few words (one-line reports).
    """

    name: str
    description: str
    num_classes: int
    image_shape: tuple[int, int, int]
    expected_files: tuple[str, ...]
    also_accepted: tuple[str, ...]
    how_to_get: str
    get: str
    reader: DatasetReader
    fetch: tuple[tuple[str, str], ...] = ()
    """The files to fetch by hand for the primary layout: (URL, where to put it relative to the data root)."""

    def fetch_lines(self, data_root: Path) -> tuple[str, ...]:
        """One line per file to fetch: its URL and the exact path to put it at under ``data_root``."""
        return tuple(f"fetch {url} and put it at {data_root / destination}" for url, destination in self.fetch)


def _idx_files(directory: str) -> tuple[str, ...]:
    return tuple(f"{directory}/{base}[.gz]" for base in IDX_FILES.values())


def _idx_fetch(base_url: str, directory: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"{base_url}/{base}.gz", f"{directory}/{base}.gz") for base in IDX_FILES.values())


CIFAR_URL = "https://www.cs.toronto.edu/~kriz"
"""The CIFAR page's download location (https://www.cs.toronto.edu/~kriz/cifar.html)."""


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            name="cifar10",
            description="CIFAR-10: 50,000 train / 10,000 test 32x32 colour images, 10 classes",
            num_classes=10,
            image_shape=(3, 32, 32),
            expected_files=tuple(f"{CIFAR10.folder}/{name}" for name in CIFAR10.member_files),
            also_accepted=(CIFAR10.archive,),
            get="put cifar-10-python.tar.gz in <data root>/",
            how_to_get=(
                "Download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz by hand and put it in "
                "<data root>/ as is (it is read in place) or extracted there as cifar-10-batches-py/."
            ),
            reader=CifarReader(CIFAR10),
            fetch=((f"{CIFAR_URL}/{CIFAR10.archive}", CIFAR10.archive),),
        ),
        DatasetInfo(
            name="cifar100",
            description="CIFAR-100: 50,000 train / 10,000 test 32x32 colour images, 100 (20 coarse) classes",
            num_classes=100,
            image_shape=(3, 32, 32),
            expected_files=tuple(f"{CIFAR100.folder}/{name}" for name in CIFAR100.member_files),
            also_accepted=(CIFAR100.archive,),
            get="put cifar-100-python.tar.gz in <data root>/",
            how_to_get=(
                "Download https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz by hand and put it in "
                "<data root>/ as is (it is read in place) or extracted there as cifar-100-python/."
            ),
            reader=CifarReader(CIFAR100),
            fetch=((f"{CIFAR_URL}/{CIFAR100.archive}", CIFAR100.archive),),
        ),
        DatasetInfo(
            name="mnist",
            description="MNIST: 60,000 train / 10,000 test 28x28 grey handwritten digits, 10 classes",
            num_classes=10,
            image_shape=(1, 28, 28),
            expected_files=_idx_files("mnist"),
            also_accepted=_idx_files("MNIST/raw"),
            get="put the four MNIST .gz files in <data root>/mnist/",
            how_to_get=(
                "Download the four files train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz by hand from "
                "https://ossci-datasets.s3.amazonaws.com/mnist/ (torchvision's mirror of "
                "http://yann.lecun.com/exdb/mnist/) and put them, gzipped or not, in <data root>/mnist/."
            ),
            reader=IdxReader(MNIST),
            fetch=_idx_fetch("https://ossci-datasets.s3.amazonaws.com/mnist", "mnist"),
        ),
        DatasetInfo(
            name="fashion-mnist",
            description="Fashion-MNIST: 60,000 train / 10,000 test 28x28 grey clothing images, 10 classes",
            num_classes=10,
            image_shape=(1, 28, 28),
            expected_files=_idx_files("fashion-mnist"),
            also_accepted=(
                *_idx_files("FashionMNIST/raw"),
                *(f"{DEBIAN_FASHION_MNIST_DIR}/{b}.gz" for b in IDX_FILES.values()),
            ),
            get="apt-get install dataset-fashion-mnist",
            how_to_get=(
                "Install Debian's package (apt-get install dataset-fashion-mnist, found automatically in "
                f"{DEBIAN_FASHION_MNIST_DIR}/), or download the four .gz files by hand from "
                "https://github.com/zalandoresearch/fashion-mnist/tree/master/data/fashion and put them in "
                "<data root>/fashion-mnist/."
            ),
            reader=IdxReader(FASHION_MNIST),
            fetch=_idx_fetch(
                "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion", "fashion-mnist"
            ),
        ),
        DatasetInfo(
            name="digits",
            description="scikit-learn digits: 1,797 8x8 grey digits (0..16), 10 classes, seeded 80/20 split",
            num_classes=10,
            image_shape=(1, 8, 8),
            expected_files=(DIGITS_FILE,),
            also_accepted=("sklearn/datasets/data/digits.csv.gz inside an installed scikit-learn",),
            get="pip install scikit-learn",
            how_to_get=(
                "pip install scikit-learn (its bundled sklearn/datasets/data/digits.csv.gz is found "
                "automatically), or copy that file to <data root>/digits/digits.csv.gz."
            ),
            reader=DigitsReader(),
            fetch=(
                (
                    "https://github.com/scikit-learn/scikit-learn/raw/main/sklearn/datasets/data/digits.csv.gz",
                    DIGITS_FILE,
                ),
            ),
        ),
    )
}
"""Every dataset structbench can read, by the name suites use."""


def dataset_info(name: str) -> DatasetInfo:
    """The registry entry for ``name``; an unknown name is a :class:`UsageError` listing the known ones."""
    try:
        return DATASETS[name]
    except KeyError:
        raise UsageError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}") from None


def fetch_command(name: str, data_root: Path) -> str:
    """The command line that downloads dataset ``name`` into ``data_root``."""
    return f"structbench data fetch {name} --data-dir {data_root}"


def _fetch_hint(info: DatasetInfo, data_root: Path, then: str) -> str:
    """The fetch command in backquotes followed by ``then``, for a dataset with a public source; else ``''``."""
    return f"`{fetch_command(info.name, data_root)}`{then}" if info.fetch else ""


def missing_data_message(info: DatasetInfo, data_root: Path, search: Search) -> str:
    """One paragraph: that the data are missing, every path looked at, and how to get the files."""
    incomplete = f" Incomplete copies: {'; '.join(search.partial)}." if search.partial else ""
    fetch = _fetch_hint(info, data_root, " downloads and verifies it. Otherwise: ")
    return (
        f"Dataset {info.name!r} is not on disk (structbench never downloads data unless asked). "
        f"Looked for: {', '.join(search.looked_at)}.{incomplete} "
        f"To get it: {fetch}{info.how_to_get.replace(ROOT_PLACEHOLDER, str(data_root))} "
        f"The data root is {data_root} (--data-dir, else ${DATA_ROOT_ENV}, else ~/.cache/structbench/data)."
    )


def missing_data_summary(info: DatasetInfo, data_root: Path) -> str:
    """One line: which dataset is missing and how to get it."""
    get = _fetch_hint(info, data_root, ", or ") + info.get.replace(ROOT_PLACEHOLDER, str(data_root))
    return f"dataset {info.name!r} is not on disk; {get}"


def require(name: str, data_root: Path) -> None:
    """Raise :class:`MissingDataError` (naming every path looked at) unless dataset ``name`` is on disk."""
    info = dataset_info(name)
    search = info.reader.locate(data_root)
    if search.found is None:
        raise MissingDataError(missing_data_message(info, data_root, search), missing_data_summary(info, data_root))


def load(name: str, data_root: Path, **options: object) -> tuple[ArraySplit, ArraySplit, DatasetMeta]:
    """Load dataset ``name`` from ``data_root`` (or its other known places) as (train, test, meta).

    ``options`` go to the reader: ``verify`` (all; default True), ``labels`` (cifar100: ``"fine"``
    or ``"coarse"``), ``seed`` and ``test_fraction`` (digits). Raises :class:`MissingDataError`
    when the files are absent, :class:`~structbench.data.errors.DataFormatError` when present but
    unreadable, and warns :class:`~structbench.data.checksums.ChecksumWarning` on an md5 mismatch.
    """
    info = dataset_info(name)
    unknown = sorted(set(options) - info.reader.options)
    if unknown:
        accepted = ", ".join(sorted(info.reader.options))
        raise UsageError(f"dataset {name!r} takes no option {', '.join(unknown)} (accepted: {accepted})")
    search = info.reader.locate(data_root)
    if search.found is None:
        raise MissingDataError(missing_data_message(info, data_root, search), missing_data_summary(info, data_root))
    return info.reader.read(search.found, **options)


def dataset_status(data_root: Path, verify: bool = True) -> list[dict[str, object]]:
    """One row per registered dataset: ``name``, ``present``, ``where`` (Path or None), ``note`` and ``fetch``.

    With ``verify``, present files are checksummed (not parsed) and any finding is the note; for
    an absent dataset the note names incomplete copies, if any, and ``fetch`` says for each file to
    fetch its URL and the exact path to put it at (empty for a dataset that is present).
    """
    rows: list[dict[str, object]] = []
    for info in DATASETS.values():
        search = info.reader.locate(data_root)
        found = search.found
        if found is None:
            notes: tuple[str, ...] = search.partial
        else:
            notes = notes_of(info.reader.check(found)) if verify else ()
        rows.append(
            {
                "name": info.name,
                "present": found is not None,
                "where": found.where if found is not None else None,
                "note": "; ".join(notes) or None,
                "fetch": info.fetch_lines(data_root) if found is None else (),
            }
        )
    return rows
