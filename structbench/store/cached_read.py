"""Read selected columns of a directory of small Parquet files through the store index, a consolidated copy keyed
by file identity.

The store keeps one file per run, and opening a Parquet file costs about a millisecond whatever its size (the footer
is parsed), so a store of thousands of runs is slow to read file by file. The store therefore keeps one consolidated
copy of the columns its reader reads (structbench.store.read: the report and the exporters), its index
(structbench.store.write.index_dir):

    <out>/index/runs.arrow      the run columns, plus each row's source file and its identity
    <out>/index/curves.arrow    the same for the curve files

The index is derived data: `structbench run` brings it up to date once at the end of a grid (store.read's
`refresh_index`) and every read of the store does too; deleting it loses nothing (the next read rebuilds it). A file's
identity is its name, size, modification time (ns) and inode; the store replaces files by renaming a new file into
place, so any rewrite changes the identity. On each read, indexed rows whose file is still present with the same
identity are reused, every other file (new, rewritten, or written by a command that does not index, such as a
copy from another store) is read afresh, rows whose file is gone are dropped, and the index is rewritten
(atomically, in Arrow's IPC format as one record batch: it is memory-mapped, not decoded) when anything changed.
Files that cannot be read are never indexed, so they are reported on every read. The index is an optimisation
only: when it is unreadable, of another format or column set, or its directory is not writable, the files are
read directly and nothing else changes.

An index is never trusted as found: a few flipped bytes in an Arrow IPC file can crash Arrow's reader (even with a
segmentation fault), so each index file ends in a trailer, TRAILER_MAGIC and the SHA-256 of every byte before it,
which is checked before Arrow parses a byte; the table read is then validated in full (offsets, UTF-8) before any
of it is used. An index that fails either check is rebuilt from the files (`index_damage` says why, for `doctor`).

Its files are Arrow, not Parquet, in their own directory, so no reader of the store's datasets takes them for run
data. Names starting with "." or "_" in a dataset's directory are not store files (pyarrow skips them too; the
store's temporaries start with ".").

Reading the files themselves (no index: about 0.5 ms of CPU per run file, a little less per curve file, nearly all
of it in Arrow's C++ code, which releases the GIL) runs on one thread per core.

The report's own caches (its output and figures) stay in `<out>/.report-cache` (cache_dir.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from structbench.report.parallel import usable_cores
from structbench.store.atomic import replacing
from structbench.store.write import READ_ERRORS, Problem

INDEX_FORMAT = "2"
"""Format 2: an Arrow IPC file followed by the checksum trailer (module docstring); format 1 had no trailer."""
TRAILER_MAGIC = b"SBINDEX2"
TRAILER_SIZE = len(TRAILER_MAGIC) + hashlib.sha256().digest_size
_FILE, _ID = "_file", "_identity"
CHUNK = 250
"""Files read as one task; a store file takes about half a millisecond of CPU to read."""
Validate = Callable[[pa.Table], str | None]
"""A check of a file's rows: why they cannot be used (the file is then reported like an unreadable one), or None."""


def _identities(directory: Path) -> dict[str, str]:
    """name -> identity string of every candidate store file in `directory`."""
    found: dict[str, str] = {}
    if not directory.is_dir():
        return found
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith((".", "_")) or not entry.is_file():
                continue
            st = entry.stat()
            found[entry.name] = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
    return found


def _index_meta(schema: pa.Schema) -> dict[bytes, bytes]:
    return {b"structbench_store_index": INDEX_FORMAT.encode(), b"columns": ",".join(schema.names).encode()}


def _trailer(body: pa.Buffer) -> bytes:
    """The trailer an index file holding the Arrow IPC bytes `body` ends with."""
    return TRAILER_MAGIC + hashlib.sha256(memoryview(body)).digest()


