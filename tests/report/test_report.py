"""`structbench report` on hand-built stores with known numbers, and on stores written by real CLI runs.

Every expected value is computed here, from the numbers written into the store or read back with pandas,
never from the report's own helpers.

The report's numbers are compared exactly (==): Parquet returns the float64 values written here bit for bit, and
the report applies its documented formulas (interpolation f = (before - target) / (before - after), then x0 + f
(x1 - x0); a median is the middle value or (a + b) / 2; a speed-up is a ratio of medians; a difference of two
values one subtraction) to the same operands in the same order as the hand computations below: the same correctly
rounded IEEE operations, so the same bits on any machine.
"""

from __future__ import annotations

import gc
import itertools
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from structbench.report import build, parallel
from structbench.report.figures import render
from structbench.report.figures.figure_file import optimizer_looks
from structbench.report.views import tables
from structbench.store import write as store
from tests.support.paths import ROOT
from tests.support.store import T0, adamw_evals, muon_evals, read_curves, read_runs, write_experiment_run, write_run
from tests.support.workers import kill_once_two_workers_run


def crossing(evals: list[tuple[int, float, float, float]], target: float) -> tuple[float, float]:
    """Hand interpolation: first eval with loss <= target, linear from the one before."""
    for (s0, w0, l0, _), (s1, w1, l1, _) in itertools.pairwise(evals):
        if l1 <= target:
            f = (l0 - target) / (l0 - l1)
            return s0 + f * (s1 - s0), w0 + f * (w1 - w0)
    return math.inf, math.inf


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hand") / "results"
    store.prepare(out)
    for seed in range(3):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed), analytic_state_bytes=4096)
        write_run(out, f"muon-{seed}", "muon", seed, muon_evals(seed), analytic_state_bytes=4000)
    # sgd: seed 0 diverges before the target, seeds 1 and 2 reach it, seed 3 fails with an error.
    write_run(out, "sgd-0", "sgd", 0, [(0, 0.0, 2.0, 0.1), (5, 0.5, 1.5, 0.2)], status="diverged")
    write_run(out, "sgd-1", "sgd", 1, [(0, 0.0, 2.0, 0.1), (10, 1.0, 0.6, 0.6), (20, 2.0, 0.3, 0.75)])
    write_run(out, "sgd-2", "sgd", 2, [(0, 0.0, 2.0, 0.1), (10, 1.5, 0.8, 0.6), (20, 3.0, 0.4, 0.7)])
    write_run(out, "sgd-3", "sgd", 3, [(0, 0.0, 2.0, 0.1)], status="error")
    # lion: one seed that ends ok without reaching the target.
    write_run(out, "lion-0", "lion", 0, [(0, 0.0, 2.0, 0.1), (20, 2.0, 0.9, 0.3)])
    return out


@pytest.fixture(scope="module")
def hand_report(hand_store) -> build.Report:
    return build.build_report(hand_store, plotted=True)


