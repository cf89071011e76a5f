"""Statistics over seeds: medians with percentile-bootstrap confidence intervals, and paired differences.

Definitions (the report's "how to read" section repeats them):

- Estimate of a quantity over seeds: the median of its per-seed values (numpy's median: the mean of the
  two middle values when n is even). Values may be +inf ("target not reached"); NaN values are left out.
- 95% CI: percentile bootstrap. `RESAMPLES` = 10,000 resamples of size n are drawn with replacement from
  the n values, with `numpy.random.default_rng(SEED)` drawing the index matrix `integers(0, n, (B, n))`
  (fixed seed: the same data always give the same interval). Each resample's median is taken, and the
  interval is [the 2.5th, the 97.5th] percentile of those B medians, taken as order statistics — the
  lower bound is sorted[floor(0.025 (B - 1))], the upper sorted[ceil(0.975 (B - 1))] (numpy's "lower" and
  "higher" quantile methods) — so the bounds are always observed medians, and stay defined when some of
  them are infinite. With n = 1 there is no interval: the value alone is shown.
- Paired difference of A against B: over the seeds both ran, d_seed = A_seed - B_seed (seeds where both
  are "not reached" carry no information and are left out); its median and bootstrap CI as above.
- Verdict: with at least `MIN_PAIRS` paired seeds and a CI that excludes 0, the direction of the
  difference in plain words ("faster" / "slower", "better" / "worse", ...); otherwise "no detectable
  difference at n=K". With three to five seeds the percentile bootstrap CI of a median spans the range of
  the differences, so the verdict then says "every paired seed went the same way".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

RESAMPLES = 10_000
SEED = 0
LEVEL = 0.95
MIN_PAIRS = 3


@dataclass(frozen=True)
class Estimate:
    """Median over n values with its bootstrap interval (lo, hi are None when n < 2)."""

    median: float
    lo: float | None
    hi: float | None
    n: int

    @property
    def has_ci(self) -> bool:
        return self.lo is not None


EMPTY = Estimate(math.nan, None, None, 0)


_TAIL = (1 - LEVEL) / 2
_LOWER = math.floor(_TAIL * (RESAMPLES - 1))
_UPPER = math.ceil((1 - _TAIL) * (RESAMPLES - 1))


@functools.lru_cache(maxsize=64)
def _middle_indices(n: int) -> tuple[np.ndarray, np.ndarray]:
    """For each resample of n indices, its two middle order statistics (equal when n is odd).

    The resample index matrix depends only on n and the fixed seed, so it is drawn once per n; sorting each
    row once lets a resample's median be read off the sorted data without sorting the data again.
    """
    rows = np.sort(np.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n)), axis=1)
    return rows[:, (n - 1) // 2], rows[:, n // 2]


@functools.lru_cache(maxsize=64)
def _odd_bounds(n: int) -> tuple[int, int]:
    """For odd n, the sorted-data positions of the CI bounds: each resample median is sorted_data[index], a
    non-decreasing map of the index, so the order statistics of the medians are those of the indices."""
    middle, _ = _middle_indices(n)
    ranked = np.sort(middle)
    return int(ranked[_LOWER]), int(ranked[_UPPER])


def median_ci(values: Iterable[float]) -> Estimate:
    """Median with a 95% percentile-bootstrap CI (module docstring); NaN values are ignored."""
    data = np.sort(np.asarray([v for v in values if not math.isnan(v)], dtype=float))
    n = len(data)
    if n == 0:
        return EMPTY
    median = float(data[(n - 1) // 2]) if n % 2 else float((data[n // 2 - 1] + data[n // 2]) / 2)
    if n == 1:
        return Estimate(median, None, None, 1)
    if n % 2:
        lo_at, hi_at = _odd_bounds(n)
        return Estimate(median, float(data[lo_at]), float(data[hi_at]), n)
    low, high = _middle_indices(n)
    medians = np.partition((data[low] + data[high]) / 2, (_LOWER, _UPPER))
    return Estimate(median, float(medians[_LOWER]), float(medians[_UPPER]), n)


@dataclass(frozen=True)
class Paired:
    """A paired comparison of A against B over matching seeds."""

    difference: Estimate
    seeds: tuple[int, ...]
    verdict: str


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], lower_word: str, higher_word: str) -> Paired:
    """Median paired difference A - B with its CI over the seeds both have, and a plain-words verdict.

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
    difference = median_ci(a[s] - b[s] for s in seeds)
    return Paired(difference, seeds, verdict(difference, lower_word, higher_word))


def verdict(difference: Estimate, lower_word: str, higher_word: str) -> str:
    """The direction when the CI of the difference excludes 0 and n >= MIN_PAIRS, else "no detectable ..."."""
    if difference.n >= MIN_PAIRS and difference.lo is not None and difference.hi is not None:
        if difference.hi < 0:
            return lower_word
        if difference.lo > 0:
            return higher_word
    return f"no detectable difference at n={difference.n}"