def _checked_body(path: Path) -> tuple[pa.Buffer | None, str]:
    """The index file's Arrow IPC bytes (memory-mapped) when its trailer matches them, else None and why not."""
    with pa.memory_map(str(path)) as source:
        contents = source.read_buffer()
    if contents.size < TRAILER_SIZE:
        return None, "too short to hold its checksum"
    body = contents.slice(0, contents.size - TRAILER_SIZE)
    trailer = contents.slice(body.size).to_pybytes()
    if not trailer.startswith(TRAILER_MAGIC):
        return None, "not a structbench store index of this version"
    if trailer != _trailer(body):
        return None, "its checksum does not match its contents"
    return body, ""


def _parse_index(path: Path, schema: pa.Schema) -> tuple[pa.Table | None, str]:
    """The index file's table (the schema's columns, then the file name and identity) and "", or None and why it
    cannot be used. Arrow parses only bytes whose checksum matched, and the table is validated in full."""
    try:
        body, why = _checked_body(path)
        if body is None:
            return None, why
        table = pa.ipc.open_file(body).read_all()
        table.validate(full=True)
    except FileNotFoundError:
        return None, "missing"
    except READ_ERRORS as exc:
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    meta = table.schema.metadata or {}
    if any(meta.get(k) != v for k, v in _index_meta(schema).items()):
        return None, "of another format or column set"
    expected = schema.append(pa.field(_FILE, pa.string())).append(pa.field(_ID, pa.string()))
    if not table.schema.remove_metadata().equals(expected):
        return None, "of another column set"
    return table.replace_schema_metadata(None), ""


def _read_index(path: Path, schema: pa.Schema) -> pa.Table | None:
    return _parse_index(path, schema)[0]


def index_damage(path: Path, schema: pa.Schema) -> str | None:
    """Why the index file `path` (of a dataset with `schema`) would not be used and is to be rebuilt, or None when
    it is sound or absent (an absent index is simply built by the next read)."""
    if not path.exists():
        return None
    return _parse_index(path, schema)[1] or None


def _append_trailer(path: Path) -> None:
    """End the Arrow IPC file at `path` with the checksum trailer of its bytes."""
    with pa.memory_map(str(path)) as source:
        trailer = _trailer(source.read_buffer())
    with open(path, "ab") as handle:
        handle.write(trailer)


def _write_index(path: Path, table: pa.Table, schema: pa.Schema) -> None:
    try:
        path.parent.mkdir(exist_ok=True)
        with replacing(path) as tmp:
            with (
                pa.OSFile(str(tmp), "wb") as sink,
                pa.ipc.new_file(sink, table.schema.with_metadata(_index_meta(schema))) as w,
            ):
                w.write_table(table.replace_schema_metadata(_index_meta(schema)))
            _append_trailer(tmp)
    except OSError:
        return


def read_store_file(path: Path, schema: pa.Schema, required: Collection[str], validate: Validate | None) -> pa.Table:
    """The file's `schema` columns (absent optional ones as nulls), cast to their schema types, fully validated
    (`Table.validate(full=True)`: offsets and UTF-8 of text values, so that a flipped byte inside a text value is
    this file's error here and not a failure of a later conversion of every file's rows); ValueError when `validate`
    rejects them."""
    parquet = pq.ParquetFile(path)
    present = set(parquet.schema_arrow.names)
    missing = [name for name in required if name not in present]
    if missing:
        raise ValueError(f"not a structbench store file: lacks column(s) {', '.join(missing)}")
    table = parquet.read(columns=[name for name in schema.names if name in present], use_threads=False)
    if not table.schema.equals(schema):
        arrays = [
            table.column(f.name).cast(f.type) if f.name in present else pa.nulls(table.num_rows, f.type) for f in schema
        ]
        table = pa.Table.from_arrays(arrays, schema=schema)
    table.validate(full=True)
    reason = validate(table) if validate is not None else None
    if reason is not None:
        raise ValueError(reason)
    return table


