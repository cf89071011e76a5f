"""Hand-built run rows and curves with a validation and a test split, written through the store for report tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from structbench.store import write as store
from tests.support.store import hand_row, hand_spec

T0 = datetime(2025, 6, 1, tzinfo=UTC)


class Point(NamedTuple):
    """One evaluation: step, cumulative training seconds, validation loss and metric, test loss and metric."""

    step: int
    wall_s: float
    val_loss: float
    val_metric: float
    test_loss: float
    test_metric: float


def write_run(
    out: Path,
    run_id: str,
    optim: str,
    seed: int,
    points: Sequence[Point],
    *,
    suite: str = "vision",
    task: str = "image-classification",
    status: str = "ok",
    hparams: dict | None = None,
    target: dict | None = None,
    hparams_source: str | None = "suite",
    validated: bool = True,
    **fields: object,
) -> None:
    """One run whose row and curves follow `points` (the last is the final evaluation); `fields` override the row.
    Without `validated` the run has no validation split (no val curve, no final_val_* values)."""
    hparams = hparams or {"lr": 0.1}
    spec = hand_spec(
        suite=suite, task=task, steps=points[-1].step, target=target, optim=optim, hparams=hparams, seed=seed
    )
    if hparams_source is not None:
        spec["hparams_source"] = hparams_source
    last = points[-1]
    ok = status == "ok"
    row = hand_row(
        run_id=run_id,
        suite=suite,
        task=task,
        optim=optim,
        seed=seed,
        hparams=json.dumps(hparams),
        spec=json.dumps(spec),
        status=status,
        error=None if ok else f"{status}: at the end",
        started_at=T0 + timedelta(minutes=seed),
        steps=last.step,
        wall_s=last.wall_s,
        peak_mem_source="cuda",
        final_train_loss=last.test_loss,
        final_val_loss=last.val_loss if ok and validated else None,
        final_val_metric=last.val_metric if ok and validated else None,
        final_eval_loss=last.test_loss if ok else None,
        final_eval_metric=last.test_metric if ok else None,
        device="cuda",
        device_name="test gpu",
    )
    row.update(fields)
    curves = []
    for p in points:
        splits = [("eval", p.test_loss, p.test_metric)] + ([("val", p.val_loss, p.val_metric)] if validated else [])
        curves += [
            {"step": p.step, "wall_s": p.wall_s, "split": split, "loss": loss, "metric": metric}
            for split, loss, metric in splits
        ]
        if p.step:
            curves.append({"step": p.step, "wall_s": p.wall_s, "split": "train", "loss": p.test_loss, "metric": None})
    for point in curves:
        point.update(lr=None, step_time_s=None, optim_time_s=None)
    store.write_run(out, row, curves)


def final(step: int, val_metric: float, test_metric: float, wall_s: float = 1.0) -> list[Point]:
    """Two evaluations: before training (accuracy 0.1) and a final one with the given accuracies."""
    return [
        Point(0, 0.0, 2.3, 0.1, 2.3, 0.1),
        Point(step, wall_s, 1 - val_metric, val_metric, 1 - test_metric, test_metric),
    ]
