"""Tasks for tests: the image-classification and language-model tasks built directly on tiny local data, and the
quadratic task made to stop at a step as Ctrl-C would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from structbench import tasks
from structbench.tasks.base import TaskContext, TaskDef
from structbench.tasks.language.task import DEFAULTS as LANGUAGE_DEFAULTS
from structbench.tasks.language.task import LanguageModelTask
from structbench.tasks.quadratic import QuadraticTask
from structbench.tasks.vision.task import DEFAULTS as VISION_DEFAULTS
from structbench.tasks.vision.task import ImageClassificationTask


def register_task(
    monkeypatch: pytest.MonkeyPatch, name: str, build: Callable[..., Any], defaults: dict[str, Any] | None = None
) -> TaskDef:
    """`build` registered as task `name` while `monkeypatch` holds."""
    definition = TaskDef(name=name, summary="test", defaults=defaults or {}, build=build)
    monkeypatch.setitem(tasks.TASKS, definition.name, definition)
    return definition


class SeededBatches:
    """A test task whose batches come from its own generator `batch_gen`: its stream state is that generator's
    state (what checkpoints save and the warm-up restores)."""

    batch_gen: torch.Generator

    def stream_state(self) -> dict[str, Any]:
        return {"batch_gen": self.batch_gen.get_state()}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        self.batch_gen.set_state(state["batch_gen"])


def vision_task(root: Path, batch_size: int, seed: int = 0, **args: object) -> ImageClassificationTask:
    """The task on the tiny CIFAR files; without a validation split unless `val_fraction` is given."""
    full = {
        **VISION_DEFAULTS,
        "dataset": "cifar10",
        "model": "mlp",
        "model_options": {"hidden": 16},
        "val_fraction": 0.0,
    }
    full.update(args)
    ctx = TaskContext(seed=seed, device=torch.device("cpu"), data_root=root, batch_size=batch_size)
    return ImageClassificationTask(full, ctx)


def write_corpus(root: Path) -> Path:
    """A small directory corpus: ten documents of patterned English-like text."""
    corpus = root / "mini"
    corpus.mkdir(parents=True)
    rng = np.random.default_rng(0)
    words = ["the", "king", "shall", "speak", "and", "queen", "will", "go", "to", "war", "now"]
    for i in range(10):
        text = " ".join(words[j] for j in rng.integers(0, len(words), size=800))
        (corpus / f"doc{i:02d}.txt").write_text(text + "\n")
    return corpus


def language_task(tmp_path: Path, **overrides: object) -> LanguageModelTask:
    args = {**LANGUAGE_DEFAULTS, "corpus": str(write_corpus(tmp_path)), "seq_len": 32, "eval_tokens": 200, **overrides}
    ctx = TaskContext(seed=0, device=torch.device("cpu"), data_root=tmp_path, batch_size=4)
    return LanguageModelTask(args, ctx)


def interrupt_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """QuadraticTask.train_loss raises KeyboardInterrupt at `step` while `monkeypatch` holds."""
    original = QuadraticTask.train_loss

    def interrupting(self: QuadraticTask, index: int) -> torch.Tensor:
        if index == step:
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(QuadraticTask, "train_loss", interrupting)
