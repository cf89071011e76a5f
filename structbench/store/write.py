"""The Parquet results store (docs/results-schema.md): the only code that writes results.

    <out>/runs/<run_id>.parquet     one row per run
    <out>/curves/<run_id>.parquet   one row per logged point
    <out>/tables/<run_id>.parquet   a numerical experiment's result table (experiment suites only)
    <out>/claims/<claim_row_id>.parquet   one paper claim's verdict (`structbench claims`), one row per file

    <out>/checkpoints/<run_key>/    the latest checkpoint of a run in progress (structbench.execution.checkpoint)
    <out>/index/runs.arrow, curves.arrow   the store index: a derived copy of the run and curve columns, read by the
                                    report and the exporters (structbench.store.read), kept up to date by `run` and
                                    every read, safe to delete (structbench.store.cached_read)

Each file is written to a hidden temporary name in the same directory and renamed into place, so a
crash never leaves a half-written file where readers look (pyarrow ignores names starting with '.').
Curves are written before the run row: a run row implies its curve file exists. Writers hold a shared lock on
`<out>/.lock`; `clean` takes it exclusively, so it removes what a crash left (temporaries, a curve file whose row
never came, a checkpoint of a run since stored) and never a file another process is still writing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from structbench.errors import StoreWriteError, UsageError
from structbench.store import paths, run_claims

SCHEMA_VERSION = 1
READ_ERRORS = (pa.ArrowException, OSError, ValueError, KeyError)
"""What reading a damaged store file raises (a flipped byte in a Parquet footer can surface as a UnicodeDecodeError,
a ValueError): every reader of the store catches all of these."""
TEMPORARY_SUFFIX = ".tmp"
LOCK_FILE = ".lock"
INDEX_DIR = "index"
MANIFESTS = ".grids"
"""Where structbench.store.grids keeps each grid's manifest."""
STATUSES = ("ok", "diverged", "oom", "solver_error", "timeout", "error", "interrupted")
FINAL_STATUSES = frozenset({"ok", "diverged", "oom", "solver_error", "timeout"})
"""A run with a final status is never run again for the same run key; `error` and `interrupted` runs are."""

