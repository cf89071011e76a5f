"""Claims of run keys: one structbench at a time runs a key of a store (issue 38, item 5).

Two commands on one store with overlapping grids would otherwise both run the keys they share. Before a run starts,
the process that trains it (the command itself with the inline executor, a local worker, a Slurm job) claims its
key: it creates `<out>/.running/<run_key>.json` (`os.open` with O_CREAT | O_EXCL) holding who runs it: that process
(pid, start time, host, pid namespace) and the command that planned the run (pid, host, a random id). Claims are
taken, taken over and released while holding the claims' lock (`<out>/.running/.lock`, an exclusive `flock`, as the
store's writer lock), so deciding that a claim is stale and replacing it is one step for every structbench. The
claim is released (removed) once the run has been stored, or when the process leaves the run any other way; while
held, a thread touches the file every HEARTBEAT_S seconds.

A claim is stale when its holder is gone:

- on this machine (the same host name and pid namespace): its pid is not alive, or is now another process (a
  different start time, as a reused pid has);
- on another machine: its file has not been touched for STALE_AFTER_S seconds (its holder stopped its heartbeat;
  a run on another host that is merely long keeps its claim live);
- unreadable (its writer died while writing it).

A stale claim is taken over; a live one means the key is left to its holder (`Held`). `stale_claims` lists the
stale claims of a store (doctor's debris) and `remove_stale_claims` removes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

from structbench.errors import StoreWriteError
from structbench.store import paths

CLAIMS_DIR = ".running"
LOCK_FILE = ".lock"
HEARTBEAT_S = 30.0
"""How often a holder touches its claim."""
STALE_AFTER_S = 600.0
"""A claim from another machine that has not been touched for this long is stale (twenty missed heartbeats: NFS
attribute caching and clock differences between machines stay far below it)."""
SAME_PROCESS_START_S = 1.0
"""Start times of one process read twice differ by less than this; a reused pid's process started later."""


def claims_dir(out: Path) -> Path:
    """The store's claims of keys being run, one file per key."""
    return out / CLAIMS_DIR


@dataclass(frozen=True)
class Commander:
    """The command that planned a run (its pid and host are what another command's summary names)."""

    pid: int
    host: str
    id: str

    @classmethod
    def this_process(cls) -> Commander:
        return _this_command()


@cache
def _this_command() -> Commander:
    return Commander(os.getpid(), socket.gethostname(), uuid.uuid4().hex)


@dataclass(frozen=True)
class Holder:
    """What a claim file holds: the process running the key, and the command that planned it."""

    pid: int
    started: float
    """The process's start time (seconds since the epoch), which a reused pid does not share."""
    host: str
    pid_space: str
    """This machine's boot and pid namespace: pids compare only within one."""
    command_pid: int
    command_host: str
    command_id: str
    claimed_at: str

    @classmethod
    def this_process(cls, commander: Commander) -> Holder:
        return cls(
            pid=os.getpid(),
            started=_start_time(os.getpid()) or 0.0,
            host=socket.gethostname(),
            pid_space=_pid_space(),
            command_pid=commander.pid,
            command_host=commander.host,
            command_id=commander.id,
            claimed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def describe(self) -> str:
        """The command holding the key, as a summary names it."""
        return f"pid {self.command_pid} host {self.command_host}"

    def is_stale(self, touched: float) -> bool:
        """Whether the holder is gone (module docstring); `touched` is its file's modification time."""
        if self.host == socket.gethostname() and self.pid_space == _pid_space():
            return not _alive(self.pid, self.started)
        return time.time() - touched > STALE_AFTER_S


def _start_time(pid: int) -> float | None:
    """When process `pid` started, or None when it is gone or a zombie; a process this user may not inspect is
    reported as started at 0.0 (alive, start unknown)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return 0.0


def _alive(pid: int, started: float) -> bool:
    """Whether process `pid` is alive and is the one that started at `started`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    now_started = _start_time(pid)
    if now_started is None:
        return False
    return now_started == 0.0 or abs(now_started - started) < SAME_PROCESS_START_S


@cache
def _pid_space() -> str:
    """This boot of this machine and this process's pid namespace (Linux; empty elsewhere)."""
    parts = []
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts)


class Claim:
    """A claim this process holds: touched every HEARTBEAT_S seconds until released (also on leaving a `with`)."""

    def __init__(self, out: Path, path: Path, holder: Holder) -> None:
        self.out, self.path, self.holder = out, path, holder
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name=f"claim {path.stem}", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        """Stop the heartbeat and remove the claim, if it is still this one (it is never someone else's)."""
        self._stop.set()
        self._heartbeat.join()
        with contextlib.suppress(OSError, StoreWriteError), _locked(self.out):
            if _read(self.path) == self.holder:
                self.path.unlink()

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class Held:
    """The key is claimed by another live process."""

    holder: Holder


def claim(out: Path, run_key: str, commander: Commander) -> Claim | Held:
    """Claim `run_key` in the store `out` for this process (module docstring): the held claim, or who holds it.
    A StoreWriteError when the claim cannot be written."""
    if not paths.is_run_key(run_key):
        raise ValueError(f"not a run key: {run_key!r}")
    path = claims_dir(out) / f"{run_key}.json"
    holder = Holder.this_process(commander)
    try:
        with _locked(out):
            current = _read(path)
            if current is not None and not current.is_stale(_touched(path)):
                return Held(current)
            path.unlink(missing_ok=True)
            _create(path, holder)
    except OSError as exc:
        raise StoreWriteError(f"cannot claim run key {run_key} in {out}: {exc.strerror or exc}") from exc
    return Claim(out, path, holder)


def stale_claims(out: Path) -> list[Path]:
    """The store's claims whose holder is gone (module docstring), for doctor to list as debris."""
    directory = claims_dir(out)
    if not directory.is_dir():
        return []
    claims = sorted(p for p in directory.iterdir() if p.suffix == ".json" and paths.is_run_key(p.stem))
    return [path for path in claims if _is_stale_file(path)]


def remove_stale_claims(out: Path) -> list[Path]:
    """Remove the store's stale claims (under the claims' lock, so none is taken over meanwhile); the removed."""
    removed = []
    with _locked(out):
        for path in stale_claims(out):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _is_stale_file(path: Path) -> bool:
    holder = _read(path)
    return holder is None or holder.is_stale(_touched(path))


def _touched(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


_FIELD_TYPES = {"pid": int, "started": (int, float), "command_pid": int}
"""Holder fields that are numbers; the others are strings."""


def _read(path: Path) -> Holder | None:
    """The claim's holder; None for no claim or one that does not read as a claim (a writer died writing it).
    Fields a newer structbench may have added are ignored."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    values = {name: data.get(name) for name in Holder.__dataclass_fields__}
    for name, value in values.items():
        kind = _FIELD_TYPES.get(name, str)
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
    return Holder(**values)


def _create(path: Path, holder: Holder) -> None:
    """Write the claim, failing if any file is there (O_EXCL), and flush it to disk."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(asdict(holder), handle)
        handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    """The claims' lock (exclusive); the claims' directory is made, and must stay inside the store."""
    directory = claims_dir(out)
    directory.mkdir(parents=True, exist_ok=True)
    if not paths.inside(out, directory / LOCK_FILE):
        raise StoreWriteError(f"{directory} leads out of the results store {out}")
    with (directory / LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
