"""`structbench data fetch NAME`: the one explicit, opt-in download of a dataset's public files (docs/data.md).

Nothing else in structbench downloads: `run` only reads what is on disk. A fetch downloads each file into
``<destination>.part`` (resuming a partial one with an HTTP Range request), verifies its published checksum and only
then gives it its final name with :func:`os.replace`, so a file under its final name is always complete and
verified. CIFAR archives are then extracted (tarfile's ``data`` filter) into the folder the reader prefers.

Sources are the URLs of :mod:`structbench.data.registry` and GPT-2's vocabulary URL. ``$STRUCTBENCH_DATA_MIRROR``
names a mirror serving the same paths: ``https://host/a/b.gz`` is then fetched from ``<mirror>/a/b.gz``.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from urllib.parse import urlsplit

from structbench.data.checksums import PUBLISHED_MD5
from structbench.data.registry import DATASETS
from structbench.data.tokenizers import GPT2_DIR, GPT2_SHA256, GPT2_URL, find_gpt2_files
from structbench.errors import UsageError, unknown_name_message

MIRROR_ENV = "STRUCTBENCH_DATA_MIRROR"
"""Environment variable naming a mirror that serves the same paths as the official sources."""

DIGITS_MD5 = "9b335364a7bfd63947c7480a5bd51f2d"
"""md5 of sklearn/datasets/data/digits.csv.gz (57,523 bytes) as scikit-learn 1.9.1 ships it."""

CHUNK_BYTES = 1 << 16
TIMEOUT_S = 60.0
PART_SUFFIX = ".part"
GPT2_NAME = "gpt2"

ProgressCallback = Callable[[int, int | None], None]
"""Called with (bytes on disk so far, total size or None) as a file downloads."""


class FetchError(Exception):
    """A download failed (network, HTTP status, checksum, disk): one line, exit 1, no file under its final name."""


@dataclass(frozen=True)
class RemoteFile:
    """One file to download: its official URL, where it goes under the data root, and its published digest."""

    url: str
    destination: str
    algorithm: str
    digest: str


@dataclass(frozen=True)
class FetchPlan:
    """Everything `data fetch NAME` downloads; ``extract`` names the folder an archive unpacks to (or None)."""

    name: str
    files: tuple[RemoteFile, ...]
    extract: str | None = None


FETCH_MD5: dict[str, dict[str, str]] = {**PUBLISHED_MD5, "digits": {"digits.csv.gz": DIGITS_MD5}}
"""md5 of every file a registry dataset fetches, per dataset, keyed by file name."""


def _registry_plan(name: str) -> FetchPlan:
    """The plan for a registry dataset: its fetch URLs, with the md5 published for each file name.

    A fetched ``.tar.gz`` is extracted into the folder of the dataset's primary layout.
    """
    info = DATASETS[name]
    files = tuple(
        RemoteFile(url, destination, "md5", FETCH_MD5[name][Path(destination).name]) for url, destination in info.fetch
    )
    archived = any(remote.destination.endswith(".tar.gz") for remote in files)
    return FetchPlan(name, files, destination_folder(info.expected_files[0]) if archived else None)


def destination_folder(relative: str) -> str:
    """The first path component of ``relative`` (the folder an archive unpacks to)."""
    return Path(relative).parts[0]


def _gpt2_plan() -> FetchPlan:
    """GPT-2's two vocabulary files, checked against the sha256 tiktoken pins."""
    files = tuple(
        RemoteFile(f"{GPT2_URL}{file}", f"{GPT2_DIR}/{file}", "sha256", digest) for file, digest in GPT2_SHA256.items()
    )
    return FetchPlan(GPT2_NAME, files)


FETCHABLE: dict[str, FetchPlan] = {
    **{name: _registry_plan(name) for name, info in DATASETS.items() if info.fetch},
    GPT2_NAME: _gpt2_plan(),
}
"""Every dataset or vocabulary with a public source, by the name `data fetch` takes."""


def fetch_plan(name: str) -> FetchPlan:
    """The plan for ``name``; an unknown name is a :class:`UsageError` naming the closest known one."""
    if name not in FETCHABLE:
        raise UsageError(unknown_name_message("dataset to fetch", name, sorted(FETCHABLE)))
    return FETCHABLE[name]


def present_at(name: str, data_root: Path) -> Path | None:
    """Where ``name`` is already found (the data root or another known place), else None."""
    if name == GPT2_NAME:
        found = find_gpt2_files(data_root).found
        return found[0].parent if found is not None else None
    search = DATASETS[name].reader.locate(data_root)
    return search.found.where if search.found is not None else None


def source_url(url: str) -> str:
    """``url``, or the same path on ``$STRUCTBENCH_DATA_MIRROR`` when that is set."""
    mirror = os.environ.get(MIRROR_ENV, "").rstrip("/")
    return f"{mirror}{urlsplit(url).path}" if mirror else url


