"""`structbench data fetch`, end to end and offline: a local HTTP server (with Range support) serves tiny files in
the real layouts under the official URLs' paths; ``$STRUCTBENCH_DATA_MIRROR`` points the fetch at it."""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from structbench.data import dataset_status, load, tokenizers
from structbench.data import fetch as data_fetch
from structbench.data.fetch import FETCHABLE, MIRROR_ENV, FetchPlan, RemoteFile
from tests.support.cli import invoke
from tests.support.datasets import write_cifar10


@dataclass
class FileServer:
    """What the local server serves (URL path -> bytes) and what it saw; ``cut_once`` paths are cut mid-file on
    their first request, ``ignore_range`` paths answer every request with the whole file (200)."""

    files: dict[str, bytes] = field(default_factory=dict)
    cut_once: set[str] = field(default_factory=set)
    ignore_range: set[str] = field(default_factory=set)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    base: str = ""


def _handler(state: FileServer) -> type[BaseHTTPRequestHandler]:
    """A request handler serving ``state.files`` with single-range support, recording each request."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            range_header = self.headers.get("Range")
            state.requests.append((self.path, range_header))
            body = state.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            start = _range_start(range_header) if self.path not in state.ignore_range else 0
            if start >= len(body) > 0:
                self.send_error(416)
                return
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            if self.path in state.cut_once:
                state.cut_once.discard(self.path)
                self.wfile.write(body[start : start + (len(body) - start) // 2])
                self.close_connection = True
                return
            self.wfile.write(body[start:])

        def log_message(self, *args: object) -> None:
            """Quiet: the test reads ``state.requests`` instead."""

    return Handler


def _range_start(header: str | None) -> int:
    """The first byte asked for by a ``bytes=N-`` Range header (0 without one)."""
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    return int(match.group(1)) if match else 0


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FileServer]:
    """A running local server; ``$STRUCTBENCH_DATA_MIRROR`` points at it for the test. A GPT-2 vocabulary in
    tiktoken's cache on this machine is hidden, so that only the test's data root counts."""
    monkeypatch.setattr(tokenizers, "tiktoken_cache_dirs", lambda: [])
    state = FileServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.base = f"http://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setenv(MIRROR_ENV, state.base)
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _serve(monkeypatch: pytest.MonkeyPatch, server: FileServer, name: str, bodies: dict[str, bytes]) -> FetchPlan:
    """Serve ``bodies`` (by destination) at the official URLs' paths of dataset ``name`` and pin their md5s."""
    plan = FETCHABLE[name]
    files = []
    for remote in plan.files:
        body = bodies[remote.destination]
        server.files[urlsplit(remote.url).path] = body
        digest = hashlib.new(remote.algorithm, body, usedforsecurity=False).hexdigest()
        files.append(replace(remote, digest=digest))
    pinned = replace(plan, files=tuple(files))
    monkeypatch.setitem(FETCHABLE, name, pinned)
    return pinned


def _tiny_cifar10_archive(tmp_path: Path) -> tuple[bytes, dict[str, tuple[np.ndarray, list[int]]]]:
    """cifar-10-python.tar.gz holding tiny python-version batches, and what they hold."""
    source = tmp_path / "source"
    written = write_cifar10(source, per_batch=2)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return buffer.getvalue(), written


def _idx_gz(shape: tuple[int, ...], seed: int) -> bytes:
    """A gzipped IDX file of uint8 values with ``shape`` (the MNIST layout)."""
    values = np.random.default_rng(seed).integers(0, 10 if len(shape) == 1 else 256, shape, dtype=np.uint8)
    header = bytes([0, 0, 0x08, len(shape)]) + b"".join(n.to_bytes(4, "big") for n in shape)
    return gzip.compress(header + values.tobytes(), mtime=0)


def _tiny_mnist(plan: FetchPlan) -> dict[str, bytes]:
    """The four MNIST files (3 train, 2 test images) by destination."""
    shapes = {"train-images": (3, 28, 28), "train-labels": (3,), "t10k-images": (2, 28, 28), "t10k-labels": (2,)}
    bodies = {}
    for seed, remote in enumerate(plan.files):
        stem = next(key for key in shapes if Path(remote.destination).name.startswith(key))
        bodies[remote.destination] = _idx_gz(shapes[stem], seed)
    return bodies