def test_medians_cis_and_time_to_target_match_hand_computation(hand_report):
    suite = hand_report.suites[0]
    adamw, muon, sgd = (suite.selected[o] for o in ("adamw", "muon", "sgd"))
    adamw_cross = [crossing(adamw_evals(s), 0.5) for s in range(3)]
    muon_cross = [crossing(muon_evals(s), 0.5) for s in range(3)]
    # adamw: between (10, 1.0) and (20, 0.2): f = 0.625 -> 16.25 steps on every seed.
    assert [c[0] for c in adamw_cross] == [16.25] * 3
    assert adamw.steps_to_target.median == 16.25
    assert adamw.seconds_to_target.median == statistics.median(c[1] for c in adamw_cross)
    assert muon.steps_to_target.median == statistics.median(c[0] for c in muon_cross)
    assert muon.seconds_to_target.median == statistics.median(c[1] for c in muon_cross)
    # n = 3: the bootstrap interval of a median spans the three values.
    assert (muon.seconds_to_target.lo, muon.seconds_to_target.hi) == (
        min(c[1] for c in muon_cross),
        max(c[1] for c in muon_cross),
    )
    finals = [e[-1][3] for e in map(adamw_evals, range(3))]
    assert adamw.final_metric.median == statistics.median(finals)
    assert adamw.final_loss.median == 0.2
    # sgd: the diverged seed counts as not reached, the error run not at all: median of (inf, a, b) = max(a, b).
    sgd_cross = [
        crossing([(0, 0.0, 2.0, 0.1), (10, 1.0, 0.6, 0.6), (20, 2.0, 0.3, 0.75)], 0.5),
        crossing([(0, 0.0, 2.0, 0.1), (10, 1.5, 0.8, 0.6), (20, 3.0, 0.4, 0.7)], 0.5),
    ]
    assert sgd.steps_to_target.n == 3 and sgd.reached == 2
    assert sgd.steps_to_target.median == max(c[0] for c in sgd_cross)
    assert sgd.statuses["diverged"] == 1 and sgd.statuses["error"] == 1 and sgd.statuses["ok"] == 2
    # Speed-ups against adamw: the ratio of medians.
    assert suite.speedup(muon, "steps") == 16.25 / muon.steps_to_target.median
    assert suite.speedup(muon, "seconds") == adamw.seconds_to_target.median / muon.seconds_to_target.median
    assert (muon.state_bytes, muon.analytic_state_bytes) == (4096, 4000)


def test_paired_comparison_and_verdicts(hand_report):
    suite = hand_report.suites[0]
    muon = next(c for c in suite.comparisons if c.variant.optim == "muon")
    differences = [crossing(muon_evals(s), 0.5)[1] - crossing(adamw_evals(s), 0.5)[1] for s in range(3)]
    assert all(d < 0 for d in differences)
    assert muon.seeds == (0, 1, 2)
    assert muon.seconds.difference.median == statistics.median(differences)
    # Three differences of one sign happen 1 time in 4 by chance: below 5 seeds there is no verdict.
    assert muon.seconds.verdict == "too few seeds (n=3; need 5)" and muon.seconds.p_value is None
    accuracy = [muon_evals(s)[-1][3] - adamw_evals(s)[-1][3] for s in range(3)]
    assert muon.metric.difference.median == statistics.median(accuracy)
    assert (muon.metric.difference.lo, muon.metric.difference.hi) == (min(accuracy), max(accuracy))
    assert muon.metric.verdict == "too few seeds (n=3; need 5)"
    sgd = next(c for c in suite.comparisons if c.variant.optim == "sgd")
    assert sgd.seeds == (0, 1, 2)
    assert sgd.metric.verdict == "too few seeds (n=2; need 5)"  # seed 0 diverged: two ok pairs


def test_terminal_report_shows_the_numbers_and_every_failure(cli, hand_store):
    result = cli("report", "--out", hand_store)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in (
        "hand",
        "adamw",
        "muon",
        "3 ok",
        "2 ok · 1 diverged · 1 error",
        "16.25",
        "not reached",
        "too few seeds (n=3; need 5)",
        "sgd-0",
        "sgd-3",
        "diverged: something",
        "error: something",
        "4.0 KiB",
        "3.9 KiB",
        "1 structured · 1 fallback (adamw)",
        "Performance profile",
        "Rank across suites",
    ):
        assert text in out, text
    speedup = 16.25 / statistics.median(crossing(muon_evals(s), 0.5)[0] for s in range(3))
    assert f"{speedup:.2f}x" in out