RUN_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("schema_version", pa.int32()),
        ("suite", pa.string()),
        ("task", pa.string()),
        ("optim", pa.string()),
        ("seed", pa.int64()),
        ("hparams", pa.string()),
        ("spec", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        ("steps", pa.int64()),
        ("wall_s", pa.float64()),
        ("train_s", pa.float64()),
        ("eval_s", pa.float64()),
        ("compile_s", pa.float64()),
        ("step_time_median_s", pa.float64()),
        ("optim_time_median_s", pa.float64()),
        ("peak_mem_bytes", pa.int64()),
        ("peak_mem_source", pa.string()),
        ("state_bytes", pa.int64()),
        ("param_count", pa.int64()),
        ("final_train_loss", pa.float64()),
        ("final_eval_loss", pa.float64()),
        ("final_eval_metric", pa.float64()),
        ("eval_metric_name", pa.string()),
        ("target_step", pa.int64()),
        ("target_s", pa.float64()),
        ("device", pa.string()),
        ("device_name", pa.string()),
        ("torch_version", pa.string()),
        ("structbench_version", pa.string()),
        ("git_commit", pa.string()),
        ("hostname", pa.string()),
        ("python_version", pa.string()),
        # Added beyond the contract's minimum (schema version 1):
        ("eval_metric_mode", pa.string()),
        ("initial_eval_loss", pa.float64()),
        ("initial_eval_metric", pa.float64()),
        ("nvml_mem_bytes", pa.int64()),
        ("solver_failures", pa.int64()),
        ("routing", pa.string()),
        ("data_source", pa.string()),
        ("analytic_state_bytes", pa.int64()),
        ("claims", pa.string()),
        ("throughput_per_s", pa.float64()),
        ("throughput_unit", pa.string()),
        ("run_key", pa.string()),
        ("executor", pa.string()),
        ("parallel_runs", pa.int64()),
        ("checkpoint_s", pa.float64()),
        ("resumed_from_step", pa.int64()),
        ("setup_s", pa.float64()),
        ("warmup_s", pa.float64()),
        ("device_usable", pa.bool_()),
        ("cuda_version", pa.string()),
        ("cudnn_version", pa.string()),
        ("nccl_version", pa.string()),
        ("tf32_matmul", pa.bool_()),
        ("tf32_cudnn", pa.bool_()),
        ("float32_matmul_precision", pa.string()),
        ("final_val_loss", pa.float64()),
        ("final_val_metric", pa.float64()),
        # One run as a torch.distributed job (structbench.execution.distributed): its world size and backend (None: one
        # process), each rank's peak memory and optimizer-state bytes (JSON lists in rank order; peak_mem_bytes and
        # state_bytes hold the largest rank's) and the state summed over ranks.
        ("world_size", pa.int64()),
        ("distributed_backend", pa.string()),
        ("peak_mem_bytes_per_rank", pa.string()),
        ("state_bytes_per_rank", pa.string()),
        ("state_bytes_total", pa.int64()),
        ("cuda_driver_version", pa.string()),
        ("gpu_name", pa.string()),
        ("gpu_count", pa.int64()),
        ("cpu_model", pa.string()),
        ("cpu_count", pa.int64()),
        ("cpu_usable", pa.int64()),
        ("torch_threads", pa.int64()),
        ("torch_interop_threads", pa.int64()),
        ("thread_env", pa.string()),
        ("numpy_version", pa.string()),
        ("pytorch_optimizer_version", pa.string()),
        ("tokenizers_version", pa.string()),
        ("torchvision_version", pa.string()),
        ("git_dirty", pa.bool_()),
        ("command", pa.string()),
        ("root_fallbacks", pa.int64()),
        ("checkpoint_discarded", pa.string()),
        # Contention (docs/results-schema.md): the machine's 1-minute load average at the run's start and end and the
        # process's CPU seconds over the run; with cpu_usable they say whether its timings shared the CPU.
        ("load_avg_start", pa.float64()),
        ("load_avg_end", pa.float64()),
        ("cpu_time_s", pa.float64()),
    ]
)
PROVENANCE_COLUMNS = (
    "gpu_name",
    "gpu_count",
    "cuda_version",
    "cudnn_version",
    "cuda_driver_version",
    "cpu_model",
    "cpu_count",
    "cpu_usable",
    "torch_threads",
    "torch_interop_threads",
    "thread_env",
    "numpy_version",
    "pytorch_optimizer_version",
    "tokenizers_version",
    "torchvision_version",
    "git_dirty",
)
"""The environment a run ran in beyond the contract's columns (device, versions, git commit, host): GPUs and the CUDA
stack, the CPU, thread settings, the versions of other packages that shape results, and uncommitted changes. The
run's `command` (the exact command line) completes its provenance."""
ENVIRONMENT_COLUMNS = (
    "device",
    "device_name",
    "torch_version",
    "structbench_version",
    "git_commit",
    "hostname",
    "python_version",
    *PROVENANCE_COLUMNS,
)
"""Every column that describes the environment a run ran in: the contract's, then PROVENANCE_COLUMNS."""

OPTIONAL_RUN_COLUMNS = frozenset(
    {
        "throughput_per_s",
        "throughput_unit",
        "run_key",
        "executor",
        "parallel_runs",
        "checkpoint_s",
        "resumed_from_step",
        "setup_s",
        "warmup_s",
        "device_usable",
        "cuda_version",
        "cudnn_version",
        "nccl_version",
        "tf32_matmul",
        "tf32_cudnn",
        "float32_matmul_precision",
        "final_val_loss",
        "final_val_metric",
        "world_size",
        "distributed_backend",
        "peak_mem_bytes_per_rank",
        "state_bytes_per_rank",
        "state_bytes_total",
        *PROVENANCE_COLUMNS,
        "command",
        "root_fallbacks",
        "checkpoint_discarded",
        "load_avg_start",
        "load_avg_end",
        "cpu_time_s",
    }
)
"""Columns added after the first stores were written: a row may omit them (stored as null)."""


KEY_COLUMNS = ("run_id", "run_key", "status", "suite", "optim", "seed")