def fetch(plan: FetchPlan, data_root: Path, on_file: Callable[[RemoteFile], ProgressCallback]) -> None:
    """Download, verify and install every file of ``plan`` under ``data_root``.

    ``on_file`` is called as each file starts and returns the callback its progress goes to. Raises
    :class:`FetchError` on any failure; a partial download stays as ``<file>.part`` for the next try to resume.
    """
    data_root.mkdir(parents=True, exist_ok=True)
    for remote in plan.files:
        final = data_root / remote.destination
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.is_file() and file_digest(final, remote.algorithm) == remote.digest:
            continue
        part = final.with_name(final.name + PART_SUFFIX)
        download(source_url(remote.url), part, on_file(remote))
        verify(part, remote)
        os.replace(part, final)
    if plan.extract is not None:
        for remote in plan.files:
            unpack(data_root / remote.destination, data_root, plan.extract)


def download(url: str, part: Path, progress: ProgressCallback) -> None:
    """Download ``url`` into ``part``, continuing after its current size when the server honours Range (206).

    A server that answers 200 sends the whole file, which replaces the partial one; one that refuses the range (416)
    gets a fresh download.
    """
    offset = part.stat().st_size if part.exists() else 0
    try:
        response = _open(url, offset)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset > 0:
            part.unlink()
            download(url, part, progress)
            return
        raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, HTTPException, OSError) as exc:
        raise FetchError(f"cannot reach {url}: {_reason(exc)}") from None
    with response:
        _copy_body(response, part, offset if _resumes_at(response, offset) else 0, progress)


def _open(url: str, offset: int) -> HTTPResponse:
    """Open ``url``, asking for the bytes from ``offset`` on when it is positive."""
    headers = {"Range": f"bytes={offset}-"} if offset > 0 else {}
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)


def _resumes_at(response: HTTPResponse, offset: int) -> bool:
    """Whether the response continues at ``offset``: a 206 whose Content-Range starts there."""
    content_range = response.headers.get("Content-Range", "")
    return offset > 0 and response.status == 206 and content_range.startswith(f"bytes {offset}-")


def _reason(exc: BaseException) -> str:
    """The readable reason inside a urllib or socket error."""
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__


def _copy_body(response: HTTPResponse, part: Path, start: int, progress: ProgressCallback) -> None:
    """Write the response body into ``part`` from byte ``start`` (0 truncates), reporting progress."""
    length = response.headers.get("Content-Length")
    total = start + int(length) if length is not None and length.isdigit() else None
    written = start
    progress(written, total)
    try:
        with part.open("r+b" if start else "wb") as handle:
            handle.seek(start)
            while chunk := _read_chunk(response, part, written, total):
                handle.write(chunk)
                written += len(chunk)
                progress(written, total)
    except OSError as exc:
        raise FetchError(_write_failure(part, exc)) from None
    if total is not None and written < total:
        raise FetchError(_interrupted(part, written, total, "connection closed early"))


def _read_chunk(response: HTTPResponse, part: Path, written: int, total: int | None) -> bytes:
    """The next chunk of the body (empty at its end); a broken connection is a :class:`FetchError`."""
    try:
        return response.read(CHUNK_BYTES)
    except (HTTPException, OSError, ValueError) as exc:
        raise FetchError(_interrupted(part, written, total, _reason(exc))) from None


def _write_failure(part: Path, exc: OSError) -> str:
    """One line for a failed write: a full disk, or any other OS error on the file."""
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing {part}; free space and rerun the same command to resume"
    return f"cannot write {part}: {exc.strerror or exc}"


def _interrupted(part: Path, written: int, total: int | None, cause: str) -> str:
    """One line for a download cut short; the partial file is kept for the next try."""
    of_total = f" of {total}" if total is not None else ""
    return (
        f"download interrupted after {written}{of_total} bytes ({cause}); "
        f"the partial file {part} is kept: rerun the same command to resume"
    )


def file_digest(path: Path, algorithm: str) -> str:
    """Hex digest of the file at ``path`` with ``algorithm`` (md5 or sha256), read in chunks."""
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(part: Path, remote: RemoteFile) -> None:
    """Check ``part`` against the published digest; on a mismatch remove it and raise :class:`FetchError`."""
    actual = file_digest(part, remote.algorithm)
    if actual != remote.digest:
        part.unlink()
        raise FetchError(
            f"{remote.url}: {remote.algorithm} {actual} differs from the published {remote.digest}; "
            "the download was removed, nothing was installed"
        )


def unpack(archive: Path, data_root: Path, folder: str) -> None:
    """Extract ``folder`` from ``archive`` into ``data_root`` and remove the archive.

    Extraction goes to a temporary folder first (tarfile's ``data`` filter: no links out, no absolute paths), then
    the folder takes its final name at once. A folder of that name already there is left alone, as is the archive
    (which the reader accepts as is).
    """
    target = data_root / folder
    if target.exists():
        return
    staging = data_root / f".{folder}.extracting"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _extract(archive, staging)
        if not (staging / folder).is_dir():
            raise FetchError(f"{archive}: the archive holds no {folder}/ folder")
        os.replace(staging / folder, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink()


def _extract(archive: Path, staging: Path) -> None:
    """Extract every member of ``archive`` into ``staging`` with the ``data`` filter; failures are one line."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            tar.extractall(staging, filter="data")
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise FetchError(f"disk full while extracting {archive}; it is kept and is read as is") from None
        raise FetchError(f"cannot extract {archive}: {exc}") from None
    except (tarfile.TarError, EOFError) as exc:
        raise FetchError(f"cannot extract {archive}: {exc}") from None