def _read_chunk(
    directory: Path,
    schema: pa.Schema,
    required: Collection[str],
    validate: Validate | None,
    files: list[tuple[str, str]],
) -> tuple[pa.Table | None, list[Problem]]:
    """The readable files among `files` ((name, identity) pairs) as one table with each row's file name and
    identity, and the files that could not be read. The table is combined into one chunk here, so that the
    thread that read the files also frees their per-file tables."""
    tables: list[pa.Table] = []
    read: list[tuple[str, str]] = []
    problems: list[Problem] = []
    for name, identity in files:
        path = directory / name
        try:
            tables.append(read_store_file(path, schema, required, validate))
        except READ_ERRORS as exc:
            problems.append(Problem(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            continue
        read.append((name, identity))
    if not tables:
        return None, problems
    counts = [t.num_rows for t in tables]
    names, identities = (np.repeat(np.array(values, dtype=object), counts) for values in zip(*read, strict=True))
    table = pa.concat_tables(tables)
    table = table.append_column(_FILE, pa.array(names, pa.string())).append_column(
        _ID, pa.array(identities, pa.string())
    )
    return table.combine_chunks(), problems


def _read_files(
    directory: Path,
    schema: pa.Schema,
    required: Collection[str],
    validate: Validate | None,
    files: list[tuple[str, str]],
) -> tuple[list[pa.Table], list[Problem]]:
    """`_read_chunk` over `files` in contiguous chunks of CHUNK files, on one thread per core when there are more
    chunks than one (the Parquet reader releases the GIL while it reads)."""
    chunks = [files[start : start + CHUNK] for start in range(0, len(files), CHUNK)]
    read = functools.partial(_read_chunk, directory, schema, required, validate)
    threads = min(len(chunks), usable_cores())
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(read, chunks))
    else:
        parts = [read(chunk) for chunk in chunks]
    return [t for t, _ in parts if t is not None], [p for _, problems in parts for p in problems]


def _still_valid(indexed: pa.Table, identities: dict[str, str]) -> pa.Table:
    """The indexed rows whose file is still present with the identity it had when indexed."""
    pairs = indexed.select([_FILE, _ID]).group_by([_FILE, _ID]).aggregate([])
    names = [
        n for n, i in zip(*(pairs.column(c).to_pylist() for c in (_FILE, _ID)), strict=True) if identities.get(n) == i
    ]
    if len(names) == pairs.num_rows:
        return indexed
    return indexed.filter(pc.is_in(indexed.column(_FILE), value_set=pa.array(names, pa.string())))


def read_columns(
    directory: Path,
    schema: pa.Schema,
    required: Collection[str],
    index: Path,
    only: Collection[str] | None = None,
    validate: Validate | None = None,
) -> tuple[pa.Table, list[Problem]]:
    """Rows of every readable file in `directory` (or of the file names in `only`), `schema`'s columns, reusing the
    index file `index` where it is valid and bringing it up to date (module docstring).

    Returns the table (with the schema's columns only) and the files that could not be read or that `validate`
    rejects (those are never indexed, so they are reported on every read).
    """
    identities = _identities(directory)
    indexed = _read_index(index, schema)
    valid = _still_valid(indexed, identities) if indexed is not None else None
    have = set(valid.column(_FILE).unique().to_pylist()) if valid is not None else set()
    wanted = set(identities) if only is None else set(identities) & set(only)
    fresh, problems = _read_files(
        directory, schema, required, validate, [(n, identities[n]) for n in sorted(wanted - have)]
    )
    parts = ([valid] if valid is not None else []) + fresh
    if not parts:
        return schema.empty_table(), problems
    everything = pa.concat_tables(parts).combine_chunks()
    if fresh or (indexed is not None and valid is not None and valid.num_rows != indexed.num_rows):
        _write_index(index, everything, schema)
    if only is not None and len(wanted) < len(identities):
        names = pa.array(sorted(wanted), pa.string())
        everything = everything.filter(pc.is_in(everything.column(_FILE), value_set=names))
    return everything.select(schema.names), problems