def _files_under(root: Path) -> set[str]:
    """Every file under ``root``, relative."""
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


def _error_line(stderr: str) -> str:
    """The one `error:` line stderr must consist of (apart from the progress bar's lines)."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_cifar10_fetch_extracts_the_layout_the_reader_reads_and_status_finds_it(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, written = _tiny_cifar10_archive(tmp_path)
    _serve(monkeypatch, server, "cifar10", {"cifar-10-python.tar.gz": archive})
    root = tmp_path / "data"

    result = invoke("data", "fetch", "cifar10", "--data-dir", root)

    assert result.exit_code == 0, result.stderr
    assert server.requests == [("/~kriz/cifar-10-python.tar.gz", None)]
    members = {f"cifar-10-batches-py/{name}" for name in (*written, "batches.meta")}
    assert _files_under(root) == members
    train, test, _ = load("cifar10", root, verify=False)
    assert np.array_equal(test.inputs.reshape(2, -1).numpy(), written["test_batch"][0])
    assert test.labels.tolist() == written["test_batch"][1]
    assert len(train.labels) == 10
    status = invoke("data", "status", "--data-dir", root)
    assert re.search(r"│ cifar10\s+│ yes\s+│ " + re.escape(str(root)[:20]), status.stdout), status.stdout
    rows = {row["name"]: row for row in dataset_status(root, verify=False)}
    assert rows["cifar10"]["where"] == root / "cifar-10-batches-py"

    again = invoke("data", "fetch", "cifar10", "--data-dir", root)
    assert again.exit_code == 0 and "already present" in again.stdout
    assert len(server.requests) == 1


def test_mnist_and_gpt2_files_land_under_their_final_names(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    mnist = _tiny_mnist(FETCHABLE["mnist"])
    _serve(monkeypatch, server, "mnist", mnist)
    gpt2 = {"gpt2/encoder.json": b'{"!": 0}', "gpt2/vocab.bpe": b"#version: 0.2\n"}
    _serve(monkeypatch, server, "gpt2", gpt2)
    root = tmp_path / "data"

    result = invoke("data", "fetch", "mnist", "gpt2", "--data-dir", root)

    assert result.exit_code == 0, result.stderr
    assert {name: (root / name).read_bytes() for name in _files_under(root)} == mnist | gpt2
    train, test, _ = load("mnist", root, verify=False)
    assert (len(train.labels), len(test.labels)) == (3, 2)


def test_a_wrong_checksum_installs_nothing_and_says_so_in_one_line(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = _tiny_cifar10_archive(tmp_path)
    plan = _serve(monkeypatch, server, "cifar10", {"cifar-10-python.tar.gz": archive})
    wrong = replace(plan.files[0], digest="0" * 32)
    monkeypatch.setitem(FETCHABLE, "cifar10", replace(plan, files=(wrong,)))
    root = tmp_path / "data"

    result = invoke("data", "fetch", "cifar10", "--data-dir", root)

    assert result.exit_code == 1
    line = _error_line(result.stderr)
    assert _md5(archive) in line and "0" * 32 in line and "removed" in line
    assert _files_under(root) == set()


def test_a_connection_cut_mid_file_keeps_the_part_and_a_rerun_resumes_from_it(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = _tiny_cifar10_archive(tmp_path)
    _serve(monkeypatch, server, "cifar10", {"cifar-10-python.tar.gz": archive})
    path = "/~kriz/cifar-10-python.tar.gz"
    server.cut_once.add(path)
    root = tmp_path / "data"

    cut = invoke("data", "fetch", "cifar10", "--data-dir", root)

    assert cut.exit_code == 1
    assert "rerun the same command to resume" in _error_line(cut.stderr)
    half = len(archive) // 2
    assert _files_under(root) == {"cifar-10-python.tar.gz.part"}
    assert (root / "cifar-10-python.tar.gz.part").read_bytes() == archive[:half]

    resumed = invoke("data", "fetch", "cifar10", "--data-dir", root)

    assert resumed.exit_code == 0, resumed.stderr
    assert server.requests == [(path, None), (path, f"bytes={half}-")]
    assert "cifar-10-batches-py/test_batch" in _files_under(root)
    assert not any(name.endswith(".part") for name in _files_under(root))


def test_a_server_ignoring_the_range_restarts_the_file_from_its_first_byte(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpt2 = {"gpt2/encoder.json": b'{"a": 0, "b": 1}', "gpt2/vocab.bpe": b"#version: 0.2\na b\n"}
    plan = _serve(monkeypatch, server, "gpt2", gpt2)
    server.ignore_range.update(urlsplit(remote.url).path for remote in plan.files)
    root = tmp_path / "data"
    (root / "gpt2").mkdir(parents=True)
    (root / "gpt2" / "encoder.json.part").write_bytes(b'{"a": 0, "b')

    result = invoke("data", "fetch", "gpt2", "--data-dir", root)

    assert result.exit_code == 0, result.stderr
    assert (root / "gpt2" / "encoder.json").read_bytes() == gpt2["gpt2/encoder.json"]
    assert server.requests[0][1] == "bytes=11-"


def test_a_404_is_one_line_and_leaves_nothing(tmp_path: Path, server: FileServer) -> None:
    root = tmp_path / "data"

    result = invoke("data", "fetch", "cifar100", "--data-dir", root)

    assert result.exit_code == 1
    line = _error_line(result.stderr)
    assert "HTTP 404" in line and "cifar-100-python.tar.gz" in line
    assert _files_under(root) == set()


def test_an_unreachable_source_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MIRROR_ENV, "http://127.0.0.1:9")
    root = tmp_path / "data"

    result = invoke("data", "fetch", "cifar100", "--data-dir", root)

    assert result.exit_code == 1
    assert _error_line(result.stderr).startswith("error: cifar100: cannot reach http://127.0.0.1:9/~kriz/")
    assert _files_under(root) == set()


def test_an_archive_with_a_member_escaping_the_root_is_refused(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    write_cifar10(source, per_batch=1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        payload = b"planted"
        member = tarfile.TarInfo("cifar-10-batches-py/../../escaped-marker")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    _serve(monkeypatch, server, "cifar10", {"cifar-10-python.tar.gz": buffer.getvalue()})
    root = tmp_path / "data"

    result = invoke("data", "fetch", "cifar10", "--data-dir", root)

    assert result.exit_code == 1
    assert "cannot extract" in _error_line(result.stderr)
    assert not list(tmp_path.rglob("escaped-marker"))
    assert not (root / "cifar-10-batches-py").exists()


def test_an_unknown_name_is_a_usage_error_with_a_suggestion(tmp_path: Path, server: FileServer) -> None:
    root = tmp_path / "data"

    result = invoke("data", "fetch", "cifar", "--data-dir", root)

    assert result.exit_code == 2
    assert "Did you mean 'cifar10'?" in _error_line(result.stderr)
    assert not root.exists() and server.requests == []


def test_status_names_the_fetch_command_for_a_missing_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # a narrow terminal: the path folds inside its cell, and is never cut
    result = invoke("data", "status", "--data-dir", tmp_path)

    assert result.exit_code == 0
    assert "…" not in result.stdout
    joined = re.sub(r"[\s│┃]", "", result.stdout)
    for name in ("cifar10", "cifar100", "mnist", "gpt2"):
        assert re.sub(r"\s", "", f"get it: structbench data fetch {name} --data-dir {tmp_path}") in joined


def test_every_fetchable_file_has_a_published_digest_of_its_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths = {"md5": 32, "sha256": 64}
    remotes: list[RemoteFile] = [remote for plan in FETCHABLE.values() for remote in plan.files]
    assert {plan for plan in FETCHABLE} == {"cifar10", "cifar100", "mnist", "fashion-mnist", "digits", "gpt2"}
    assert all(re.fullmatch(f"[0-9a-f]{{{lengths[r.algorithm]}}}", r.digest) for r in remotes)
    assert all(r.url.startswith("https://") for r in remotes)
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    assert data_fetch.source_url("https://example.org/a/b.gz") == "https://example.org/a/b.gz"
    monkeypatch.setenv(MIRROR_ENV, "http://mirror.test/base/")
    assert data_fetch.source_url("https://example.org/a/b.gz") == "http://mirror.test/base/a/b.gz"


def test_run_never_downloads_and_names_the_fetch_command(tmp_path: Path, server: FileServer) -> None:
    root, out = tmp_path / "data", tmp_path / "out"
    root.mkdir()

    result = invoke("run", "--suite", "cifar", "--optim", "adamw", "--data-dir", root, "--out", out)

    assert result.exit_code == 2
    assert f"`structbench data fetch cifar10 --data-dir {root}`" in _error_line(result.stderr)
    assert server.requests == [] and _files_under(root) == set() and not out.exists()


def test_the_gpt2_tokenizer_names_the_fetch_command(tmp_path: Path) -> None:
    from structbench.data.tokenizers import gpt2_tokenizer
    from structbench.errors import MissingDataError

    with pytest.raises(MissingDataError, match=re.escape(f"`structbench data fetch gpt2 --data-dir {tmp_path}`")):
        gpt2_tokenizer(tmp_path, "gpt2")


def test_a_rerun_after_a_failed_file_downloads_only_what_is_missing(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _serve(monkeypatch, server, "mnist", _tiny_mnist(FETCHABLE["mnist"]))
    paths = [urlsplit(remote.url).path for remote in plan.files]
    withheld = server.files.pop(paths[2])
    root = tmp_path / "data"

    failed = invoke("data", "fetch", "mnist", "--data-dir", root)
    server.files[paths[2]] = withheld
    completed = invoke("data", "fetch", "mnist", "--data-dir", root)

    assert failed.exit_code == 1 and "HTTP 404" in _error_line(failed.stderr)
    assert completed.exit_code == 0, completed.stderr
    assert [path for path, _ in server.requests] == [*paths[:3], *paths[2:]]


def test_a_part_the_server_cannot_continue_is_downloaded_again(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpt2 = {"gpt2/encoder.json": b'{"a": 0}', "gpt2/vocab.bpe": b"#version: 0.2\n"}
    _serve(monkeypatch, server, "gpt2", gpt2)
    root = tmp_path / "data"
    (root / "gpt2").mkdir(parents=True)
    (root / "gpt2" / "encoder.json.part").write_bytes(b"x" * len(gpt2["gpt2/encoder.json"]))

    result = invoke("data", "fetch", "gpt2", "--data-dir", root)

    assert result.exit_code == 0, result.stderr
    encoder = "/gpt-2/encodings/main/encoder.json"
    assert server.requests[:2] == [(encoder, "bytes=8-"), (encoder, None)]
    assert (root / "gpt2" / "encoder.json").read_bytes() == gpt2["gpt2/encoder.json"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to make a write fail with ENOSPC")
def test_a_full_disk_is_one_line_and_installs_nothing(
    tmp_path: Path, server: FileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve(monkeypatch, server, "digits", {"digits/digits.csv.gz": b"1,2,3\n" * 1000})
    monkeypatch.setattr(data_fetch, "present_at", lambda name, root: None)  # an installed scikit-learn has digits
    root = tmp_path / "data"
    (root / "digits").mkdir(parents=True)
    (root / "digits" / "digits.csv.gz.part").symlink_to("/dev/full")

    result = invoke("data", "fetch", "digits", "--data-dir", root)

    assert result.exit_code == 1
    assert "disk full while writing" in _error_line(result.stderr)
    assert not (root / "digits" / "digits.csv.gz").exists()


def test_a_data_dir_that_is_a_file_is_a_usage_error(tmp_path: Path, server: FileServer) -> None:
    not_a_folder = tmp_path / "data"
    not_a_folder.write_bytes(b"a file")

    result = invoke("data", "fetch", "mnist", "--data-dir", not_a_folder)

    assert result.exit_code == 2
    assert _error_line(result.stderr).startswith(f"error: cannot use {not_a_folder} as the data root")
    assert not_a_folder.read_bytes() == b"a file" and server.requests == []
