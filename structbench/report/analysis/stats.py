"""Statistics over seeds that match the seed count: medians with a range or a bootstrap interval, paired tests.

Definitions (the report's "how to read" section repeats them):

- Estimate of a quantity over seeds: the median of its per-seed values (numpy's median: the mean of the two middle
  values when n is even). Values may be +inf ("target not reached"); NaN values are left out.
- Its interval depends on n. With fewer than MIN_SEEDS values it is the smallest and the largest value, shown as
  "min–max": with so few seeds no interval has the coverage a confidence interval claims. From MIN_SEEDS values it is
  the 95% percentile bootstrap interval: RESAMPLES = 10,000 resamples of size n drawn with replacement, by
  `numpy.random.default_rng(SEED).integers(0, n, (B, n))` (fixed seed: the same data always give the same interval);
  each resample's median; and the 2.5th and 97.5th percentiles of those B medians, each interpolated linearly
  between the order statistics at position p (B - 1) (numpy's default "linear" quantile). The resamples index the
  values in ascending order, so the interval is exactly `scipy.stats.bootstrap((sorted(x),), numpy.median,
  method="percentile", n_resamples=B, rng=default_rng(SEED))`, computed without B sorts (a resample's median is
  read off its sorted indices). Where the two bracketing medians are equal the bound is that value, so it stays
  defined when they are infinite.
- Paired difference of A against B: over the seeds both ran, d_seed = A_seed - B_seed (seeds where both are "not
  reached" carry no information and are left out); its median and interval as above.
- Verdict: with fewer than MIN_SEEDS pairs, "too few seeds (n=K; need 5)". From MIN_SEEDS pairs, the exact
  two-sided Wilcoxon signed-rank test of the differences (wilcoxon.py) and the bootstrap interval: the direction in
  plain words ("faster" / "slower", "better" / "worse", ...) when p < ALPHA and the interval excludes 0 (an interval
  that touches 0 does not), otherwise "no detectable difference (n=K)". With 5 pairs the smallest two-sided p is
  2/32 = 0.0625, so a direction needs 6 pairs that all go one way, or more pairs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from structbench.report.analysis.wilcoxon import signed_rank_p

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
MIN_SEEDS = 5
"""Below this many seeds an interval is the min-max and a paired comparison gives no verdict."""
ALPHA = 0.05
MIN_BEST_SEEDS = 3
"""A table marks a row's number best in its column only from this many seeds."""


@dataclass(frozen=True)
class Estimate:
    """Median over n values with its interval: min–max below MIN_SEEDS values, else the bootstrap CI (lo and hi are
    None when n < 2)."""

    median: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def kind(self) -> str:
        """ "ci" (bootstrap), "range" (min–max) or "" (no interval)."""
        if self.lo is None:
            return ""
        return "ci" if self.n >= MIN_SEEDS else "range"


EMPTY = Estimate(math.nan, None, None, 0)

_TAIL = (1 - LEVEL) / 2
_POSITIONS = (_TAIL * (RESAMPLES - 1), (1 - _TAIL) * (RESAMPLES - 1))