def test_markdown_and_html_files(cli, hand_store, tmp_path):
    result = cli("report", "--out", hand_store, "--format", "all", "--to", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| optimizer | runs |" in md and "not reached" in md and "(#runs-hand-muon)" in md
    pngs = sorted((tmp_path / "rep" / "figures").glob("*.png"))
    names = {p.stem for p in pngs}
    assert {
        "performance-profiles",
        "hand-loss-vs-step",
        "hand-loss-vs-time",
        "hand-metric-vs-step",
        "hand-memory",
        "hand-quality-vs-memory",
        "hand-step-time",
    } <= names
    for png in pngs:
        assert f"figures/{png.name}" in md
        image = Image.open(png)
        assert image.size[0] >= 600 and len(image.getcolors(1 << 20) or []) > 20  # drawn, not blank
    loss_plot = Image.open(tmp_path / "rep" / "figures" / "hand-loss-vs-step.png")
    assert {"adamw-0", "muon-2", "sgd-0"} <= set(loss_plot.text["Description"].removeprefix("runs: ").split())
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs)
    assert 'id="runs-hand-sgd"' in html and "<details" in html and "test cpu" in html
    assert 'src="http' not in html and 'href="http' not in html  # self-contained


def test_profiles_and_ranks_across_suites(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    # Suite a: adamw reaches 0.5 at 8 s, muon at 2 s. Suite b: adamw 3 s, muon never.
    for suite, adamw_w, muon_w, muon_loss in (("a", 8.0, 2.0, 0.1), ("b", 3.0, 1.0, 0.9)):
        write_run(out, f"{suite}-adamw", "adamw", 0, [(0, 0.0, 2.0, 0.1), (10, adamw_w, 0.5, 0.6)], suite=suite)
        write_run(out, f"{suite}-muon", "muon", 0, [(0, 0.0, 2.0, 0.1), (10, muon_w, muon_loss, 0.7)], suite=suite)
    report = build.build_report(out)
    muon_a = crossing([(0, 0.0, 2.0, 0.1), (10, 2.0, 0.1, 0.7)], 0.5)[1]
    ratios = report.profile_seconds.ratios
    assert ratios.loc["a", "muon"] == 1.0 and ratios.loc["a", "adamw"] == 8.0 / muon_a
    assert ratios.loc["b", "adamw"] == 1.0 and math.isinf(ratios.loc["b", "muon"])
    rho = report.profile_seconds.rho([1.0, 4.0])
    assert rho["muon"].tolist() == [0.5, 0.5]
    assert rho["adamw"].tolist() == [0.5, 0.5 if 8.0 / muon_a > 4 else 1.0]
    # Ranks by final accuracy (maximised): muon 0.7 beats adamw 0.6 on both suites.
    assert report.ranks.mean.to_dict() == {"adamw": 2.0, "muon": 1.0}


def test_sweeps_reruns_and_filters(cli, tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    for lr, speed in ((0.01, 3.0), (0.1, 1.0), (10.0, None)):
        for seed in range(2):
            if speed is None:
                write_run(
                    out,
                    f"sgd-{lr}-{seed}",
                    "sgd",
                    seed,
                    [(0, 0.0, 2.0, 0.1), (3, 0.3, 9.0, 0.0)],
                    status="diverged",
                    hparams={"lr": lr},
                )
            else:
                write_run(
                    out,
                    f"sgd-{lr}-{seed}",
                    "sgd",
                    seed,
                    [(0, 0.0, 2.0, 0.1), (10, speed, 0.2, 0.8)],
                    hparams={"lr": lr},
                    final_train_loss=0.3 if lr == 0.01 else 0.2,
                )
    write_run(out, "adamw-old", "adamw", 0, [(0, 0.0, 2.0, 0.1), (10, 5.0, 0.2, 0.8)], started=T0)
    write_run(out, "adamw-new", "adamw", 0, [(0, 0.0, 2.0, 0.1), (10, 4.0, 0.2, 0.8)], started=T0 + timedelta(days=2))
    report = build.build_report(out, plotted=True)
    suite = report.suites[0]
    assert [v.label for v in suite.variants] == ["adamw", "sgd lr=0.01", "sgd lr=0.1", "sgd lr=10"]
    assert suite.selected["sgd"].label == "sgd lr=0.1"  # lower final training loss (0.2 against 0.3)
    adamw = suite.selected["adamw"]
    assert adamw.variant.run_ids == ["adamw-new"]  # the latest run of seed 0 counts
    assert list(suite.superseded["run_id"]) == ["adamw-old"]
    assert any("superseded" in note for note in suite.notes)
    figures = render.render_figures(report, workers=1, cache=False)
    sweep = next(f for f in figures if f.name == "hand-sweeps")
    assert {"sgd-10.0-0", "sgd-0.01-1"} <= set(sweep.run_ids)
    # --since drops the old run entirely; --optim keeps the baseline; --baseline changes the reference.
    since = build.build_report(out, since=pd.Timestamp("2025-03-02", tz="UTC"))
    assert set(since.runs["run_id"]) == {"adamw-new"}
    only = cli("report", "--out", out, "--optim", "sgd")
    assert only.exit_code == 0 and "adamw" in only.stdout and "sgd lr=0.1" in only.stdout
    assert "hand: every setting" not in only.stdout and "lists all 4 settings" in only.stdout
    against_sgd = cli("report", "--out", out, "--baseline", "sgd")
    assert "4.00x" not in against_sgd.stdout and "0.25x" in against_sgd.stdout  # adamw 4 s vs sgd 1 s


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "pdf"), "--format must be term, md, html or all"),
        (("--since", "yesterday-ish"), "--since expects a date"),
    ],
)
def test_bad_report_options_are_one_line_exit_2(cli, hand_store, args, message):
    result = cli("report", "--out", hand_store, *args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--suite", "hnad"), "no runs of suite 'hnad' in {out}. Did you mean 'hand'? Stored: hand."),
        (
            ("--optim", "mouon"),
            "no runs of optimizer 'mouon' in {out}. Did you mean 'muon'? Stored: adamw, lion, muon,",
        ),
        (("--baseline", "adam"), "no runs of optimizer 'adam' in {out}. Did you mean 'adamw'? Stored: adamw, lion,"),
        (("--suite", "hand", "--optim", "fizmo"), "no runs of optimizer 'fizmo' in {out} for suite(s) hand. Stored:"),
        (("--since", "2030-01-01"), "no runs in {out} started at or after 2030-01-01T00:00:00+00:00 (the latest:"),
    ],
)
def test_a_filter_that_matches_nothing_is_exit_2_with_did_you_mean(cli, hand_store, args, message):
    result = cli("report", "--out", hand_store, *args)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: " + message.format(out=hand_store))


