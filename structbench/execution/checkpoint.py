"""Checkpoints of a run in progress, so that a rerun of the same run key continues where it stopped.

Every `budget.checkpoint_every` optimizer steps the runner saves, under `<out>/checkpoints/<run key>/`, one file
holding the model, optimizer and scheduler state dicts, the random number generators (Python's, torch's CPU and
CUDA ones), the task's data stream (its generators, epoch order and position) and the run's measurements and curves
so far. It is written to a temporary name and renamed into place (the previous checkpoint is replaced only by a
complete one) while holding the store's writer lock. A rerun of the key loads it and continues the training loop
from the step after it; on CPU the resumed run ends bit-identical to an uninterrupted one. The directory is removed
once the run is stored with a final status.

A checkpoint is a pickle written by structbench (`torch.load(weights_only=False)`): load only stores you trust.
"""

from __future__ import annotations

import io
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from structbench.store import write as store

FILE = "checkpoint.pt"
FORMAT = 2
"""Format 2: optimizer param groups hold the declared hyperparameter names (beta1 and beta2 rather than a betas tuple;
Shampoo's sgd_* and adamw_*). A checkpoint of another format is not loaded: its run starts again from step 0."""


def directory(out: Path, run_key: str) -> Path:
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
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **payload}, buffer)
    target = directory(out, run_key)
    path = target / FILE
    tmp = target / f".{FILE}{store.TEMPORARY_SUFFIX}"
    with store.writer_lock(out):
        target.mkdir(parents=True, exist_ok=True)
        try:
            with tmp.open("wb") as handle:
                handle.write(buffer.getbuffer())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def load(out: Path, run_key: str) -> dict[str, Any] | None:
    """The key's checkpoint, or None when there is none. Raises ValueError for a file that does not load."""
    path = directory(out, run_key) / FILE
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"checkpoint {path} does not load ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} is not a structbench checkpoint of format {FORMAT}")
    return payload


def remove(out: Path, run_key: str) -> None:
    with store.writer_lock(out):
        shutil.rmtree(directory(out, run_key), ignore_errors=True)