CURVE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("wall_s", pa.float64()),
        ("split", pa.string()),
        ("loss", pa.float64()),
        ("metric", pa.float64()),
        ("lr", pa.float64()),
        ("step_time_s", pa.float64()),
        ("optim_time_s", pa.float64()),
        ("grad_norm", pa.float64()),
    ]
)


def runs_dir(out: Path) -> Path:
    return out / "runs"


def curves_dir(out: Path) -> Path:
    return out / "curves"


def index_dir(out: Path) -> Path:
    """The store index (structbench.store.cached_read): Arrow files, never read as store data."""
    return out / INDEX_DIR


def tables_dir(out: Path) -> Path:
    """Numerical experiments' result tables, one file per run (a third dataset beside runs and curves)."""
    return out / "tables"


def claims_dir(out: Path) -> Path:
    """Verdicts of papers' claims (`structbench claims`), one file per claim checked."""
    return out / "claims"


CLAIMS_SCHEMA = pa.schema(
    [
        ("claim_row_id", pa.string()),
        ("schema_version", pa.int32()),
        ("paper", pa.string()),
        ("claim_id", pa.string()),
        ("statement", pa.string()),
        ("source", pa.string()),
        ("paper_value", pa.string()),
        ("scale", pa.string()),
        ("seeds", pa.string()),
        ("numbers", pa.string()),
        ("summary", pa.string()),
        ("verdict", pa.string()),
        ("reason", pa.string()),
        ("budget", pa.string()),
        ("tuning", pa.string()),
        ("wall_s", pa.float64()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("device", pa.string()),
        ("structbench_version", pa.string()),
        ("git_commit", pa.string()),
    ]
)
"""A claim's row: `numbers` is a JSON object of the measured values by name; `verdict` one of
structbench.claims.base.VERDICTS."""


def write_claim(out: Path, row: Mapping[str, Any]) -> Path:
    """Store one claim's verdict as its own file, written to a temporary name and renamed into place under the
    writers' lock (a crash leaves the claims checked so far and at most a temporary that `clean` removes)."""
    missing = [f.name for f in CLAIMS_SCHEMA if f.name not in row]
    if missing:
        raise ValueError(f"claim row lacks columns: {missing}")
    table = pa.Table.from_pylist([{f.name: row[f.name] for f in CLAIMS_SCHEMA}], schema=CLAIMS_SCHEMA)
    path = claims_dir(out) / f"{row['claim_row_id']}.parquet"
    with writer_lock(out):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(table, path, _write_parquet)
        except OSError as exc:
            raise StoreWriteError(f"cannot write to the results store {out}: {exc.strerror or exc}") from exc
    return path


def load_claims(out: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """Every readable claim row and the claim files that could not be read."""
    frame, problems = _read_dir(claims_dir(out))
    if frame.empty:
        return pd.DataFrame(columns=CLAIMS_SCHEMA.names), problems
    return frame, problems


def prepare(out: Path) -> None:
    """Create the store's directories and prove they are writable, before any run starts: a path the user cannot
    write is a UsageError, any other OS error (a full disk) a StoreWriteError."""
    try:
        for directory in (runs_dir(out), curves_dir(out), tables_dir(out)):
            directory.mkdir(parents=True, exist_ok=True)
            probe = directory / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
            raise UsageError(f"results directory {out} is not writable: {exc.strerror or exc}.") from None
        raise StoreWriteError(f"cannot write to the results store {out}: {exc.strerror or exc}") from exc


def _write_atomic(table: pa.Table, path: Path, writer: Callable[[pa.Table, Path], None]) -> None:
    tmp = path.with_name(f".{path.name}{TEMPORARY_SUFFIX}")
    try:
        writer(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_parquet(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path)


def write_run(
    out: Path,
    row: Mapping[str, Any],
    curves: Sequence[Mapping[str, Any]],
    writer: Callable[[pa.Table, Path], None] = _write_parquet,
    table: pd.DataFrame | None = None,
) -> Path:
    """Store one run (its experiment table and curve file first, then its row); return the run file's path.

    An OS error (a full disk, a lost mount) removes whatever this call had put in place and raises StoreWriteError:
    the store holds the whole run or nothing of it, and the runs stored before are untouched.
    """
    missing = [f.name for f in RUN_SCHEMA if f.name not in row and f.name not in OPTIONAL_RUN_COLUMNS]
    if missing:
        raise ValueError(f"run row lacks contract columns: {missing}")
    if row["status"] not in STATUSES:
        raise ValueError(f"invalid status {row['status']!r}")
    run_id = row["run_id"]
    run_table = pa.Table.from_pylist([{f.name: row.get(f.name) for f in RUN_SCHEMA}], schema=RUN_SCHEMA)
    curve_table = pa.Table.from_pylist([dict(c, run_id=run_id) for c in curves], schema=CURVE_SCHEMA)
    parts: list[tuple[pa.Table, Path]] = []
    if table is not None:
        result = pa.Table.from_pandas(table.assign(run_id=run_id), preserve_index=False)
        parts.append((result, tables_dir(out) / f"{run_id}.parquet"))
    parts += [(curve_table, curves_dir(out) / f"{run_id}.parquet"), (run_table, runs_dir(out) / f"{run_id}.parquet")]
    if not paths.is_plain_name(run_id) or not all(paths.inside(out, path) for _, path in parts):
        raise ValueError(f"run id {run_id!r} does not name a file inside the results store {out}")
    written: list[Path] = []
    with writer_lock(out):
        try:
            for part, path in parts:
                _write_atomic(part, path, writer)
                written.append(path)
        except OSError as exc:
            for path in reversed(written):
                path.unlink(missing_ok=True)
            raise StoreWriteError(f"cannot write to the results store {out}: {exc.strerror or exc}") from exc
    return written[-1]


@contextmanager
def writer_lock(out: Path) -> Iterator[None]:
    """Held (shared) while a process writes into the store, so `clean` never removes a file still being written."""
    with _locked(out, fcntl.LOCK_SH):
        yield


@contextmanager
def _locked(out: Path, mode: int) -> Iterator[None]:
    try:
        handle = (out / LOCK_FILE).open("a")
    except OSError as exc:
        raise StoreWriteError(f"cannot write to the results store {out}: {exc.strerror or exc}") from exc
    with handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class Problem:
    path: Path
    reason: str


def unsupported_version(table: pa.Table) -> str | None:
    """Why rows of a run file cannot be read (their `schema_version` is missing or not SCHEMA_VERSION), or None."""
    versions = set(table.column("schema_version").to_pylist()) if "schema_version" in table.column_names else {None}
    if None in versions:
        return f"schema_version is missing (this structbench reads {SCHEMA_VERSION})"
    newer = sorted(v for v in versions if v > SCHEMA_VERSION)
    if newer:
        return newer_message(newer[-1])
    other = sorted(versions - {SCHEMA_VERSION})
    return f"schema_version {other[0]} is not supported (this structbench reads {SCHEMA_VERSION})" if other else None


def newer_message(version: int) -> str:
    """What is said of files a newer structbench wrote (left untouched: never quarantined, never removed)."""
    return f"written by a newer structbench (schema {version}): upgrade to read them"


class NewerSchema(ValueError):
    """A file written by a newer structbench: its schema_version is above SCHEMA_VERSION."""

    def __init__(self, version: int) -> None:
        super().__init__(newer_message(version))
        self.version = version


def _newest_version(table: pa.Table) -> int | None:
    """The highest schema_version above SCHEMA_VERSION among the rows of `table`, or None."""
    if "schema_version" not in table.column_names:
        return None
    newer = [v for v in table.column("schema_version").to_pylist() if v is not None and v > SCHEMA_VERSION]
    return max(newer) if newer else None


def _read_run_file(path: Path, columns: Sequence[str] | None) -> pa.Table:
    """A run file's rows (only `columns`, if given); NewerSchema when a newer structbench wrote it, ValueError when
    its schema version is otherwise not SCHEMA_VERSION."""
    parquet = pq.ParquetFile(path)
    versioned = "schema_version" in parquet.schema_arrow.names
    versions = parquet.read(columns=["schema_version"]) if versioned else pa.table({})
    newest = _newest_version(versions)
    if newest is not None:
        raise NewerSchema(newest)
    reason = unsupported_version(versions)
    if reason is not None:
        raise ValueError(reason)
    return parquet.read(columns=list(columns) if columns else None)


def _problem(path: Path, exc: Exception) -> Problem:
    return Problem(path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _read_dir(directory: Path) -> tuple[pd.DataFrame, list[Problem]]:
    """Every readable file's rows and the files that could not be read."""
    tables: list[pa.Table] = []
    problems: list[Problem] = []
    for path in _store_files(directory):
        try:
            tables.append(pq.read_table(path))
        except READ_ERRORS as exc:
            problems.append(_problem(path, exc))
    if not tables:
        return pd.DataFrame(), problems
    return pa.concat_tables(tables, promote_options="default").to_pandas(), problems


def run_keys(out: Path) -> pd.DataFrame:
    """run_id, run_key, status, suite, optim and seed of every readable run with a key, read in one projected scan.

    The run_id is the run file's own name (without `.parquet`), never the row's content: it names the files a forced
    rerun removes. Unreadable files are skipped here (the report lists them), and so are rows of another schema
    version than SCHEMA_VERSION (as the report skips them); a file from before run keys has none and is dropped.
    """
    frame = _key_table(out).to_pandas()
    kept = frame["run_key"].notna() & (frame["schema_version"] == SCHEMA_VERSION)
    return frame.loc[kept].assign(run_id=frame["file"])[list(KEY_COLUMNS)].reset_index(drop=True)


def newer_runs(out: Path) -> dict[int, int]:
    """How many run files a newer structbench wrote, by their schema version (read in the same scan as run_keys)."""
    frame = _key_table(out).to_pandas()
    newer = frame[frame["schema_version"] > SCHEMA_VERSION]
    return {int(version): len(rows) for version, rows in newer.groupby("schema_version")["file"].unique().items()}


_KEY_SCHEMA = pa.schema([RUN_SCHEMA.field(name) for name in (*KEY_COLUMNS, "schema_version")])


def _key_table(out: Path) -> pa.Table:
    """The key columns and schema_version of every readable run file, each row with its file's stem as `file`."""
    files = [str(p) for p in _store_files(runs_dir(out))]
    try:
        return _keyed_rows(files)
    except READ_ERRORS:
        readable = []
        for path in files:
            try:
                readable.append(_keyed_rows([path]))
            except READ_ERRORS:
                continue
        return pa.concat_tables(readable) if readable else _keyed_rows([])


def _keyed_rows(files: list[str]) -> pa.Table:
    """The _KEY_SCHEMA columns of `files` in one scan, each batch tagged with the stem of the file it came from."""
    parts = [_KEY_SCHEMA.append(pa.field("file", pa.string())).empty_table()]
    for tagged in ds.dataset(files, format="parquet", schema=_KEY_SCHEMA).scanner().scan_batches():
        batch = tagged.record_batch
        stem = Path(tagged.fragment.path).stem
        parts.append(pa.Table.from_batches([batch]).append_column("file", pa.array([stem] * batch.num_rows)))
    return pa.concat_tables(parts)


def _store_files(directory: Path) -> list[Path]:
    """The store's files in `directory`, by name (hidden temporaries and `_`-prefixed files left out). Listed with
    os.scandir, whose entries know their type without a stat, and sorted as names: at 5,000 runs a third of the
    time of sorting Path objects and asking each whether it is a file."""
    try:
        with os.scandir(directory) as entries:
            names = sorted(e.name for e in entries if e.is_file() and not e.name.startswith((".", "_")))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / name for name in names]


def run_ids(out: Path) -> set[str]:
    """The ids of every run row in the store (from the file names; nothing is read)."""
    return {p.stem for p in _store_files(runs_dir(out))}


def run_statuses(out: Path, ids: set[str]) -> list[str]:
    """The status of each of these stored runs."""
    return [
        pq.read_table(runs_dir(out) / f"{run_id}.parquet", columns=["status"])["status"][0].as_py()
        for run_id in sorted(ids)
    ]


def final_run_keys(out: Path) -> dict[str, str]:
    """run_key -> run_id of every run with a final status."""
    frame = run_keys(out)
    final = frame[frame["status"].isin(FINAL_STATUSES)]
    return dict(zip(final["run_key"], final["run_id"], strict=True))


def remove_runs(out: Path, run_ids: Sequence[str]) -> None:
    """Delete runs (row first, so no reader sees a row without its curves), e.g. a result a forced rerun replaced.

    Only files the store's own listing holds are removed, and only for ids of the run-id form (store.paths): an id
    read from a row's content (`../elsewhere/victim`) never names a file, inside the store or out of it."""
    for run_id in run_ids:
        if not paths.is_run_id(run_id):
            continue
        for directory in (runs_dir(out), curves_dir(out), tables_dir(out)):
            path = directory / f"{run_id}.parquet"
            if path in _store_files(directory) and paths.inside(out, path):
                path.unlink(missing_ok=True)


def checkpoints_dir(out: Path) -> Path:
    """Checkpoints of runs in progress, one directory per run key (see structbench.execution.checkpoint)."""
    return out / "checkpoints"


@dataclass
class Debris:
    """What a crash can leave in a store: temporaries, curve or table files without their run, checkpoints of
    runs that have since been stored with a final status, and run claims whose holder is gone
    (store.run_claims.stale_claims). After `clean`: what was removed, and in `failures` what could not be (a
    read-only store), each with why."""

    temporaries: list[Path] = field(default_factory=list)
    orphans: list[Path] = field(default_factory=list)
    stale_checkpoints: list[Path] = field(default_factory=list)
    stale_claims: list[Path] = field(default_factory=list)
    failures: list[Problem] = field(default_factory=list)

    def paths(self) -> list[Path]:
        return [*self.temporaries, *self.orphans, *self.stale_checkpoints, *self.stale_claims]

    def describe(self) -> str:
        parts = [
            (len(self.temporaries), "leftover temporary file", "leftover temporary files"),
            (len(self.orphans), "curve/table file without its run", "curve/table files without their runs"),
            (len(self.stale_checkpoints), "checkpoint of a run already stored", "checkpoints of runs already stored"),
            (len(self.stale_claims), "run claim of a process that is gone", "run claims of processes that are gone"),
        ]
        return ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in parts if n)

    def without(self, kept: set[Path]) -> Debris:
        """This debris less the paths in `kept` (and no failures)."""
        return Debris(
            [p for p in self.temporaries if p not in kept],
            [p for p in self.orphans if p not in kept],
            [p for p in self.stale_checkpoints if p not in kept],
            [p for p in self.stale_claims if p not in kept],
        )


def find_debris(out: Path) -> Debris:
    """The store's debris, each path found by listing the store's own directories and inside the store (a link that
    leaves it is never debris). Nothing a newer structbench wrote is debris: its curve and table files have their
    run file beside them, and its run files are never quarantined (unreadable_files)."""
    debris = Debris()
    for directory in (
        runs_dir(out),
        curves_dir(out),
        tables_dir(out),
        claims_dir(out),
        out / MANIFESTS,
        index_dir(out),
    ):
        if directory.is_dir():
            debris.temporaries += sorted(
                p for p in directory.iterdir() if p.name.startswith(".") and p.name.endswith(TEMPORARY_SUFFIX)
            )
    stored = run_ids(out)
    for directory in (curves_dir(out), tables_dir(out)):
        debris.orphans += [p for p in _store_files(directory) if p.stem not in stored]
    checkpoints = checkpoints_dir(out)
    if checkpoints.is_dir():
        final = final_run_keys(out)
        for directory in sorted(checkpoints.iterdir()):
            if directory.name in final:
                debris.stale_checkpoints.append(directory)
            elif directory.is_dir():
                debris.temporaries += sorted(p for p in directory.iterdir() if p.name.endswith(TEMPORARY_SUFFIX))
    debris.stale_claims = run_claims.stale_claims(out)
    outside = {p for p in debris.paths() if not paths.inside(out, p)}
    return debris.without(outside)


def clean(out: Path) -> Debris:
    """Remove the store's debris (waiting for writes in progress to finish first); return what was removed, with
    what could not be removed in `failures`."""
    with _locked(out, fcntl.LOCK_EX):
        debris = find_debris(out)
        claims = set(debris.stale_claims)
        failures = [problem for path in debris.paths() if path not in claims and (problem := _remove(path))]
        live, claim_failures = _remove_stale_claims(out, claims)
        failures += claim_failures
    removed = debris.without({problem.path for problem in failures} | live)
    removed.failures = failures
    return removed


def _remove_stale_claims(out: Path, found: set[Path]) -> tuple[set[Path], list[Problem]]:
    """Remove the stale claims under the claims' own lock, where each is judged again (one found stale may have been
    taken over since by a live run, and is kept). Returns the found claims kept as live, and the problems of those
    that could not be removed."""
    if not found:
        return set(), []
    try:
        removed = set(run_claims.remove_stale_claims(out))
    except (OSError, StoreWriteError) as exc:
        return set(), [Problem(path, str(exc)) for path in sorted(found)]
    return found - removed, []


def _remove(path: Path) -> Problem | None:
    """Remove a file or a directory tree; the problem when it (or part of it) could not be removed."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Problem(path, exc.strerror or str(exc))
    return None


QUARANTINE = ".quarantine"


@dataclass
class FileSurvey:
    """The store's files that cannot be read: `unreadable` (corrupt, or of an older or unknown schema version) and
    `newer` (written by a newer structbench: reported, never moved or removed)."""

    unreadable: list[Problem] = field(default_factory=list)
    newer: list[Problem] = field(default_factory=list)


def survey_files(out: Path) -> FileSurvey:
    """Read every run file's schema version and every curve and claim file's Parquet footer (module docstring of
    FileSurvey)."""
    survey = FileSurvey()
    for path in _store_files(runs_dir(out)):
        try:
            _read_run_file(path, ["run_id"])
        except NewerSchema as exc:
            survey.newer.append(_problem(path, exc))
        except READ_ERRORS as exc:
            survey.unreadable.append(_problem(path, exc))
    for path in _store_files(claims_dir(out)):
        try:
            newest = _newest_version(pq.read_table(path, columns=["schema_version"]))
        except READ_ERRORS as exc:
            survey.unreadable.append(_problem(path, exc))
            continue
        if newest is not None:
            survey.newer.append(_problem(path, NewerSchema(newest)))
    for path in _store_files(curves_dir(out)):
        try:
            pq.read_metadata(path)
        except READ_ERRORS as exc:
            survey.unreadable.append(_problem(path, exc))
    return survey


def unreadable_files(out: Path) -> list[Problem]:
    """Run files that do not read as Parquet or hold an older or unknown schema version, and curve and claim files
    that do not read as Parquet (never a file a newer structbench wrote: survey_files)."""
    return survey_files(out).unreadable


def quarantine(out: Path, files: Sequence[Path]) -> tuple[list[Path], list[Problem]]:
    """Move unreadable files aside to `<out>/.quarantine/<runs|curves|...>/` (kept for inspection, never read); return
    the files moved and those that could not be (a read-only store), each with why. A file outside the store is never
    moved."""
    moved: list[Path] = []
    failures: list[Problem] = []
    for path in files:
        destination = out / QUARANTINE / path.parent.name / path.name
        if not (paths.inside(out, path) and paths.inside(out, destination.parent)):
            failures.append(Problem(path, "outside the results store"))
            continue
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, destination)
        except OSError as exc:
            failures.append(Problem(path, exc.strerror or str(exc)))
            continue
        moved.append(path)
    return moved, failures


def stored_final(out: Path, run_key: str, name_part: str, replacing: Collection[str]) -> str | None:
    """The id of a run of `run_key` the store holds with a final status, other than the runs in `replacing` (a
    forced rerun's); None when there is none. Only run files whose name holds `name_part` (the run's
    `-<suite>-<optimizer>-s<seed>-`) are read: it is asked after every run claim (structbench.store.run_claims), and
    the store may hold thousands."""
    directory = runs_dir(out)
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.is_file())
    except OSError:
        return None
    for name in names:
        run_id = name.removesuffix(".parquet")
        if run_id == name or name_part not in run_id or run_id in replacing or not paths.is_run_id(run_id):
            continue
        try:
            rows = pq.read_table(directory / name, columns=["run_key", "status", "schema_version"]).to_pylist()
        except READ_ERRORS:
            continue
        for row in rows:
            final = row["status"] in FINAL_STATUSES and row["schema_version"] == SCHEMA_VERSION
            if row["run_key"] == run_key and final:
                return run_id
    return None
