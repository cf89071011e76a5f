"""Curve points of many runs as numpy arrays, sliced per run: cheap per-run lookups for statistics and plots."""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ("step", "wall_s", "loss", "metric")


class CurveIndex:
    """One split's points ("train" or "eval") of every run in `curves`, in step order within each run."""

    def __init__(self, curves: pd.DataFrame, split: str) -> None:
        points = curves[curves["split"] == split].sort_values(["run_id", "step"], kind="stable")
        ids = points["run_id"].to_numpy(object)
        self._arrays = {c: points[c].to_numpy(float, na_value=np.nan) for c in COLUMNS}
        self._slices: dict[str, slice] = {}
        if len(ids):
            bounds = np.flatnonzero(ids[1:] != ids[:-1]) + 1
            starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [len(ids)]])
            self._slices = {ids[a]: slice(int(a), int(b)) for a, b in zip(starts, ends, strict=True)}

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._slices

    def get(self, run_id: str, column: str) -> np.ndarray:
        """The run's values of `column` (empty when the run has no points in this split)."""
        where = self._slices.get(run_id)
        return self._arrays[column][where] if where is not None else np.empty(0)
