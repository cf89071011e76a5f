"""Report statistics against independent computations: scipy as the oracle of the bootstrap interval and of the
exact Wilcoxon signed-rank test, hand-derived verdicts, interpolation, profiles, ranks, Pareto."""

from __future__ import annotations

import math
from math import comb

import numpy as np
import pytest
import scipy.stats

from structbench.report.analysis import stats, wilcoxon
from structbench.report.analysis.profiles import TAU_MAX, performance_profile, rank_table
from structbench.report.analysis.targets import Target, interpolate
from structbench.report.figures.plots import pareto_front

U = 2.0**-53  # float64 unit roundoff
POSITIONS = tuple(q * (stats.RESAMPLES - 1) for q in ((1 - stats.LEVEL) / 2, 1 - (1 - stats.LEVEL) / 2))


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of n float64 roundings of nonnegative quantities."""
    return n * U / (1 - n * U)


def assert_interval(estimate: stats.Estimate, reference: tuple[float, float], data, quantile_gap: float = 0.0):
    """The bootstrap bounds against a reference computed from the same resample medians by numpy's linear quantile.
    Both interpolate between the same two order statistics lo_k <= hi_k at position p (B - 1): ours rounds that
    position once, numpy's virtual index (q from a percentile / 100, n q + (1 - q) - 1) about 6 times, each within
    u (position + 1); a position off by d moves the bound by d (hi_k - lo_k) <= d * spread of the data; either
    interpolation formula (lo + t (hi - lo), or numpy's hi - (1 - t)(hi - lo)) adds 3 u spread + 2 u |bound|;
    `quantile_gap` is a difference of the quantiles themselves, times B - 1. An interpolation at p B, between other
    order statistics or of another quantile moves a bound by a fraction of a gap between resample medians, ~1e-3
    here against tolerances of ~1e-12."""
    spread = float(np.max(data) - np.min(data))
    for ours, theirs, position in zip((estimate.lo, estimate.hi), reference, POSITIONS, strict=True):
        offset = 7 * U * (position + 1) + quantile_gap * (stats.RESAMPLES - 1)
        tolerance = offset * spread + U * (3 * spread + 2 * abs(theirs))
        assert ours == pytest.approx(theirs, rel=0, abs=tolerance)


def p_value_tolerance(m: int) -> float:
    """Relative agreement of two exact signed-rank p-values computed in float64 over m nonzero differences: each
    null probability is built by <= 2 m halvings and additions of nonnegative terms, a tail adds <= m (m + 1) + 1
    of them (doubled ranks), and 2 min(...) is exact: gamma_{2m + m(m+1) + 2} on each side (a float64 rounding
    bound over a few hundred operations; ours is in fact exact, every probability a multiple of 2^-m). A wrong
    tail, one-sided p or an off-by-one rank is off by >= 2^-m relative."""
    return 2 * gamma(2 * m + m * (m + 1) + 2)


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
    # Statistical: B = 10,000 resamples estimate a cdf value c within 0.01 of the tail (c <= 0.035 or >= 0.965)
    # to sd sqrt(c (1 - c) / B) <= 0.0019; a margin of 0.01 is >= 5 sd, so the resampled quantile falls on the
    # same order statistic as the exact one.
    assert min(margins) > 0.01, "the Monte Carlo quantile could land either side: pick other n"
    return xs[lower], xs[upper]


def test_single_value_has_no_interval_and_empty_is_nan():
    assert stats.median_ci([3.5]) == stats.Estimate(3.5, None, None, 1)
    empty = stats.median_ci([])
    assert empty.n == 0 and math.isnan(empty.median)
    assert stats.median_ci([math.nan, 2.0]).n == 1


@pytest.mark.parametrize("values", [[1.0, 3.0], [5.0, 1.0, 3.0], [2.0, 4.0, 8.0, 16.0]])
def test_fewer_than_five_seeds_give_the_min_max_labelled_as_such(values):
    estimate = stats.median_ci(values)
    assert estimate.median == float(np.median(values))
    assert (estimate.lo, estimate.hi) == (min(values), max(values))
    assert estimate.kind == "range"
    assert stats.median_ci([*values, 7.0, 9.0, 11.0]).kind == "ci"  # five or more: the bootstrap interval


@pytest.mark.parametrize("n", [5, 6, 7, 8, 9, 10, 11, 12, 20, 31])
def test_bootstrap_interval_is_scipys_percentile_interval(n):
    """scipy.stats.bootstrap with the same resamples (the same seeded generator over the values in ascending order)
    and its percentile method gives the same interval."""
    data = np.random.default_rng(1000 + n).lognormal(size=n)
    reference = scipy.stats.bootstrap(
        (np.sort(data),),
        np.median,
        method="percentile",
        n_resamples=stats.RESAMPLES,
        confidence_level=stats.LEVEL,
        rng=np.random.default_rng(stats.SEED),
        vectorized=True,
    ).confidence_interval
    estimate = stats.median_ci(data.tolist())
    # The middle value, or the mean of the two middle ones as (a + b) / 2 or numpy's a + (b - a) / 2: 3 u apart.
    assert estimate.median == pytest.approx(float(np.median(data)), rel=gamma(3))
    assert_interval(estimate, (reference.low, reference.high), data)  # scipy's quantile is ours, (1 - 0.95) / 2
    assert estimate.kind == "ci"


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution():
    values = [float(v) for v in (3, 1, 4, 15, 9, 2, 6, 35, 97, 23, 62)]
    lo, hi = exact_bootstrap_median_quantiles(values, 0.025)
    estimate = stats.median_ci(values)
    assert estimate.median == 9.0
    assert (lo, hi) == (3.0, 35.0)  # not the range: the interval is a real bootstrap interval at n = 11
    assert (estimate.lo, estimate.hi) == (lo, hi)
    # The resamples index the values in ascending order, so any input order gives the same interval.
    shuffled = np.random.default_rng(7).permutation(values).tolist()
    assert (stats.median_ci(shuffled).lo, stats.median_ci(shuffled).hi) == (estimate.lo, estimate.hi)


@pytest.mark.parametrize(("n", "seed", "side"), [(58, 2058, 0), (46, 46, 1)])
def test_bootstrap_bounds_interpolate_between_unequal_order_statistics(n, seed, side):
    """Data where the two resample medians that bracket a bound differ (at positions floor(p (B - 1)) and the next),
    so the linear interpolation between them decides the bound; it still equals scipy's."""
    data = np.sort(np.random.default_rng(seed).lognormal(size=n))
    rows = np.random.default_rng(stats.SEED).integers(0, n, size=(stats.RESAMPLES, n))
    medians = np.sort(np.median(data[rows], axis=1))
    at = math.floor((0.025 if side == 0 else 0.975) * (stats.RESAMPLES - 1))
    assert medians[at] != medians[at + 1]
    reference = scipy.stats.bootstrap(
        (data,), np.median, method="percentile", n_resamples=stats.RESAMPLES, rng=np.random.default_rng(stats.SEED)
    ).confidence_interval
    estimate = stats.median_ci(data.tolist())
    assert_interval(estimate, (reference.low, reference.high), data)


def test_infinite_values_keep_the_interval_defined():
    estimate = stats.median_ci([1.0, 2.0, math.inf])
    assert estimate.median == 2.0
    assert estimate.lo == 1.0 and estimate.hi == math.inf
    # Seven seeds, three not reached: the upper resample medians are +inf, the lower ones finite.
    wide = stats.median_ci([1.0, 2.0, 3.0, 4.0, math.inf, math.inf, math.inf])
    assert wide.median == 4.0 and wide.hi == math.inf and 1.0 <= wide.lo <= 4.0


def test_wilcoxon_p_value_is_scipys_exact_test():
    rng = np.random.default_rng(7)
    for n in range(1, 16):
        for _ in range(5):
            differences = rng.normal(0.4, 1.0, n)  # continuous: no ties, no zeros
            expected = scipy.stats.wilcoxon(differences, method="exact").pvalue
            assert wilcoxon.signed_rank_p(differences.tolist()) == pytest.approx(expected, rel=p_value_tolerance(n))


def _sign_flip_p(differences: list[float]) -> float:
    """The exact sign-flip permutation test of the sum of positive ranks (scipy's permutation_test over every one
    of the 2^m sign assignments): the signed-rank test with ties, after dropping zeros."""
    nonzero = np.asarray([d for d in differences if d != 0], dtype=float)

    def positive_rank_sum(x: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.sum(scipy.stats.rankdata(np.abs(x), axis=axis) * (x > 0), axis=axis)

    return scipy.stats.permutation_test(
        (nonzero,), positive_rank_sum, permutation_type="samples", n_resamples=np.inf, vectorized=True
    ).pvalue


@pytest.mark.parametrize(
    "differences",
    [
        [1.0, 1.0, 2.0, -2.0, 3.0, 3.0, 3.0, 4.0],  # ties
        [0.5, 0.5, 0.5, 0.5, 0.5, -0.5],  # all tied
        [0.0, 0.0, -1.0, -2.0, -3.0, 2.0, -5.0],  # zeros are dropped
        [math.inf, 2.0, 3.0, -1.0, 4.0, 5.0],  # +inf: one reached, the other did not
    ],
)
def test_wilcoxon_with_ties_zeros_and_infinities_is_the_exact_permutation_test(differences):
    # scipy's p is a count of the 2^m sign assignments over 2^m (exact); ours as p_value_tolerance says.
    m = sum(1 for d in differences if d != 0)
    assert wilcoxon.signed_rank_p(differences) == pytest.approx(_sign_flip_p(differences), rel=p_value_tolerance(m))


def test_wilcoxon_of_one_sign_is_two_over_two_to_the_n():
    """All m differences of one sign: T+ is 0 (or its maximum), probability 1/2^m, two-sided 2/2^m."""
    for m in range(1, 12):
        # Exact: the tail is the one probability 2^-m, doubled (dyadic rationals, no rounding).
        assert wilcoxon.signed_rank_p([-1.0 - i for i in range(m)]) == min(1.0, 2 / 2**m)
    assert wilcoxon.signed_rank_p([0.0, 0.0]) == 1.0


def test_below_five_pairs_the_verdict_is_too_few_seeds():
    base = {0: 10.0, 1: 12.0, 2: 11.0, 3: 9.0}
    four = stats.paired_difference({0: 8.0, 1: 9.5, 2: 9.0, 3: 8.5}, base, "faster", "slower")
    assert four.seeds == (0, 1, 2, 3)
    assert four.difference.median == float(np.median([-2.0, -2.5, -2.0, -0.5]))
    assert (four.difference.lo, four.difference.hi) == (-2.5, -0.5) and four.difference.kind == "range"
    assert four.verdict == "too few seeds (n=4; need 5)" and four.p_value is None
    two = stats.paired_difference({0: 1.0, 1: 1.0}, {0: 5.0, 1: 5.0, 2: 5.0}, "faster", "slower")
    assert two.verdict == "too few seeds (n=2; need 5)"
    # A 53-point accuracy drop on 2 seeds is still "too few seeds", never "no detectable difference".
    drop = stats.paired_difference({0: 0.35, 1: 0.30}, {0: 0.86, 1: 0.85}, "worse", "better")
    assert drop.verdict == "too few seeds (n=2; need 5)"


def test_from_five_pairs_the_wilcoxon_test_and_the_interval_decide():
    base = {s: 10.0 + s for s in range(7)}
    six = stats.paired_difference({s: base[s] - 1 - 0.1 * s for s in range(6)}, base, "faster", "slower")
    # Six differences all below zero: p = 2 / 2^6 = 0.03125 < 0.05, and the interval lies below zero. The p-values
    # of one sign are dyadic, 2 / 2^m, so exact.
    scipy_p = scipy.stats.wilcoxon([-1 - 0.1 * s for s in range(6)]).pvalue
    assert six.p_value == pytest.approx(scipy_p, rel=p_value_tolerance(6))
    assert six.p_value == 2 / 64
    assert six.difference.hi < 0 and six.verdict == "faster"
    assert stats.paired_difference({s: base[s] + 2 + 0.1 * s for s in range(6)}, base, "a", "b").verdict == "b"
    # Five of one sign: the smallest possible two-sided p, 2 / 2^5 = 0.0625, is not below 0.05.
    five = stats.paired_difference({s: base[s] - 1 - 0.1 * s for s in range(5)}, base, "faster", "slower")
    assert five.p_value == 0.0625 and five.verdict == "no detectable difference (n=5)"
    mixed = stats.paired_difference({s: base[s] + (-1) ** s * (1 + s) for s in range(7)}, base, "faster", "slower")
    assert mixed.p_value > 0.05 and mixed.verdict == "no detectable difference (n=7)"


@pytest.mark.parametrize("sign", [-1.0, 1.0], ids=["upper-end-at-zero", "lower-end-at-zero"])
def test_an_interval_that_touches_zero_gives_no_direction(sign):
    """Eight differences of one sign and three exactly zero: the signed-rank test drops the zeros (p = 2 / 2^8), but
    a resample median is 0 whenever 6 of its 11 draws are zeros (probability about 5%), so the bootstrap interval's
    end nearest zero is exactly 0 (the upper end for negative differences, the lower for positive): no direction."""
    differences = [0.0, 0.0, 0.0, *(sign * k for k in range(1, 9))]
    zeros_win = binomial_tail(11, 3 / 11, 6)
    assert zeros_win > 0.04  # well above the 2.5% the bound needs
    paired = stats.paired_difference(dict(enumerate(differences)), dict.fromkeys(range(11), 0.0), "faster", "slower")
    assert paired.p_value == 2 / 2**8 and paired.p_value < stats.ALPHA  # dyadic: exact
    near, far = (
        (paired.difference.hi, paired.difference.lo) if sign < 0 else (paired.difference.lo, paired.difference.hi)
    )
    assert near == 0.0 and sign * far > 0
    assert paired.verdict == "no detectable difference (n=11)"


def test_pairs_where_neither_reached_are_left_out():
    a = {0: math.inf, 1: 5.0, 2: 4.0, 3: 3.0, 4: 2.0, 5: 1.0, 6: math.inf}
    b = {0: math.inf, 1: math.inf, 2: 6.0, 3: 7.0, 4: 8.0, 5: 9.0, 6: math.inf}
    paired = stats.paired_difference(a, b, "faster", "slower")
    assert paired.seeds == (1, 2, 3, 4, 5)
    assert paired.difference.median == -6.0  # of -inf, -8, -6, -4, -2
    assert paired.p_value == 0.0625 and paired.verdict == "no detectable difference (n=5)"  # 2 / 2^5: exact


def crossing_tolerance(x0: float, x1: float, before: float, after: float, target: float, expected: float) -> float:
    """Interpolated x0 + f (x1 - x0), f = (before - target) / (before - after), against the decimal hand value: the
    decimal literals carry u relative each, which the two differences amplify by (|b| + |t|) / |b - t| and
    (|b| + |a|) / |b - a|; two subtractions and the division add 3 u to f; the product and the sum 2 u; the hand
    expression 4 u. A wrong bracket or fraction (1 - f) is off by >= 1."""
    f = (before - target) / (before - after)
    relative_f = U * (
        (abs(before) + abs(target)) / abs(before - target) + (abs(before) + abs(after)) / abs(before - after) + 3
    )
    return relative_f * abs(f * (x1 - x0)) + 2 * U * (abs(x0) + abs(f * (x1 - x0))) + 4 * U * abs(expected)


def test_time_to_target_interpolates_between_the_bracketing_evaluations():
    steps = np.array([0, 10, 20, 30], float)
    seconds = np.array([0.0, 2.0, 4.5, 6.0])
    losses = np.array([1.0, 0.5, 0.1, 0.05])
    crossing = interpolate(steps, seconds, losses, Target("loss", 0.3, "min"))
    # Hand: first eval at or below 0.3 is step 20 (0.1); from 0.5 at step 10, fraction (0.5-0.3)/(0.5-0.1) = 0.5.
    assert crossing.steps == pytest.approx(15.0, rel=0, abs=crossing_tolerance(10, 20, 0.5, 0.1, 0.3, 15.0))
    hand = 2.0 + 0.5 * 2.5
    assert crossing.seconds == pytest.approx(hand, rel=0, abs=crossing_tolerance(2.0, 4.5, 0.5, 0.1, 0.3, hand))
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
    assert crossing.steps == pytest.approx(140.0, rel=0, abs=crossing_tolerance(100, 150, 0.7, 0.95, 0.9, 140.0))
    assert crossing.seconds == pytest.approx(2.8, rel=0, abs=crossing_tolerance(2.0, 3.0, 0.7, 0.95, 0.9, 2.8))
    skip = interpolate(steps, seconds, accuracy, Target("accuracy", 0.5, "max"))
    # The NaN point is skipped: brackets (0, 0.1) and (100, 0.7), fraction 0.4/0.6.
    expected = 100 * 0.4 / 0.6
    assert skip.steps == pytest.approx(expected, rel=0, abs=crossing_tolerance(0, 100, 0.1, 0.7, 0.5, expected))


def test_performance_profile_fractions_and_score_over_the_suites_each_ran():
    times = {
        "a": {"x": 10.0, "y": 20.0, "z": math.inf},
        "b": {"x": 30.0, "y": 15.0, "z": 45.0},
        "c": {"x": 8.0, "y": 40.0},  # z did not run on c
        "d": {"x": math.inf, "y": math.inf, "z": math.inf},  # nobody reached
    }
    profile = performance_profile(times, ["x", "y", "z"])
    # Ratios by hand: a: x 1, y 2; b: x 2, y 1, z 3; c: x 1, y 5 (z: not run); d: none.
    expected = {"x": [1, 2, 1, math.inf], "y": [2, 1, 5, math.inf], "z": [math.inf, 3, math.nan, math.inf]}
    for optim, ratios in expected.items():
        np.testing.assert_array_equal(profile.ratios[optim].to_numpy(), ratios)
    assert profile.coverage.to_dict() == {"x": 4, "y": 4, "z": 3}
    rho = profile.rho([1.0, 1.5, 2.0, 3.0, 4.0])
    assert rho["x"].tolist() == [0.5, 0.5, 0.75, 0.75, 0.75]
    assert rho["y"].tolist() == [0.25, 0.25, 0.5, 0.5, 0.5]
    # z over the three suites it ran (a, b, d): within 3 of the fastest on b only. Suite c is not counted against it.
    assert rho["z"].tolist() == [0.0, 0.0, 0.0, 1 / 3, 1 / 3]  # 1 / 3 correctly rounded on both sides: exact
    # Score: mean over the suites it ran of max(0, 4 - r) / 3, and it matches a fine Riemann sum of rho. Exact: the
    # clipped values are integers, so their sum is, and both sides divide it by the count and by 3 in that order.
    score = profile.score()
    assert score["x"] == (3 + 2 + 3 + 0) / 4 / 3
    assert score["z"] == (0 + 1 + 0) / 3 / 3
    # The mean of a non-decreasing step function (total rise <= 1) at N + 1 equally spaced points is within 1 / N
    # of its mean over the interval (each jump is counted at one point too many or too few); the float64 sums add
    # gamma_N. Counting the unreached suite, or a ratio one grid cell off, is off by >= 1e-2.
    taus = np.linspace(1, TAU_MAX, 30001)
    for optim in ("y", "z"):
        riemann = profile.rho(taus)[optim].to_numpy().mean()
        assert score[optim] == pytest.approx(riemann, rel=0, abs=1 / (len(taus) - 1) + gamma(len(taus)))


def test_rank_table_average_ties_no_ok_run_last_and_not_run_unranked():
    metrics = {
        "s1": {"a": 0.1, "b": 0.1, "c": 0.3, "d": 0.2},
        "s2": {"a": 0.9, "b": 0.7, "c": 0.8},  # accuracy: higher is better; d did not run it
        "s3": {"a": 0.5, "b": math.nan, "c": math.nan},  # b and c ran without an ok run; d did not run
    }
    ranks = rank_table(metrics, {"s1": "min", "s2": "max", "s3": "min"}, ["a", "b", "c", "d"])
    assert ranks.ranks.loc["s1"].tolist() == [1.5, 1.5, 4.0, 3.0]
    np.testing.assert_array_equal(ranks.ranks.loc["s2"].to_numpy(), [1.0, 3.0, 2.0, math.nan])
    np.testing.assert_array_equal(ranks.ranks.loc["s3"].to_numpy(), [1.0, 2.5, 2.5, math.nan])  # b, c share 2-3
    assert ranks.mean["a"] == (1.5 + 1 + 1) / 3  # the sum 3.5 is exact, then one division on both sides
    assert ranks.mean["d"] == 3.0  # over s1, the one suite d ran
    assert ranks.coverage.to_dict() == {"a": 3, "b": 3, "c": 3, "d": 1}
    assert not ranks.ranked.loc["s3", "b"] and not ranks.ran.loc["s2", "d"]


def test_pareto_front():
    points = [(1.0, 0.5), (2.0, 0.3), (3.0, 0.3), (4.0, 0.1), (2.5, 0.6)]
    assert pareto_front(points, maximize=False) == [0, 1, 3]
    assert pareto_front([(1.0, 0.5), (2.0, 0.9), (3.0, 0.7)], maximize=True) == [0, 1]


@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_fast_bootstrap_equals_its_definition(n):
    """The documented procedure, written out naively: resample the sorted values, take medians, take numpy's linear
    quantiles."""
    data = np.sort(np.random.default_rng(100 + n).lognormal(size=n))
    rows = np.random.default_rng(stats.SEED).integers(0, n, size=(stats.RESAMPLES, n))
    medians = np.median(data[rows], axis=1)
    expected = tuple(float(q) for q in np.quantile(medians, [0.025, 0.975]))
    estimate = stats.median_ci(data[::-1].tolist())
    assert estimate.median == pytest.approx(float(np.median(data)), rel=gamma(3))
    # np.quantile at the literals 0.025 and 0.975, ours at (1 - 0.95) / 2 = 0.025 + 2.2e-17 and 1 - that.
    assert_interval(estimate, expected, data, quantile_gap=abs((1 - stats.LEVEL) / 2 - 0.025))