def test_store_without_analytic_column_shows_a_dash(cli, tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    write_run(out, "old-0", "adamw", 0, adamw_evals(0))
    path = out / "runs" / "old-0.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["analytic_state_bytes", "routing"]), path)
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    assert "state (analytic)" in result.stdout
    suite = build.build_report(out).suites[0]
    assert math.isnan(suite.selected["adamw"].analytic_state_bytes)
    table = tables.suite_table(suite)
    names = [c.name for c in table.columns]
    row = table.rows[0]
    assert row[names.index("state (analytic)")].text == "-" and row[names.index("routing")].text == "-"
    assert row[names.index("state (measured)")].text == "4.0 KiB"


@pytest.mark.parametrize("version", [0, 99])
def test_run_file_of_another_schema_version_is_warned_and_skipped(cli, tmp_path, version):
    out = tmp_path / "results"
    store.prepare(out)
    write_run(out, "a-0", "adamw", 0, adamw_evals(0))
    write_run(out, "a-1", "adamw", 1, [(0, 0.0, 2.0, 0.1), (20, 2.0, 0.05, 0.9)])
    path = out / "runs" / "a-1.parquet"
    table = pq.read_table(path)
    column = table.column_names.index("schema_version")
    pq.write_table(table.set_column(column, "schema_version", pa.array([version], pa.int32())), path)
    warning = {
        0: f"warning: skipped unreadable file {path}: schema_version 0 is not supported (this structbench reads 1)"
        f"; `structbench doctor --out {out} --repair` moves it to {out}/.quarantine",
        99: f"warning: skipped {path}: written by a newer structbench (schema 99): upgrade to read them",
    }[version]
    for _ in range(2):  # and again once the read cache exists: a rejected file is never cached
        result = cli("report", "--out", out)
        assert result.exit_code == 0, result.output
        assert result.stderr.splitlines() == [warning]
    adamw = build.build_report(out).suites[0].selected["adamw"]
    assert adamw.variant.run_ids == ["a-0"]
    assert adamw.final_loss.median == 0.2  # a-0's last loss; a-1's 0.05 is not read


def test_corrupt_curve_file_is_warned_and_the_run_falls_back(cli, tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    write_run(out, "a-0", "adamw", 0, adamw_evals(0), target_step=20, target_s=2.0)
    (out / "curves" / "a-0.parquet").write_bytes(b"not parquet")
    result = cli("report", "--out", out)
    assert result.exit_code == 0
    assert "a-0.parquet" in result.stderr
    assert "first-evaluation time" in result.stdout  # the runner's stored value stands in, and says so


def test_experiment_runs_list_their_claims(cli, tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    write_experiment_run(out, "error falls with iterations")
    write_run(out, "a-0", "adamw", 0, adamw_evals(0))
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    assert "Numerical experiments" in result.stdout and "error falls with iterations" in result.stdout
    report = build.build_report(out)
    assert [s.name for s in report.suites] == ["hand"]


def interpolated(curve: pd.DataFrame, target: float) -> tuple[float, float]:
    evals = curve[curve.split == "eval"].sort_values("step")
    points = list(zip(evals.step, evals.wall_s, evals.metric, strict=True))
    for (s0, w0, v0), (s1, w1, v1) in itertools.pairwise(points):
        if v1 <= target:
            f = (v0 - target) / (v0 - v1)
            return s0 + f * (s1 - s0), w0 + f * (w1 - w0)
    return math.inf, math.inf


def test_report_of_real_cli_runs_matches_the_store(cli, tmp_path):
    out = tmp_path / "results"
    args = ("--suite", "quadratic", "--steps", "50", "--set", "budget.eval_every=10", "--set", "target.value=0.05")
    args += ("--quiet", "--out", out)
    assert cli("run", *args, "--seed", "0", "--seed", "1", "--seed", "2").exit_code == 0
    runs, curves = read_runs(out), read_curves(out)
    report = build.build_report(out, plotted=True)
    suite = report.suites[0]
    for optim in ("sgd", "adamw"):
        mine = runs[runs.optim == optim]
        summary = suite.selected[optim]
        assert summary.final_loss.median == float(np.median(mine.final_eval_loss))  # n = 3: the middle value
        hand = [interpolated(curves[curves.run_id == r], 0.05) for r in mine.run_id]
        assert all(math.isfinite(h[0]) for h in hand)
        assert summary.steps_to_target.median == statistics.median(h[0] for h in hand)
        assert summary.seconds_to_target.median == statistics.median(h[1] for h in hand)
        # The runner's target_step is the first evaluation at or past the target: never before the interpolation.
        assert all(h[0] <= t for h, t in zip(hand, mine.target_step, strict=True))
        assert summary.state_bytes == summary.analytic_state_bytes == mine.state_bytes.iloc[0]
    result = cli("report", "--out", out, "--format", "all", "--to", tmp_path / "rep")
    assert result.exit_code == 0, result.output
    assert "3 ok" in result.stdout and "rel_subopt" in result.stdout
    assert (tmp_path / "rep" / "report.html").stat().st_size > 50_000


def test_forked_figure_workers_give_the_same_figures(hand_store):
    report = build.build_report(hand_store, plotted=True)
    serial = render.render_figures(report, workers=1, cache=False)
    assert render.render_figures(report, workers=2, cache=False) == serial  # same PNG bytes, names and run ids


def test_the_report_is_frozen_out_of_the_garbage_collector_only_while_figures_are_drawn(hand_store, monkeypatch):
    from structbench.report.figures import plots

    report = build.build_report(hand_store, plotted=True)

    def collected(target: object) -> bool:
        """Whether the collector's generations hold the object (frozen ones sit in a permanent generation)."""
        return any(o is target for o in gc.get_objects())

    seen: list[bool] = []
    draw = plots.suite_figures
    monkeypatch.setattr(plots, "suite_figures", lambda *a: seen.append(collected(report.suites[0])) or draw(*a))
    assert collected(report.suites[0])
    render.render_figures(report, workers=1, cache=False)
    assert seen and not any(seen)  # frozen while drawing (each part of the suite's figures)
    assert collected(report.suites[0]) and gc.get_freeze_count() == 0  # and back in the collector's care after


def test_figure_cache_reuses_unchanged_suites_only(tmp_path, monkeypatch):
    from structbench.report.figures import figure_cache

    out = tmp_path / "results"
    store.prepare(out)
    for seed in range(2):
        write_run(out, f"adamw-{seed}", "adamw", seed, adamw_evals(seed))
    report = build.build_report(out, plotted=True)
    drawn = render.render_figures(report, workers=1)
    assert any(f.suite is None for f in drawn)
    colors = optimizer_looks(report.optims)
    suite = report.suites[0]
    assert figure_cache.load(out, suite.name, suite.digest, colors) == [f for f in drawn if f.suite == "hand"]
    with monkeypatch.context() as patched:  # every figure, the cross-suite ones included, now comes from the cache
        from structbench.report.figures import plots

        patched.setattr(plots, "suite_figures", lambda *a: pytest.fail("drew a suite's figures again"))
        patched.setattr(plots, "cross_suite_figures", lambda *a: pytest.fail("drew the cross-suite figures again"))
        assert render.render_figures(build.build_report(out, plotted=True), workers=1) == drawn
    write_run(out, "adamw-2", "adamw", 2, adamw_evals(2))
    changed = build.build_report(out, plotted=True)
    assert changed.suites[0].digest != suite.digest
    assert figure_cache.load(out, suite.name, changed.suites[0].digest, colors) is None
    assert "adamw-2" in render.render_figures(changed, workers=1)[1].run_ids


def test_throughput_column_is_the_median_over_seeds_and_absent_without_data(tmp_path):
    out = tmp_path / "results"
    store.prepare(out)
    for seed, rate in enumerate((900.0, 1500.0, 1200.0)):
        write_run(
            out, f"lm-{seed}", "adamw", seed, adamw_evals(seed), throughput_per_s=rate, throughput_unit="tokens/s"
        )
    write_run(out, "old-0", "adamw", 0, adamw_evals(0), suite="old")
    path = out / "runs" / "old-0.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["throughput_per_s", "throughput_unit"]), path)
    report = build.build_report(out)
    by_suite = {s.name: tables.suite_table(s) for s in report.suites}
    names = [c.name for c in by_suite["hand"].columns]
    cell = by_suite["hand"].rows[0][names.index("throughput")]
    assert (cell.text, cell.sub) == ("1,200", "tokens/s")
    assert "throughput" not in [c.name for c in by_suite["old"].columns]


def test_figure_cache_key_covers_every_report_module(tmp_path):
    """Figures depend on more than plots.py (targets, profiles, statistics): editing any module of the report
    package must give a different source digest, hence new figure-cache keys; an identical copy gives the same."""
    from structbench.report.figures import figure_cache

    package = Path(figure_cache.__file__).parent.parent
    copy = tmp_path / "report"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert figure_cache.source_digest(copy) == figure_cache.source_digest(package)
    for name in ("analysis/profiles.py", "analysis/targets.py", "analysis/stats.py", "figures/plots.py"):
        edited = copy / name
        original = edited.read_bytes()
        edited.write_bytes(original + b"\n")
        assert figure_cache.source_digest(copy) != figure_cache.source_digest(package), name
        edited.write_bytes(original)


def test_page_laid_out_while_figures_draw_is_the_page_rendered_after(hand_store):
    """The html/md text laid out before the figures exist, filled once forked workers drew them (handed each suite
    as it was built), is byte for byte the page rendered from finished figures; every figure sits in its slot exactly
    once."""
    from structbench.report.figures import plots
    from structbench.report.views import html, markdown

    drawing = render.Drawing(hand_store, workers=2, cache=False)
    report = build.build_report(hand_store, plotted=True, listeners=[drawing])
    pages = html.layout(report), markdown.layout(report)
    figures = drawing.figures(report)
    serial = render.render_figures(report, workers=1, cache=False)
    assert figures == serial and len(figures) >= 4
    whole = plots.suite_figures(report.suites[0], optimizer_looks(report.optims))  # in one call, not in parts
    assert [f for f in figures if f.suite is not None] == whole
    assert html.fill(pages[0], figures) == html.render(report, serial)
    assert markdown.fill(pages[1], figures) == markdown.render(report, serial)
    page = html.fill(pages[0], figures)
    for figure in figures:
        assert page.count(f'id="fig-{figure.name}"') == 1
        assert markdown.fill(pages[1], figures).count(f"({markdown.FIGURE_DIR}/{figure.name}.png)") == 1
    assert 'id="fig-' not in html.fill(pages[0], [])
    for figure in figures:  # each in its own section: the cross-suite ones before the first suite's heading
        at = page.index(f'id="fig-{figure.name}"')
        suite_at = page.index('<section id="suite-') if figure.suite is None else page.index(f"<h2>{figure.suite}</h2>")
        assert (at < suite_at) if figure.suite is None else (suite_at < at < page.index("</section>", suite_at))


@pytest.fixture(scope="module")
def three_suite_stores(tmp_path_factory) -> list[Path]:
    """Two stores of three suites; store B's sgd ran in one suite only, and a seed of adamw ran twice there."""
    root = tmp_path_factory.mktemp("three")
    stores = [root / "A", root / "B"]
    for out in stores:
        store.prepare(out)
        for suite in ("s1", "s2", "s3"):
            for seed in range(2):
                write_run(out, f"{suite}-adamw-{seed}", "adamw", seed, adamw_evals(seed), suite=suite)
                write_run(out, f"{suite}-muon-{seed}", "muon", seed, muon_evals(seed), suite=suite)
    write_run(stores[1], "s2-sgd-0", "sgd", 0, adamw_evals(2), suite="s2")
    write_run(stores[1], "s3-adamw-0-again", "adamw", 0, adamw_evals(1), suite="s3")
    return stores


class Heard:
    """A build.SuiteListener that writes down what it hears."""

    def __init__(self) -> None:
        self.suites: int | None = None
        self.optims: list[str] = []
        self.suites_built: list[tuple[int, str]] = []

    def begin(self, suites: int, optims: list[str]) -> None:
        self.suites, self.optims = suites, list(optims)

    def built(self, index: int, suite: build.SuiteReport) -> None:
        self.suites_built.append((index, suite.name))


def test_the_listener_hears_every_suite_in_order_and_the_reports_optimizers_first(three_suite_stores):
    heard = Heard()
    report = build.build_report(three_suite_stores, plotted=True, listeners=[heard])
    assert heard.suites == len(report.suites) == 3
    assert heard.optims == report.optims  # the looks fixed before the first suite are the report's
    assert f"sgd [{three_suite_stores[1]}]" in heard.optims
    assert heard.suites_built == [(i, s.name) for i, s in enumerate(report.suites)]


def test_a_suites_figures_go_to_the_workers_before_the_next_suite_is_built(three_suite_stores, monkeypatch):
    """On two cores the second draws while the first builds: the first suite's parts are handed over (and the
    workers forked) as soon as it is built."""
    from structbench.report.figures import plots

    built: list[str] = []
    handed: list[tuple[int, str]] = []
    frozen: list[int] = []
    build_suite = build.build_suite
    monkeypatch.setattr(build, "build_suite", lambda *a, **k: built.append(a[0]) or build_suite(*a, **k))
    add = parallel.Workers.add

    def counted(self, task):
        handed.append((len(built), task[0].name))
        add(self, task)
        frozen.append(gc.get_freeze_count())  # what exists when the workers are forked is frozen (parallel.py)

    monkeypatch.setattr(parallel.Workers, "add", counted)
    drawing = render.Drawing(three_suite_stores[0], workers=2, cache=False)
    report = build.build_report(three_suite_stores[0], plotted=True, listeners=[drawing])
    figures = drawing.figures(report)
    assert handed[: plots.SUITE_PARTS] == [(1, "s1")] * plots.SUITE_PARTS
    assert frozen[0] > 0 and gc.get_freeze_count() == 0
    assert [name for _, name in handed] == [s.name for s in report.suites for _ in range(plots.SUITE_PARTS)]
    assert figures == render.render_figures(report, workers=1, cache=False)
    assert multiprocessing.active_children() == []


def test_a_report_that_fails_while_building_leaves_no_worker_running(three_suite_stores, monkeypatch, tmp_path, cli):
    build_suite = build.build_suite

    def fails_on_the_second(*args, **kwargs):
        if args[0] == "s2":
            raise RuntimeError("broken suite")
        return build_suite(*args, **kwargs)

    monkeypatch.setattr(build, "build_suite", fails_on_the_second)
    monkeypatch.setattr(render, "workers_for", lambda tasks, minimum: 2)  # forked for one suite of three
    with pytest.raises(RuntimeError, match="broken suite"):
        cli("report", "--out", three_suite_stores[0], "--format", "html", "--to", tmp_path / "rep")
    assert multiprocessing.active_children() == []
    assert gc.get_freeze_count() == 0


FORKING_REPORT = """
import sys
from structbench.report import parallel
from structbench.cli.app import app

parallel.usable_cores = lambda: 2  # forked workers on a machine of one core too
sys.argv = ["structbench", "report", *sys.argv[1:]]
app()
"""


def test_killing_a_report_ends_its_figure_workers(three_suite_stores, tmp_path):
    """kill -9 of `structbench report` while its forked workers draw the figures: the workers end with it."""
    command = [sys.executable, "-c", FORKING_REPORT, "--out", str(three_suite_stores[0]), "--format", "html"]
    command += ["--to", str(tmp_path / "rep")]
    report = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_once_two_workers_run(report)


def test_a_worker_whose_parent_already_ended_ends_at_once():
    """The parent may end between the fork and the worker's request to be signalled: then the worker ends itself."""
    child = multiprocessing.get_context("fork").Process(target=parallel._end_with, args=(-1,))  # not its parent
    child.start()
    child.join(10)
    assert child.exitcode == 1


_PARENT = os.getpid()


def _dies_in_a_worker(task: int) -> int:
    if os.getpid() != _PARENT:
        os._exit(1)  # the worker process dies: the pool breaks
    return task * task


def test_tasks_of_a_broken_worker_pool_run_here_with_the_same_results():
    from structbench.report.parallel import Workers

    workers = Workers(_dies_in_a_worker, 2)
    for task in (1, 2, 3, 4):
        workers.add(task)
    assert workers.forked
    assert workers.results() == [1, 4, 9, 16]


def test_markdown_blocks_are_set_apart_by_blank_lines(hand_report):
    """CommonMark: a GitHub table only starts after a blank line when it follows a paragraph, and every heading here
    opens a section: each heading and each table's first row follows a blank line."""
    from structbench.report.views import markdown

    lines = markdown.render(hand_report, render.render_figures(hand_report, workers=1)).split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("#") or line.startswith("|")]
    firsts = [i for i in starts if not (lines[i].startswith("|") and lines[i - 1].startswith("|"))]
    assert len(firsts) >= 10 and all(i == 0 or lines[i - 1] == "" for i in firsts)


def test_a_toned_cell_keeps_its_columns_alignment(hand_report):
    """The failed run's status is text (a left-aligned column, class "l") and a failure (class "bad"): both."""
    from structbench.report.views import html

    assert '<td class="l bad"><span>diverged</span></td>' in html.render(hand_report, [])
