"""Tasks for tests: the image-classification and language-model tasks built directly on tiny local data, and the
quadratic task made to stop at a step as Ctrl-C would."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from structbench.tasks.base import TaskContext
from structbench.tasks.language.task import DEFAULTS as LANGUAGE_DEFAULTS
from structbench.tasks.language.task import LanguageModelTask
from structbench.tasks.quadratic import QuadraticTask
from structbench.tasks.vision.task import DEFAULTS as VISION_DEFAULTS
from structbench.tasks.vision.task import ImageClassificationTask


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
