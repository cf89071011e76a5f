"""The output of the last reports, kept beside the store, so that asking again for a report of an unchanged store
prints it without reading the store or computing anything (nor importing pandas).

    <out>/.report-cache/output/<key>.json    {"term": the terminal text or null, "warnings": [line, ...],
                                              "written": [path, ...], "files": [[path, identity], ...]}

The key is a SHA-256 over everything the output depends on:
- every store's contents: the path and identity (size, modification time in ns, inode) of every file under it, except
  the report cache itself, the store index (`<out>/index`: derived from the run and curve files, which are counted)
  and the report directories (`<out>/report` and the `--to` directory). The store writes a
  file under a temporary name and renames it into place, so any new, removed or rewritten file changes the key; the
  warnings about a store's debris (leftover temporaries, orphaned files, stale checkpoints) are a function of the
  same files, so they are kept with the output;
- the request: the stores as given, the options, the formats and where md/html go;
- how the terminal text was rendered: the console's width, colour system and whether it is a terminal;
- the code: the sources of the report package, the store module, the command line, structbench.inert and the built-in
  suite files, and the versions of structbench and the libraries that format or draw (rich, pandas, pyarrow, numpy,
  matplotlib).

A file the report wrote (report.md and its PNGs, report.html) is recorded with its identity right after writing; an
entry is used only when each is still there with that identity, so a report deleted or edited since is written
again. Reports that found unreadable files are not kept (their warnings come from reading). The header's "Generated"
time of a kept report is when it was computed. Only the newest KEEP entries are kept; an unreadable entry or an
unwritable directory only means nothing is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from structbench.report.cache_dir import CACHE_DIR
from structbench.store.atomic import write_text_atomic

KEEP = 8
STORE_INDEX_DIR = "index"
"""store.INDEX_DIR, spelled here because the store module loads pandas, which a cache hit must not."""
FORMAT = "1"
LIBRARIES = ("structbench", "rich", "pandas", "pyarrow", "numpy", "matplotlib")
_PACKAGE = Path(__file__).resolve().parent.parent
_SOURCES = (
    *sorted((_PACKAGE / "report").rglob("*.py")),
    *sorted((_PACKAGE / "store").glob("*.py")),
    *sorted((_PACKAGE / "cli").glob("*.py")),
    _PACKAGE / "inert.py",
    *sorted((_PACKAGE / "suites").glob("*.toml")),
)


@dataclass(frozen=True)
class Output:
    term: str | None
    """The terminal text as the console wrote it (None when the terminal format was not asked for)."""
    warnings: list[str]
    """The lines printed on stderr about the stores' debris."""
    written: list[Path]
    """The md/html reports written, in the order they were announced."""
    files: list[Path]
    """Every file written (the reports and the Markdown report's PNGs)."""


def identity(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _tree(root: Path, skip: set[Path]) -> Iterable[str]:
    """`relative path identity` of every file under `root`, outside the directories in `skip`. Paths are handled as
    strings (os.scandir's entries join their directory's path and their name): Path objects for the 10,000 files of a
    5,000-run store cost more than the stat calls."""
    start = str(root)
    skipped = {str(path) for path in skip}
    stack = [start]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.path not in skipped:
                    stack.append(entry.path)
            elif entry.is_file():
                st = entry.stat()
                yield f"{entry.path[len(start) + 1 :]} {st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _code() -> str:
    digest = hashlib.sha256(FORMAT.encode())
    for source in _SOURCES:
        digest.update(f"{source.name}\n".encode())
        digest.update(source.read_bytes())
    for library in LIBRARIES:
        try:
            digest.update(f"{library} {metadata.version(library)}\n".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{library} -\n".encode())
    return digest.hexdigest()


def key(stores: Sequence[Path], target: Path, request: Mapping[str, object]) -> str:
    """The key of the report `request` asks for, over `stores`, with md/html written to `target`."""
    digest = hashlib.sha256(_code().encode())
    digest.update(json.dumps({k: request[k] for k in sorted(request)}, default=str).encode())
    digest.update(f"target {target.resolve()}\n".encode())
    for out in stores:
        root = out.resolve()
        skip = {root / CACHE_DIR, root / STORE_INDEX_DIR, root / "report", target.resolve()}
        digest.update(f"store {out} {root}\n".encode())
        for line in sorted(_tree(root, skip)):
            digest.update(line.encode())
            digest.update(b"\n")
    return digest.hexdigest()[:40]


def _root(out: Path) -> Path:
    return out / CACHE_DIR / "output"


def load(out: Path, entry_key: str) -> Output | None:
    """The kept output for this key, when every file it wrote is still as written; else None."""
    try:
        entry = json.loads((_root(out) / f"{entry_key}.json").read_text(encoding="utf-8"))
        files = [(Path(path), kept) for path, kept in entry["files"]]
        if any(identity(path) != kept for path, kept in files):
            return None
        term = entry["term"]
        if term is not None and not isinstance(term, str):
            return None
        warnings = [str(line) for line in entry["warnings"]]
        return Output(term, warnings, [Path(path) for path in entry["written"]], [path for path, _ in files])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(out: Path, entry_key: str, output: Output) -> None:
    """Keep `output` under the key (written atomically); the files it lists are recorded as they are now."""
    root = _root(out)
    try:
        entry = {
            "term": output.term,
            "warnings": output.warnings,
            "written": [str(path) for path in output.written],
            "files": [[str(path), identity(path)] for path in output.files],
        }
        root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(root / f"{entry_key}.json", json.dumps(entry))
        kept = sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        return