@functools.lru_cache(maxsize=64)
def _middle_indices(n: int) -> tuple[np.ndarray, np.ndarray]:
    """For each resample of n indices, its two middle order statistics (equal when n is odd).

    The resample index matrix depends only on n and the fixed seed, so it is drawn once per n; sorting each
    row once lets a resample's median be read off the sorted data without sorting the data again.
    """
    rows = np.sort(np.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n)), axis=1)
    return rows[:, (n - 1) // 2], rows[:, n // 2]


def _order_positions() -> list[int]:
    return sorted({k for p in _POSITIONS for k in (math.floor(p), min(math.floor(p) + 1, RESAMPLES - 1))})


@functools.lru_cache(maxsize=64)
def _odd_ranks(n: int) -> dict[int, int]:
    """For odd n, the sorted-data position of each order statistic the bounds need: a resample median is
    sorted_data[index], a non-decreasing map of the index, so the medians' order statistics are the indices'."""
    middle, _ = _middle_indices(n)
    ranked = np.sort(middle)
    return {k: int(ranked[k]) for k in _order_positions()}


def _lerp(low: float, high: float, fraction: float) -> float:
    """numpy's linear interpolation between two order statistics; equal (or infinite) ones give themselves."""
    if fraction == 0 or low == high:
        return low
    if math.isinf(low) or math.isinf(high):
        return high if math.isinf(high) else low
    return low + fraction * (high - low)


def _bounds(order_statistic: dict[int, float]) -> tuple[float, float]:
    bounds = []
    for position in _POSITIONS:
        k = math.floor(position)
        upper = order_statistic[min(k + 1, RESAMPLES - 1)]
        bounds.append(_lerp(order_statistic[k], upper, position - k))
    return bounds[0], bounds[1]


def bootstrap_interval(data: np.ndarray) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of sorted `data` (module docstring)."""
    n = len(data)
    if n % 2:
        return _bounds({k: float(data[at]) for k, at in _odd_ranks(n).items()})
    low, high = _middle_indices(n)
    positions = _order_positions()
    medians = np.partition((data[low] + data[high]) / 2, positions)
    return _bounds({k: float(medians[k]) for k in positions})


def sorted_median(data: np.ndarray) -> float:
    """The median of sorted `data` (NaN when empty): what np.median gives, without its overhead on a few values."""
    n = len(data)
    if n == 0:
        return math.nan
    return float(data[(n - 1) // 2]) if n % 2 else float((data[n // 2 - 1] + data[n // 2]) / 2)


def median_ci(values: Iterable[float]) -> Estimate:
    """Median with its interval (module docstring); NaN values are ignored."""
    data = np.sort(np.asarray([v for v in values if not math.isnan(v)], dtype=float))
    n = len(data)
    if n == 0:
        return EMPTY
    median = sorted_median(data)
    if n == 1:
        return Estimate(median, None, None, 1)
    if n < MIN_SEEDS:
        return Estimate(median, float(data[0]), float(data[-1]), n)
    lo, hi = bootstrap_interval(data)
    return Estimate(median, lo, hi, n)


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A against B over matching seeds."""

    difference: Estimate
    seeds: tuple[int, ...]
    verdict: str
    p_value: float | None
    """The exact Wilcoxon signed-rank p-value; None below MIN_SEEDS pairs."""

    @property
    def directional(self) -> bool:
        return not self.verdict.startswith(("no detectable", "too few"))


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], lower_word: str, higher_word: str) -> Paired:
    """Median paired difference A - B with its interval over the seeds both have, the test and a plain verdict.

    `lower_word` names what a difference below 0 means (e.g. "faster" for seconds to target), and
    `higher_word` a difference above 0. The verdict rule is the module docstring's.
    """
    seeds = tuple(
        sorted(
            s
            for s in set(a) & set(b)
            if not (math.isnan(a[s]) or math.isnan(b[s])) and not (math.isinf(a[s]) and math.isinf(b[s]))
        )
    )
    differences = [a[s] - b[s] for s in seeds]
    difference = median_ci(differences)
    p_value = signed_rank_p(differences) if len(seeds) >= MIN_SEEDS else None
    return Paired(difference, seeds, verdict(difference, p_value, lower_word, higher_word), p_value)


def verdict(difference: Estimate, p_value: float | None, lower_word: str, higher_word: str) -> str:
    """The direction when n >= MIN_SEEDS, p < ALPHA and the interval excludes 0; else why there is none."""
    if difference.n < MIN_SEEDS or p_value is None:
        return f"too few seeds (n={difference.n}; need {MIN_SEEDS})"
    if p_value < ALPHA and difference.lo is not None and difference.hi is not None:
        if difference.hi < 0:
            return lower_word
        if difference.lo > 0:
            return higher_word
    return f"no detectable difference (n={difference.n})"
