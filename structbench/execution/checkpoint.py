"""Checkpoints of a run in progress, so that a rerun of the same run key continues where it stopped.

Every `budget.checkpoint_every` optimizer steps the runner saves, under `<out>/checkpoints/<run key>/`, one file
holding the model, optimizer and scheduler state dicts, the random number generators (Python's, torch's CPU and
CUDA ones), the task's data stream (its generators, epoch order and position) and the run's measurements and curves
so far. It is written to a temporary name of its own (`store.atomic`: the writer's pid and a random suffix, so two
writers never share one) and renamed into place (the previous checkpoint is replaced only by a complete one) while
holding the store's writer lock. A rerun of the key loads it and continues the training loop from the step after it;
on CPU the resumed run ends bit-identical to an uninterrupted one. The directory is removed once the run is stored
with a final status.

A checkpoint holds tensors and plain data only (dicts, lists, tuples, strings, numbers, None): every state the
payload saves is one of those (a generator's state is a uint8 tensor, Python's `random.getstate()` a tuple of ints).
It is read with `torch.load(weights_only=True)`, whose unpickler builds nothing else and calls no global outside
torch's tensor allow-list, so a file planted in a shared store cannot run code; no type is added to that list. It is
read only for a run that asked for checkpointing, and only from the directory of the run's own key (a run key of the
form `store.paths.RUN_KEY`, inside the store). A file that does not load (truncated, tampered, written by another
format, or naming a global the allow-list refuses) raises `Unusable`; the runner reports it and the run starts over
from step 0, replacing the file with its own next checkpoint.
"""

from __future__ import annotations

import random
import shutil
import warnings
from io import BytesIO
from pathlib import Path
from typing import Any

import torch

from structbench.errors import StoreWriteError
from structbench.store import atomic, paths
from structbench.store import write as store

FILE = "checkpoint.pt"
FORMAT = 2
"""Format 2: optimizer param groups hold the declared hyperparameter names (beta1 and beta2 rather than a betas tuple;
Shampoo's sgd_* and adamw_*). A checkpoint of another format is not loaded: its run starts again from step 0."""
PAYLOAD_KEYS = frozenset({"format", "step", "model", "optimizer", "scheduler", "rng", "stream", "state", "initial"})
"""What a checkpoint's payload holds (structbench.execution.loop.checkpoint_saver writes it)."""


class Unusable(ValueError):
    """A checkpoint that cannot be resumed from; its message names the file and says why."""


def directory(out: Path, run_key: str) -> Path:
    """The key's checkpoint directory; a ValueError for anything but a run key (no path can be smuggled in)."""
    if not paths.is_run_key(run_key):
        raise ValueError(f"not a run key: {run_key!r}")
    return store.checkpoints_dir(out) / run_key


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def save(out: Path, run_key: str, payload: dict[str, Any]) -> None:
    """Write `payload` as the key's checkpoint, atomically (the previous one stays until the new one is complete)."""
    buffer = BytesIO()
    torch.save({"format": FORMAT, **payload}, buffer)
    target = directory(out, run_key)
    with store.writer_lock(out):
        target.mkdir(parents=True, exist_ok=True)
        if not paths.inside(out, target / FILE):
            raise StoreWriteError(f"checkpoint directory {target} leads out of the results store {out}")
        atomic.write_bytes_atomic(target / FILE, buffer.getvalue())


def load(out: Path, run_key: str) -> dict[str, Any] | None:
    """The key's checkpoint, or None when there is none; `Unusable` for a file that does not load (module
    docstring)."""
    path = directory(out, run_key) / FILE
    if not path.is_file():
        return None
    if not paths.inside(out, path):
        raise Unusable(f"checkpoint {path} leads out of the results store {out}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on an unexpected pickle protocol: the error says enough
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise Unusable(f"checkpoint {path} does not load ({type(exc).__name__}: {_reason(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise Unusable(f"checkpoint {path} is not a structbench checkpoint of format {FORMAT}")
    if set(payload) != PAYLOAD_KEYS:
        raise Unusable(f"checkpoint {path} does not hold what a checkpoint holds ({sorted(PAYLOAD_KEYS)})")
    return payload


def _reason(exc: Exception) -> str:
    """The line of a load error that says what is wrong with the file (torch's weights-only error opens with advice
    to load the file unsafely, and ends with a pointer to its documentation: neither is kept)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation"))]
    return (telling or lines or [""])[0]


def remove(out: Path, run_key: str) -> None:
    """Remove the key's checkpoint directory (never through a link that leaves the store)."""
    target = directory(out, run_key)
    with store.writer_lock(out):
        if paths.inside(out, target):
            shutil.rmtree(target, ignore_errors=True)
