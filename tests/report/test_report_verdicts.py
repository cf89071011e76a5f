"""Verdicts a reviewer would accept, on hand-built stores: every number worked out here (scipy as the oracle of the
bootstrap interval and of the exact Wilcoxon test), never read back from the report's helpers."""

from __future__ import annotations

import io
import itertools
import math
import statistics
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.stats
from rich.console import Console

from structbench.report import build
from structbench.report.analysis.stats import LEVEL, RESAMPLES, SEED
from structbench.report.figures import plots
from structbench.report.figures.figure_file import optimizer_looks
from structbench.report.views import tables, terminal
from structbench.store import write as store
from tests.support.report_store import Point, final, write_run
from tests.support.report_tables import cells

TARGET = {"metric": "accuracy", "value": 0.5}
STEP_TIME = [0.001, 0.002, 0.003, 0.005, 0.010, 0.050]
OPTIM_TIME = [0.0005, 0.0004, 0.0024, 0.0005, 0.001, 0.005]
COMPILE = [0.1, 0.2, 0.3, 0.5, 0.4, 9.0]
PEAK_MIB = [100, 200, 300, 500, 4000, 400]
STATE = [1024, 2048, 4096, 8192, 65536, 4096]
THROUGHPUT = [900.0, 1500.0, 1200.0, 100.0, 5000.0, 1300.0]
VAL = [0.80, 0.82, 0.84, 0.86, 0.10, 0.83]
TEST = [0.79, 0.81, 0.83, 0.85, 0.12, 0.80]
U = 2.0**-53  # float64 unit roundoff
# A ramp accuracy fl(0.1 + fl(fl((v - 0.1) s) / steps)) carries v's and 0.1's representation errors and four
# roundings, on quantities <= 1: it is within 6 u of the decimal line's value.
RAMP_ERROR = 6 * U


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of n float64 roundings."""
    return n * U / (1 - n * U)


def crossing_error(val: float, wall: float, steps: int = 100, target: float = 0.5) -> tuple[float, float]:
    """Bounds on |report - closed form| for the steps and seconds at which ramp(val, ., wall) reaches `target`.
    The report interpolates between the stored points (s0, w0, b) and (s1, w1, a) around the target: b and a are
    within RAMP_ERROR of the line and w = wall s / steps within u |w|, so f = (b - t) / (b - a) is within
    |f| (RAMP_ERROR / |b - t| + 2 RAMP_ERROR / |b - a| + 3 u), s0 + f (s1 - s0) within that times s1 - s0 plus
    2 u |x|, w0 + f (w1 - w0) within |df| |w1 - w0| + |f| u (|w0| + |w1| + |w1 - w0|) + 2 u |w|. The closed
    forms (t - 0.1) steps / (v - 0.1) and wall times that / steps carry v's and 0.1's representation errors,
    amplified by (|v| + 0.1) / |v - 0.1|, and <= 4 roundings. A crossing on the test curve instead of the
    validation one, or at the bracketing evaluation instead of interpolated, is off by >= 0.5 steps."""
    points = [(s, wall * s / steps, 0.1 + (val - 0.1) * s / steps) for s in range(0, steps + 1, steps // 4)]
    (s0, w0, b), (s1, w1, a) = next((p, q) for p, q in itertools.pairwise(points) if q[2] >= target)
    f = (b - target) / (b - a)
    df = abs(f) * (RAMP_ERROR / abs(b - target) + 2 * RAMP_ERROR / abs(b - a) + 3 * U)
    x = (target - 0.1) * steps / (val - 0.1)
    closed = U * ((abs(val) + 0.1) / abs(val - 0.1) + 4)
    step_error = df * (s1 - s0) + (2 * U + closed) * abs(x)
    seconds = wall * x / steps
    second_error = df * abs(w1 - w0) + abs(f) * U * (abs(w0) + abs(w1) + abs(w1 - w0)) + (2 * U + closed) * seconds
    return step_error, second_error


def p_value_tolerance(m: int) -> float:
    """As in test_report_stats: two exact signed-rank p-values over m differences, computed in float64, agree to
    gamma_{2m + m(m+1) + 2} relative each (a rounding bound over a few hundred operations)."""
    return 2 * gamma(2 * m + m * (m + 1) + 2)


def assert_interval(estimate, values: list[float]) -> None:
    """The bootstrap bounds of the stored ramp finals against scipy's on the decimal values: a bound is a weighted
    mean of resample medians, so data within RAMP_ERROR move it by no more; the quantile positions p (B - 1) (ours
    rounded once, numpy's about 6 times, each within u (B + 1)) shift it by that times the data's spread; either
    interpolation formula adds 3 u spread + 2 u |bound|. Another quantile or order statistic is off by >= 1e-4."""
    reference = scipy_interval(values)
    spread = max(values) - min(values)
    for ours, theirs in zip((estimate.lo, estimate.hi), reference, strict=True):
        tolerance = RAMP_ERROR + 7 * U * (RESAMPLES + 1) * spread + U * (3 * spread + 2 * abs(theirs))
        assert ours == pytest.approx(theirs, rel=0, abs=tolerance)


def ramp(val: float, test: float, wall: float, steps: int = 100) -> list[Point]:
    """Five evaluations on a straight line from accuracy 0.1 at step 0 to the final accuracies, wall-clock likewise:
    interpolation is exact, and each interval is a quarter of the run (not flagged)."""
    return [
        Point(
            s,
            wall * s / steps,
            1 - (0.1 + (val - 0.1) * s / steps),
            0.1 + (val - 0.1) * s / steps,
            1 - (0.1 + (test - 0.1) * s / steps),
            0.1 + (test - 0.1) * s / steps,
        )
        for s in range(0, steps + 1, steps // 4)
    ]


def scipy_interval(values: list[float]) -> tuple[float, float]:
    interval = scipy.stats.bootstrap(
        (np.sort(values),),
        np.median,
        method="percentile",
        n_resamples=RESAMPLES,
        confidence_level=LEVEL,
        rng=np.random.default_rng(SEED),
        vectorized=True,
    ).confidence_interval
    return float(interval.low), float(interval.high)


@pytest.fixture(scope="module")
def six_seeds(tmp_path_factory) -> Path:
    """adamw and muon on six seeds whose costs differ per seed (median, mean and max all disagree)."""
    out = tmp_path_factory.mktemp("six") / "results"
    store.prepare(out)
    for s in range(6):
        write_run(
            out,
            f"adamw-{s}",
            "adamw",
            s,
            ramp(VAL[s], TEST[s], wall=2.0 + s),
            target=TARGET,
            step_time_median_s=STEP_TIME[s],
            optim_time_median_s=OPTIM_TIME[s],
            compile_s=COMPILE[s],
            peak_mem_bytes=PEAK_MIB[s] << 20,
            state_bytes=STATE[s],
            throughput_per_s=THROUGHPUT[s],
            throughput_unit="images/s",
        )
        lift = 0.01 * (s + 1)  # muon's accuracy is higher on every seed, by a different amount on each
        write_run(out, f"muon-{s}", "muon", s, ramp(VAL[s] + lift, TEST[s] + lift, wall=1.0 + s), target=TARGET)
    return out


def test_every_summary_column_is_the_median_over_seeds_with_its_interval(six_seeds):
    [suite] = build.build_report(six_seeds).suites
    adamw = suite.selected["adamw"]
    ratios = [o / s for o, s in zip(OPTIM_TIME, STEP_TIME, strict=True)]
    # Median, mean and max disagree for every cost, so the test tells them apart.
    for values in (STEP_TIME, ratios, COMPILE, PEAK_MIB, STATE, THROUGHPUT):
        assert len({statistics.median(values), statistics.fmean(values), max(values)}) == 3
    # Medians of two stored decimals (a + b) / 2 against the decimal literal: the three representation errors and
    # the sum's rounding, 4 u relative (positive terms); the ratios o / s one division and two representation
    # errors more. The mean or the max of the six is off by >= 1e-3.
    assert adamw.step_time_s == pytest.approx(0.004, rel=gamma(4))  # (0.003 + 0.005) / 2
    # ratios 0.5 0.2 0.8 0.1 0.1 0.1: median of the per-run ratios
    assert adamw.optim_share == pytest.approx(0.15, rel=gamma(7))
    assert adamw.compile_s == pytest.approx(0.35, rel=gamma(4))
    assert adamw.peak_mem_bytes == 350 << 20
    assert adamw.state_bytes == 4096
    assert adamw.throughput_per_s == 1250.0
    # The final accuracies are the ramps' last points (within RAMP_ERROR of VAL, TEST); a median of two adds u,
    # the literal u.
    assert adamw.final_val_metric.median == pytest.approx(0.825, rel=0, abs=RAMP_ERROR + 2 * U * 0.825)
    assert_interval(adamw.final_val_metric, VAL)
    assert adamw.final_metric.median == pytest.approx(0.805, rel=0, abs=RAMP_ERROR + 2 * U * 0.805)
    assert_interval(adamw.final_metric, TEST)
    # Time to target on the validation curve: accuracy 0.1 + (v - 0.1) s / 100 reaches 0.5 at s = 40 / (v - 0.1);
    # seed 4 (v = 0.1) never does. A median moves by no more than its values (crossing_error), plus u each side.
    steps = [40 / (v - 0.1) if v > 0.1 else math.inf for v in VAL]
    seconds = [(2.0 + s) * 0.4 / (v - 0.1) if v > 0.1 else math.inf for s, v in enumerate(VAL)]
    errors = [crossing_error(v, 2.0 + s) for s, v in enumerate(VAL) if v > 0.1]
    median_steps, median_seconds = statistics.median(steps), statistics.median(seconds)
    step_tolerance = max(e[0] for e in errors) + 2 * U * median_steps
    assert adamw.steps_to_target.median == pytest.approx(median_steps, rel=0, abs=step_tolerance)
    second_tolerance = max(e[1] for e in errors) + 2 * U * median_seconds
    assert adamw.seconds_to_target.median == pytest.approx(median_seconds, rel=0, abs=second_tolerance)
    assert adamw.timing_split == "validation" and not adamw.wide_crossings and not adamw.few_evaluations

    table = tables.suite_table(suite)
    row = cells(table, "adamw")
    expected = {
        "optimizer": "adamw",
        "runs": "6 ok",
        "hyperparameters": "suite's",
        "final val loss ↓": "0.175",  # losses 1 - accuracy: 0.2 0.18 0.16 0.14 0.9 0.17
        "final val accuracy ↑": "0.825",
        "final test loss ↓": "0.195",  # 0.21 0.19 0.17 0.15 0.88 0.2
        "final test accuracy ↑": "0.805",
        "steps to target (validation)": f"{statistics.median(steps):.4g}",
        "time to target (validation)": "2.4 s",  # (2.162 + 2.632) / 2
        "speed-up (steps)": "1x",
        "speed-up (time)": "1x",
        "step time": "4 ms",
        "optimizer share": "15%",
        "compile": "350 ms",
        "throughput": "1,250",
        "peak memory": "350.0 MiB",
        "state (measured)": "4.0 KiB",
        "state (analytic)": "-",
        "routing": "1 structured · 1 fallback (adamw)",
    }
    assert {name: cell.text for name, cell in row.items()} == expected
    low, high = scipy_interval(VAL)
    assert row["final val accuracy ↑"].sub == f"95% CI [{low:.4g}, {high:.4g}] n=6"
    assert row["steps to target (validation)"].sub.endswith("n=6 5/6 reached")
    # muon's speed-up: adamw's median steps (seconds) to target over muon's.
    muon_val = [v + 0.01 * (s + 1) for s, v in enumerate(VAL)]
    muon_steps = [40 / (v - 0.1) if 40 / (v - 0.1) <= 100 else math.inf for v in muon_val]
    muon_seconds = [(1.0 + s) * x / 100 for s, x in enumerate(muon_steps)]
    muon = cells(table, "muon")
    assert muon["speed-up (steps)"].text == f"{statistics.median(steps) / statistics.median(muon_steps):.2f}x"
    assert muon["speed-up (time)"].text == f"{statistics.median(seconds) / statistics.median(muon_seconds):.2f}x"


def test_from_six_seeds_the_wilcoxon_test_gives_a_verdict_with_its_p_value(six_seeds):
    [suite] = build.build_report(six_seeds).suites
    [muon] = suite.comparisons
    differences = [(TEST[s] + 0.01 * (s + 1)) - TEST[s] for s in range(6)]
    expected_p = scipy.stats.wilcoxon(differences, method="exact").pvalue
    assert muon.metric.p_value == 2 / 64  # six differences of one sign: 2 / 2^6, dyadic, exact
    assert muon.metric.p_value == pytest.approx(expected_p, rel=p_value_tolerance(6))
    assert muon.metric.verdict == "better"  # accuracy: a positive difference is better
    table = tables.comparison_table(suite)
    row = cells(table, "muon")
    assert row["verdict (test)"].text == "better" and row["verdict (test)"].sub == "Wilcoxon p=0.031"
    # Time to target: muon's seed 4 reaches (0.1 + 0.05) ... never 0.5 either; the five others are faster.
    assert row["verdict (time)"].text == "no detectable difference (n=5)"


@pytest.fixture(scope="module")
def touching_zero(tmp_path_factory) -> Path:
    """Eleven seeds: muon's test accuracy equals adamw's on three and is 0.01 k lower on eight."""
    out = tmp_path_factory.mktemp("zero") / "results"
    store.prepare(out)
    drops = [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    for s, drop in enumerate(drops):
        write_run(out, f"adamw-{s}", "adamw", s, final(100, 0.8, 0.8))
        write_run(out, f"muon-{s}", "muon", s, final(100, 0.8, 0.8 - 0.01 * drop))
    return out


def test_a_verdict_whose_interval_touches_zero_is_no_detectable_difference(touching_zero):
    [suite] = build.build_report(touching_zero).suites
    [muon] = suite.comparisons
    differences = [muon.variant.final_metric_by_seed[s] - muon.baseline.final_metric_by_seed[s] for s in range(11)]
    assert scipy_interval(differences)[1] == 0.0  # the bootstrap interval's upper end is exactly 0
    assert muon.metric.difference.hi == 0.0
    assert muon.metric.p_value == 2 / 2**8 and muon.metric.p_value < 0.05  # zeros are dropped; dyadic: exact
    assert muon.metric.verdict == "no detectable difference (n=11)"


def test_two_seeds_give_too_few_seeds_and_no_best_cell(tmp_path):
    """Fashion-MNIST, two seeds: sumo 53 points below adamw is 'too few seeds', not 'no detectable difference',
    and no cell is marked best (fewer than 3 seeds)."""
    out = tmp_path / "results"
    store.prepare(out)
    for s, (adamw_acc, sumo_acc) in enumerate(((0.86, 0.33), (0.85, 0.32))):
        write_run(out, f"adamw-{s}", "adamw", s, final(300, adamw_acc, adamw_acc), suite="fashion-mnist")
        write_run(out, f"sumo-{s}", "sumo", s, final(300, sumo_acc, sumo_acc), suite="fashion-mnist")
    [suite] = build.build_report(out).suites
    [sumo] = suite.comparisons
    # Each difference carries its inputs' representation errors u (0.86 + 0.33) and its rounding u 0.53, their
    # mean u 0.53, the literal u 0.53. A difference of the other sign or of the validation values is off by 1e-2.
    assert sumo.metric.difference.median == pytest.approx(-0.53, rel=0, abs=U * (0.86 + 0.33 + 3 * 0.53))
    assert sumo.metric.verdict == "too few seeds (n=2; need 5)" and sumo.metric.p_value is None
    table = tables.suite_table(suite)
    assert not any(cell.tone == "best" for row in table.rows for cell in row)
    assert cells(table, "adamw")["final test accuracy ↑"].sub == "min–max [0.85, 0.86] n=2"


def test_a_setting_is_selected_on_validation_where_test_would_pick_another(tmp_path):
    """sgd at lr 0.1 is best on validation (0.90 against 0.85) and worse on test (0.80 against 0.88): the report
    selects lr 0.1, reports its test accuracy only, and the every-setting table shows no test numbers."""
    out = tmp_path / "results"
    store.prepare(out)
    for s in range(3):
        write_run(out, f"a-{s}", "sgd", s, final(100, 0.90 + 0.001 * s, 0.80), hparams={"lr": 0.1})
        write_run(out, f"b-{s}", "sgd", s, final(100, 0.85 + 0.001 * s, 0.88), hparams={"lr": 1.0})
    [suite] = build.build_report(out).suites
    assert [v.label for v in suite.variants] == ["sgd lr=0.1", "sgd lr=1"]
    best_on_test = max(suite.variants, key=lambda v: v.final_metric.median)
    assert best_on_test.label == "sgd lr=1"
    assert suite.selected["sgd"].label == "sgd lr=0.1"
    assert suite.selections["sgd"].criterion.describe() == "selected on validation accuracy"
    main = cells(tables.suite_table(suite), "sgd lr=0.1")
    assert main["final test accuracy ↑"].text == "0.8" and main["final val accuracy ↑"].text == "0.901"
    assert main["hyperparameters"].text == "selected from 2 settings"
    every = tables.suite_table(suite, every_setting=True)
    assert not [c.name for c in every.columns if "test" in c.name]
    assert all("0.88" not in cell.text for row in every.rows for cell in row)


def test_an_optimizer_absent_from_a_suite_has_no_rank_there_and_its_coverage_shows(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    accuracy = {"a": {"adamw": 0.9, "muon": 0.8, "sgd": 0.7}, "b": {"muon": 0.6, "sgd": 0.7}}  # adamw never ran b
    for suite, by_optim in accuracy.items():
        for optim, acc in by_optim.items():
            write_run(out, f"{suite}-{optim}", optim, 0, ramp(acc, acc, 1.0), suite=suite, target=TARGET)
    write_run(out, "smoke-adamw", "adamw", 0, ramp(0.2, 0.2, 1.0), suite="smoke-mlp", target=TARGET)
    report = build.build_report(out)
    ranks = report.ranks
    assert not ranks.ran.loc["b", "adamw"] and math.isnan(ranks.ranks.loc["b", "adamw"])
    assert ranks.mean.to_dict() == {"adamw": 1.0, "muon": 2.0, "sgd": 2.0}  # adamw: rank 1 on a, the suite it ran
    assert report.left_out == ("smoke-mlp",) and "smoke-mlp" not in ranks.ranks.index
    table = tables.rank_table(report)
    adamw = cells(table, "adamw")
    assert adamw["suites run"].text == "1/2" and (adamw["b"].text, adamw["b"].sub) == ("-", "not run")
    profile = report.profile_steps
    assert profile.coverage.to_dict() == {"adamw": 1, "muon": 2, "sgd": 2}
    assert cells(tables.profile_table(profile, "steps"), "adamw")["suites run"].text == "1/2"
    with_smoke = build.build_report(out, include_smoke=True)
    assert with_smoke.ranks.coverage["adamw"] == 2 and with_smoke.left_out == ()


def test_a_two_evaluation_run_and_a_wide_interpolation_are_flagged(tmp_path):
    """Evaluated at steps 0 and 32 only (a shortened budget): time to target is interpolated over the whole run;
    adamw, evaluated every 8 steps, is not flagged."""
    out = tmp_path / "results"
    store.prepare(out)
    for s in range(3):
        write_run(out, f"adamw-{s}", "adamw", s, ramp(0.9, 0.9, 2.0, steps=32), target=TARGET)
        write_run(out, f"asgo-{s}", "asgo", s, final(32, 0.6, 0.6, wall_s=1.0), target=TARGET)
    [suite] = build.build_report(out).suites
    asgo = suite.selected["asgo"]
    assert asgo.few_evaluations == {0: 2, 1: 2, 2: 2}
    assert {c.span for c in asgo.wide_crossings.values()} == {1.0}
    row = cells(tables.suite_table(suite), "asgo")
    for column in ("steps to target (validation)", "time to target (validation)", "speed-up (steps)"):
        assert "⚠ 2 evaluations" in row[column].sub and "⚠ interpolated over 100%" in row[column].sub
        assert row[column].tone == "bad"
    assert not cells(tables.suite_table(suite), "adamw")["steps to target (validation)"].sub.count("⚠")
    assert any(note.startswith("too few evaluations: asgo (seed 0: 2") for note in suite.notes)


def test_untuned_rows_say_so(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    write_run(out, "sgd-0", "sgd", 0, final(100, 0.9, 0.9), suite="digits", hparams_source=None)
    write_run(out, "sumo-0", "sumo", 0, final(100, 0.1, 0.1), suite="digits", hparams_source=None)
    write_run(out, "soap-0", "soap", 0, final(100, 0.8, 0.8), suite="mine", hparams_source="registry defaults")
    write_run(out, "muon-0", "muon", 0, final(100, 0.8, 0.8), suite="mine", hparams_source="command line")
    report = build.build_report(out)
    by_suite = {s.name: tables.suite_table(s) for s in report.suites}
    # Stored without hparams_source: the built-in digits suite names sgd and not sumo.
    assert cells(by_suite["digits"], "sgd")["hyperparameters"].text == "suite's"
    sumo = cells(by_suite["digits"], "sumo")["hyperparameters"]
    assert (sumo.text, sumo.tone) == ("untuned here (registry defaults)", "bad")
    assert cells(by_suite["mine"], "soap")["hyperparameters"].text == "untuned here (registry defaults)"
    assert cells(by_suite["mine"], "muon")["hyperparameters"].text == "set on the command line"
    digits = next(s for s in report.suites if s.name == "digits")
    assert any(note.startswith("untuned here: sumo ran at the registry's default") for note in digits.notes)


def test_on_cpu_the_pareto_front_uses_state_bytes_only(tmp_path, monkeypatch):
    out = tmp_path / "results"
    store.prepare(out)
    for optim, mib, state in (("adamw", 300, 8192), ("muon", 100, 4096)):
        write_run(out, f"{optim}-cpu", optim, 0, final(100, 0.8, 0.8), suite="cpu", peak_mem_bytes=mib << 20,
                  peak_mem_source="rss-delta", state_bytes=state)  # fmt: skip
        write_run(out, f"{optim}-gpu", optim, 0, final(100, 0.8, 0.8), suite="gpu", peak_mem_bytes=mib << 20,
                  state_bytes=state)  # fmt: skip
    fronts: list[list[tuple[float, float]]] = []
    original = plots.pareto_front
    monkeypatch.setattr(
        plots, "pareto_front", lambda points, maximize: fronts.append(points) or original(points, maximize)
    )
    report = build.build_report(out, plotted=True)
    looks = optimizer_looks(["adamw", "muon"])
    cpu, gpu = (next(s for s in report.suites if s.name == name) for name in ("cpu", "gpu"))
    plots._quality_memory_figure(cpu, looks)
    assert fronts == [[(8.0, 0.8), (4.0, 0.8)]]  # state bytes in KiB only
    fronts.clear()
    plots._quality_memory_figure(gpu, looks)
    assert fronts == [[(300.0, 0.8), (100.0, 0.8)], [(8.0, 0.8), (4.0, 0.8)]]  # peak memory, then state
    memory = cells(tables.suite_table(cpu), "adamw")["peak memory"]
    assert memory.sub == "rss-delta (approximate)" and "Pareto front uses optimizer-state bytes" in memory.title


def test_several_stores_side_by_side_each_against_its_own_baseline(tmp_path):
    stores = [tmp_path / "machine-a", tmp_path / "machine-b"]
    for out, speed in zip(stores, (1.0, 2.0), strict=True):
        store.prepare(out)
        for s in range(2):
            write_run(out, f"adamw-{s}", "adamw", s, ramp(0.8, 0.8, 4.0 * speed), target=TARGET)
            write_run(out, f"muon-{s}", "muon", s, ramp(0.9, 0.9, 2.0 * speed), target=TARGET)
    report = build.build_report(stores)
    [suite] = report.suites
    a, b = (str(p) for p in stores)
    assert sorted(suite.selected) == sorted([f"adamw [{a}]", f"adamw [{b}]", f"muon [{a}]", f"muon [{b}]"])
    table = tables.suite_table(suite)
    assert [c.name for c in table.columns][1] == "store"
    assert {cells(table, f"muon [{x}]")["store"].text for x in (a, b)} == {a, b}
    pairs = {c.variant.label: c.baseline.label for c in suite.comparisons}
    assert pairs == {f"muon [{a}]": f"adamw [{a}]", f"muon [{b}]": f"adamw [{b}]"}
    # Same speed-up on both machines: muon takes half adamw's time on each.
    crossing = 0.4 / (0.9 - 0.1), 0.4 / (0.8 - 0.1)
    for x, speed in ((a, 1.0), (b, 2.0)):
        muon = suite.selected[f"muon [{x}]"]
        # crossing_error (the median of two equal values is that value); the speed-up, a ratio of two such, within
        # their relative errors plus the division and the hand expression's 3 roundings.
        expected = 2.0 * speed * crossing[0]
        muon_error, adamw_error = crossing_error(0.9, 2.0 * speed)[1], crossing_error(0.8, 4.0 * speed)[1]
        assert muon.seconds_to_target.median == pytest.approx(expected, rel=0, abs=muon_error)
        ratio_error = muon_error / expected + adamw_error / (4.0 * speed * crossing[1]) + gamma(4)
        speedup = (4.0 * crossing[1]) / (2.0 * crossing[0])
        assert suite.speedup(muon, "seconds") == pytest.approx(speedup, rel=ratio_error)
    assert set(report.environments()["store"]) == {a, b}


def test_the_terminal_splits_wide_tables_instead_of_truncating(six_seeds):
    """At 70 columns every table is split into tables that fit, and every cell's text appears whole."""
    report = build.build_report(six_seeds)
    console = Console(width=70, record=True, file=io.StringIO())
    terminal.print_report(console, report)
    text = console.export_text()
    assert "…" not in text and max(len(line.rstrip()) for line in text.splitlines()) <= 70
    [suite] = report.suites
    for table in (tables.suite_table(suite), tables.comparison_table(suite)):
        for row in table.rows:
            for cell in row:
                assert cell.text in text and cell.sub in text


def test_a_store_written_before_validation_splits_still_reports_and_says_so(cli, tmp_path):
    """Run files without the final_val_* columns (older stores), no validation curve, no hparams_source and the
    absolute RSS source: the report reads them, times on the test split and says that there is no validation split."""
    out = tmp_path / "results"
    store.prepare(out)
    for s in range(2):
        for optim in ("adamw", "muon"):
            write_run(out, f"{optim}-{s}", optim, s, ramp(0.8, 0.8, 2.0), target=TARGET, validated=False,
                      hparams_source=None, peak_mem_source="rss")  # fmt: skip
            path = out / "runs" / f"{optim}-{s}.parquet"
            pq.write_table(pq.read_table(path).drop_columns(["final_val_loss", "final_val_metric"]), path)
    [suite] = build.build_report(out).suites
    assert not suite.validated and suite.timing_split == "test"
    names = [c.name for c in tables.suite_table(suite).columns]
    assert "final test accuracy ↑" in names and not [n for n in names if "val" in n]
    assert "steps to target (test)" in names
    assert suite.notes[0].startswith("splits: these runs hold out no validation split")
    assert cells(tables.suite_table(suite), "adamw")["hyperparameters"].text == "unknown"  # not a built-in suite
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    assert "hold out no validation split" in " ".join(result.stdout.split())
