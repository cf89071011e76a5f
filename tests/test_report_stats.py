"""Report statistics against independent computations: bootstrap CIs, interpolation, profiles, ranks, Pareto."""

from __future__ import annotations

import math
from math import comb

import numpy as np
import pytest

from structbench.report import stats
from structbench.report.plots import pareto_front
from structbench.report.profiles import TAU_MAX, performance_profile, rank_table
from structbench.report.targets import Target, interpolate


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(Binomial(n, p) >= k)."""
    return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def exact_bootstrap_median_quantiles(values: list[float], tail: float) -> tuple[float, float]:
    """Exact (infinite-resample) tail quantiles of the median of an n-resample, n odd, distinct values.

    The resample median is at most the j-th smallest value x_(j) exactly when at least (n + 1) / 2 of the n
    draws are among the j smallest values, each draw being so with probability j / n.
    """
    xs = sorted(values)
    n = len(xs)
    half = (n + 1) // 2
    cdf = [binomial_tail(n, j / n, half) for j in range(1, n + 1)]
    lower = next(j for j in range(n) if cdf[j] >= tail)
    upper = next(j for j in range(n) if cdf[j] >= 1 - tail)
    margins = [abs(c - t) for c in cdf for t in (tail, 1 - tail)]
    assert min(margins) > 0.01, "the Monte Carlo quantile could land either side: pick other n"
    return xs[lower], xs[upper]


def test_single_value_has_no_interval_and_empty_is_nan():
    assert stats.median_ci([3.5]) == stats.Estimate(3.5, None, None, 1)
    empty = stats.median_ci([])
    assert empty.n == 0 and math.isnan(empty.median)
    assert stats.median_ci([math.nan, 2.0]).n == 1


@pytest.mark.parametrize("values", [[1.0, 3.0], [5.0, 1.0, 3.0], [2.0, 4.0, 8.0, 16.0, 32.0]])
def test_small_samples_interval_spans_their_range(values):
    # With n <= 5 the resample median equals the smallest (largest) value with probability above 2.5%.
    for n in range(2, 6):
        # The median of an n-resample is the smallest value when more than half the draws are that value.
        assert binomial_tail(n, 1 / n, n // 2 + 1) > 0.025
    estimate = stats.median_ci(values)
    assert estimate.median == float(np.median(values))
    assert (estimate.lo, estimate.hi) == (min(values), max(values))


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution():
    values = [float(v) for v in (3, 1, 4, 15, 9, 2, 6, 35, 97, 23, 62)]
    lo, hi = exact_bootstrap_median_quantiles(values, 0.025)
    estimate = stats.median_ci(values)
    assert estimate.median == 9.0
    assert (lo, hi) == (3.0, 35.0)  # not the range: the interval is a real bootstrap interval at n = 11
    assert (estimate.lo, estimate.hi) == (lo, hi)
    assert stats.median_ci(values) == estimate  # fixed seed: the same data give the same interval


def test_infinite_values_keep_the_interval_defined():
    estimate = stats.median_ci([1.0, 2.0, math.inf])
    assert estimate.median == 2.0
    assert estimate.lo == 1.0 and estimate.hi == math.inf


def test_paired_verdicts():
    base = {0: 10.0, 1: 12.0, 2: 11.0, 3: 9.0}
    faster = stats.paired_difference({0: 8.0, 1: 9.5, 2: 9.0, 3: 8.5}, base, "faster", "slower")
    assert faster.seeds == (0, 1, 2, 3)
    assert faster.difference.median == float(np.median([-2.0, -2.5, -2.0, -0.5]))
    assert faster.verdict == "faster"
    slower = stats.paired_difference({s: v + 1 for s, v in base.items()}, base, "faster", "slower")
    assert slower.verdict == "slower"
    mixed = stats.paired_difference({0: 9.0, 1: 13.0, 2: 10.0, 3: 10.0}, base, "faster", "slower")
    assert mixed.verdict == "no detectable difference at n=4"
    two = stats.paired_difference({0: 1.0, 1: 1.0}, {0: 5.0, 1: 5.0, 2: 5.0}, "faster", "slower")
    assert two.verdict == "no detectable difference at n=2"  # below MIN_PAIRS even though both went one way


def test_pairs_where_neither_reached_are_left_out():
    a = {0: math.inf, 1: 5.0, 2: 4.0, 3: 3.0}
    b = {0: math.inf, 1: math.inf, 2: 6.0, 3: 7.0}
    paired = stats.paired_difference(a, b, "faster", "slower")
    assert paired.seeds == (1, 2, 3)
    assert paired.difference.median == -4.0
    assert paired.verdict == "faster"  # differences -inf, -2, -4 all below zero


def test_time_to_target_interpolates_between_the_bracketing_evaluations():
    steps = np.array([0, 10, 20, 30], float)
    seconds = np.array([0.0, 2.0, 4.5, 6.0])
    losses = np.array([1.0, 0.5, 0.1, 0.05])
    crossing = interpolate(steps, seconds, losses, Target("loss", 0.3, "min"))
    # Hand: first eval at or below 0.3 is step 20 (0.1); from 0.5 at step 10, fraction (0.5-0.3)/(0.5-0.1) = 0.5.
    assert crossing.steps == pytest.approx(15.0)
    assert crossing.seconds == pytest.approx(2.0 + 0.5 * 2.5)
    exact = interpolate(steps, seconds, losses, Target("loss", 0.5, "min"))
    assert (exact.steps, exact.seconds) == (10.0, 2.0)
    never = interpolate(steps, seconds, losses, Target("loss", 0.01, "min"))
    assert not never.reached and math.isinf(never.seconds)
    at_start = interpolate(steps, seconds, losses, Target("loss", 2.0, "min"))
    assert (at_start.steps, at_start.seconds) == (0.0, 0.0)


def test_time_to_target_for_a_maximised_metric_skips_non_finite_points():
    steps = np.array([0, 50, 100, 150], float)
    seconds = np.array([0.0, 1.0, 2.0, 3.0])
    accuracy = np.array([0.1, np.nan, 0.7, 0.95])
    crossing = interpolate(steps, seconds, accuracy, Target("accuracy", 0.9, "max"))
    # Brackets (100, 0.7) and (150, 0.95): fraction (0.7-0.9)/(0.7-0.95) = 0.8.
    assert crossing.steps == pytest.approx(140.0)
    assert crossing.seconds == pytest.approx(2.8)
    skip = interpolate(steps, seconds, accuracy, Target("accuracy", 0.5, "max"))
    # The NaN point is skipped: brackets (0, 0.1) and (100, 0.7), fraction 0.4/0.6.
    assert skip.steps == pytest.approx(100 * 0.4 / 0.6)


def test_performance_profile_fractions_and_score():
    times = {
        "a": {"x": 10.0, "y": 20.0, "z": math.inf},
        "b": {"x": 30.0, "y": 15.0, "z": 45.0},
        "c": {"x": 8.0, "y": 40.0},  # z did not run on c
        "d": {"x": math.inf, "y": math.inf, "z": math.inf},  # nobody reached
    }
    profile = performance_profile(times, ["x", "y", "z"])
    # Ratios by hand: a: x 1, y 2; b: x 2, y 1, z 3; c: x 1, y 5; d: none.
    expected = {"x": [1, 2, 1, math.inf], "y": [2, 1, 5, math.inf], "z": [math.inf, 3, math.inf, math.inf]}
    for optim, ratios in expected.items():
        assert profile.ratios[optim].tolist() == ratios
    rho = profile.rho([1.0, 1.5, 2.0, 3.0, 4.0])
    assert rho["x"].tolist() == [0.5, 0.5, 0.75, 0.75, 0.75]
    assert rho["y"].tolist() == [0.25, 0.25, 0.5, 0.5, 0.5]
    assert rho["z"].tolist() == [0.0, 0.0, 0.0, 0.25, 0.25]
    # Score: mean over suites of max(0, 4 - r) / 3, and it matches a fine Riemann sum of rho.
    score = profile.score()
    assert score["x"] == pytest.approx((3 + 2 + 3 + 0) / 4 / 3)
    assert score["z"] == pytest.approx((0 + 1 + 0 + 0) / 4 / 3)
    taus = np.linspace(1, TAU_MAX, 30001)
    riemann = profile.rho(taus)["y"].to_numpy().mean()
    assert score["y"] == pytest.approx(riemann, abs=1e-3)


def test_rank_table_average_ties_and_missing_last():
    metrics = {
        "s1": {"a": 0.1, "b": 0.1, "c": 0.3, "d": 0.2},
        "s2": {"a": 0.9, "b": 0.7, "c": 0.8},  # accuracy: higher is better; d missing
        "s3": {"a": 0.5},
    }
    ranks = rank_table(metrics, {"s1": "min", "s2": "max", "s3": "min"}, ["a", "b", "c", "d"])
    assert ranks.ranks.loc["s1"].tolist() == [1.5, 1.5, 4.0, 3.0]
    assert ranks.ranks.loc["s2"].tolist() == [1.0, 3.0, 2.0, 4.0]
    assert ranks.ranks.loc["s3"].tolist() == [1.0, 3.0, 3.0, 3.0]  # b, c, d tie for places 2-4
    assert ranks.mean["a"] == pytest.approx((1.5 + 1 + 1) / 3)
    assert not ranks.ranked.loc["s2", "d"]


def test_pareto_front():
    points = [(1.0, 0.5), (2.0, 0.3), (3.0, 0.3), (4.0, 0.1), (2.5, 0.6)]
    assert pareto_front(points, maximize=False) == [0, 1, 3]
    assert pareto_front([(1.0, 0.5), (2.0, 0.9), (3.0, 0.7)], maximize=True) == [0, 1]


@pytest.mark.parametrize("n", [2, 3, 4, 6, 7, 8])
def test_fast_bootstrap_equals_its_definition(n):
    """The documented procedure, written out naively: resample, take medians, take order-statistic quantiles."""
    data = np.random.default_rng(100 + n).lognormal(size=n)
    rows = np.random.default_rng(stats.SEED).integers(0, n, size=(stats.RESAMPLES, n))
    medians = np.median(data[rows], axis=1)
    expected = (
        float(np.quantile(medians, 0.025, method="lower")),
        float(np.quantile(medians, 0.975, method="higher")),
    )
    estimate = stats.median_ci(data.tolist())
    assert estimate.median == pytest.approx(float(np.median(data)), rel=1e-15)
    assert (estimate.lo, estimate.hi) == pytest.approx(expected, rel=1e-15)
