"""What damage a store's readers can meet, found the way they meet it, for `structbench doctor`; and the one line a
reader prints for a file it skips.

The readers (store.read for the report and the exporters, store.grids for `status`, store.write.load_claims for the
claims section) skip a file they cannot read and warn about it; `damage` reads every file the same way, with the
readers' own functions, so that doctor finds whatever a reader would skip: a damaged store index (rebuilt by the
next read, but reported), a manifest that is not what `run` writes, and run, curve and claim files that do not
read in full. Files of another schema version than this structbench's are left to store.write's survey (a newer
structbench's files are never damage), and so are curve files of such runs.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from structbench.store import grids
from structbench.store import write as store
from structbench.store.cached_read import Validate, index_damage, read_store_file
from structbench.store.read import REQUIRED_CURVE_COLUMNS, REQUIRED_RUN_COLUMNS, readable_runs
from structbench.store.write import Problem

NEWER_WORDS = "written by a newer structbench"
"""How store.write's reason for a newer structbench's file begins: such a file is skipped, never repaired."""


def repair_hint(out: Path) -> str:
    """The remedy a reader names for a file it cannot read."""
    return f"`structbench doctor --out {out} --repair` moves it to {out / store.QUARANTINE}"


def skipped_line(problem: Problem) -> str:
    """The one line a reader prints for a store file it skipped: the file, why, and what to do about it. Every file
    a reader reads sits one directory below its store (runs/, curves/, claims/, .grids/, index/)."""
    if problem.reason.startswith(NEWER_WORDS):
        return f"warning: skipped {problem.path}: {problem.reason}"
    hint = repair_hint(problem.path.parent.parent)
    return f"warning: skipped unreadable file {problem.path}: {problem.reason}; {hint}"


def damage(out: Path) -> list[Problem]:
    """Every damaged file a reader of `out` would skip or rebuild (module docstring), in a stable order."""
    return [*_index_damage(out), *grids.read_manifests(out)[1], *_file_damage(out)]


def damage_beyond(out: Path, known: list[Problem]) -> list[Problem]:
    """The damage in `out` (`damage`) at paths that `known` (store.write's survey, say) does not name already."""
    named = {problem.path for problem in known}
    return [problem for problem in damage(out) if problem.path not in named]


def _index_damage(out: Path) -> list[Problem]:
    """The store index files that a read would not trust (and would rebuild)."""
    problems = []
    for name, schema in (("runs.arrow", store.RUN_SCHEMA), ("curves.arrow", store.CURVE_SCHEMA)):
        path = store.index_dir(out) / name
        reason = index_damage(path, schema)
        if reason is not None:
            problems.append(Problem(path, f"damaged store index ({reason}); the next read rebuilds it"))
    return problems


def _file_damage(out: Path) -> list[Problem]:
    """Run, curve and claim files that do not read in full as the readers read them."""
    problems: list[Problem] = []
    other_versions: set[str] = set()
    for path in _listed(store.runs_dir(out)):
        if _of_another_version(path):
            other_versions.add(path.stem)
            continue
        problems += _unreadable(path, store.RUN_SCHEMA, REQUIRED_RUN_COLUMNS, readable_runs)
    for path in _listed(store.curves_dir(out)):
        if path.stem not in other_versions:
            problems += _unreadable(path, store.CURVE_SCHEMA, REQUIRED_CURVE_COLUMNS)
    for path in _listed(store.claims_dir(out)):
        try:
            pq.read_table(path)
        except store.READ_ERRORS as exc:
            problems.append(Problem(path, _first_line(exc)))
    return problems


def _listed(directory: Path) -> list[Path]:
    """The store's files in `directory` as its readers list them (no hidden temporaries)."""
    try:
        return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _of_another_version(path: Path) -> bool:
    """Whether a run file reads, with a schema_version other than this structbench's (store.write's survey reports
    those)."""
    try:
        table = pq.read_table(path, columns=["schema_version"])
    except store.READ_ERRORS:
        return False
    return set(table.column("schema_version").to_pylist()) - {store.SCHEMA_VERSION} != set()


def _unreadable(
    path: Path, schema: pa.Schema, required: tuple[str, ...], validate: Validate | None = None
) -> list[Problem]:
    """[the problem] when the reader cannot read `path` in full (or `validate` rejects what it reads), else []."""
    try:
        read_store_file(path, schema, required, validate)
    except store.READ_ERRORS as exc:
        return [Problem(path, _first_line(exc))]
    return []


def _first_line(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__
