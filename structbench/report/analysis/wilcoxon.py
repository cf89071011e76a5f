"""The exact two-sided Wilcoxon signed-rank test of paired differences (Wilcoxon 1945).

Zero differences are dropped (Wilcoxon's own treatment; scipy's `zero_method="wilcox"`). The absolute values of the
m others are ranked 1..m, tied values sharing the mean of the ranks they span, and T+ is the sum of the ranks of the
positive differences. Under the null hypothesis (the differences are symmetric about 0) each difference is positive
or negative with probability 1/2, independently of its rank, so T+ is distributed as the sum of a uniformly random
subset of the m ranks. That distribution is computed exactly by dynamic programming over the ranks, on doubled ranks
(integers even when ties make half-integer ranks), so the test stays exact with ties. The two-sided p-value is
min(1, 2 min(P(T+ <= t), P(T+ >= t))) at the observed t; with no nonzero difference it is 1. An infinite difference
(one run reached a target and the other did not) ranks above every finite one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def doubled_ranks(values: np.ndarray) -> np.ndarray:
    """Twice the rank (1-based, ties sharing the mean of their ranks) of each value, as integers."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    doubled = np.empty(len(values), dtype=np.int64)
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and ordered[end + 1] == ordered[start]:
            end += 1
        doubled[order[start : end + 1]] = start + end + 2
        start = end + 1
    return doubled


def null_distribution(doubled: Sequence[int]) -> np.ndarray:
    """P(2 T+ = k) for k = 0 .. sum(doubled), each rank in the sum with probability 1/2 independently."""
    distribution = np.zeros(int(sum(doubled)) + 1)
    distribution[0] = 1.0
    reach = 0
    for rank in doubled:
        shifted = np.zeros_like(distribution)
        shifted[rank : rank + reach + 1] = distribution[: reach + 1]
        distribution = 0.5 * (distribution + shifted)
        reach += int(rank)
    return distribution


def signed_rank_p(differences: Sequence[float]) -> float:
    """The exact two-sided p-value of the signed-rank test of `differences` (module docstring); NaN values left out."""
    d = np.asarray([x for x in differences if not math.isnan(x)], dtype=float)
    d = d[d != 0]
    if not len(d):
        return 1.0
    doubled = doubled_ranks(np.abs(d))
    observed = int(doubled[d > 0].sum())
    distribution = null_distribution(doubled.tolist())
    lower = float(distribution[: observed + 1].sum())
    upper = float(distribution[observed:].sum())
    return min(1.0, 2.0 * min(lower, upper))
