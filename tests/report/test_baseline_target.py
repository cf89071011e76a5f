"""Targets from a baseline's final value (`target.from_baseline`, RACS/Alice Table 2): spec, report, CLI.

Expected numbers are computed here by hand from the values written into the store.
"""

from __future__ import annotations

import html
import json
import math
import statistics
from pathlib import Path

import pytest

from structbench.errors import UsageError
from structbench.plan import spec
from structbench.report import build
from structbench.report.views import tables
from structbench.store import write as store
from tests.support.report_tables import cells
from tests.support.store import read_runs, write_run

FROM_ADAMW = {"metric": "perplexity", "from_baseline": "adamw"}
PERPLEXITY = {"eval_metric_name": "perplexity", "eval_metric_mode": "min"}

# Baseline: final perplexities 10, 12, 11 at step 20 -> T = 11; training seconds and tokens/s per seed.
ADAMW_FINALS = (10.0, 12.0, 11.0)
ADAMW_SECONDS = (2.0, 2.4, 2.2)
ADAMW_RATES = (1000.0, 1100.0, 900.0)
T = 11.0
# A candidate crossing 11 between (step 5, 0.5 s, ppl 15) and (step 10, 1.1 s, ppl 9), and one that never does.
MUON = [(0, 0.0, 40.0), (5, 0.5, 15.0), (10, 1.1, 9.0), (20, 2.0, 7.0)]
SGD = [(0, 0.0, 40.0), (10, 1.0, 20.0), (20, 2.0, 15.0)]


def evals(points: list[tuple[int, float, float]]) -> list[tuple[int, float, float, float]]:
    """(step, seconds, perplexity) -> write_run's (step, seconds, loss, metric) with loss = ln(perplexity)."""
    return [(s, w, math.log(p), p) for s, w, p in points]


def adamw_points(seed: int) -> list[tuple[int, float, float]]:
    wall = ADAMW_SECONDS[seed]
    return [(0, 0.0, 40.0), (10, wall / 2, 20.0), (20, wall, ADAMW_FINALS[seed])]


def write_derived_store(out: Path, adamw_status: str = "ok") -> None:
    store.prepare(out)
    for seed in range(3):
        write_run(
            out,
            f"adamw-{seed}",
            "adamw",
            seed,
            evals(adamw_points(seed)),
            status=adamw_status,
            target=FROM_ADAMW,
            throughput_per_s=ADAMW_RATES[seed],
            throughput_unit="tokens/s",
            **PERPLEXITY,
        )
    write_run(out, "muon-0", "muon", 0, evals(MUON), target=FROM_ADAMW, **PERPLEXITY)
    write_run(out, "sgd-0", "sgd", 0, evals(SGD), target=FROM_ADAMW, **PERPLEXITY)


@pytest.fixture
def derived_store(tmp_path) -> Path:
    out = tmp_path / "results"
    write_derived_store(out)
    return out


def test_target_is_the_baseline_median_final_and_speedups_use_its_total_budget(derived_store):
    [suite] = build.build_report(derived_store).suites
    table = tables.suite_table(suite)
    assert statistics.median(ADAMW_FINALS) == T
    assert f"perplexity <= {T:g} (adamw's final test value, median of 3 seeds)" in table.caption  # no val split

    f = (15.0 - T) / (15.0 - 9.0)
    steps, seconds = 5 + f * (10 - 5), 0.5 + f * (1.1 - 0.5)
    muon = cells(table, "muon")
    assert muon["steps to target (test)"].text == f"{steps:.4g}"
    assert muon["time to target (test)"].text == f"{seconds * 1e3:.3g} ms"
    total_steps, total_seconds = 20, statistics.median(ADAMW_SECONDS)
    assert muon["speed-up (steps)"].text == f"{total_steps / steps:.2f}x"
    assert muon["speed-up (time)"].text == f"{total_seconds / seconds:.2f}x"
    # Tokens each adamw run trained on: its rate covers steps 2..20 (step 1's 0.01 s is compile_s), 20 equal steps.
    tokens = statistics.median(r * (w - 0.01) * 20 / 19 for r, w in zip(ADAMW_RATES, ADAMW_SECONDS, strict=True))
    assert (muon["effective throughput"].text, muon["effective throughput"].sub) == (
        f"{tokens / seconds:,.0f}",
        "tokens/s",
    )

    sgd = cells(table, "sgd")
    for column in (
        "steps to target (test)",
        "time to target (test)",
        "speed-up (steps)",
        "speed-up (time)",
        "effective throughput",
    ):
        assert sgd[column].text == "not reached", column


def test_baseline_row_shows_its_own_crossings_and_is_the_speedup_reference(derived_store):
    """Seed finals 10, 12, 11 against T = 11: seed 0 crosses between ppl 20 and 10 at step 10 + 0.9 x 10 = 19,
    seed 1 never does, seed 2 at its last evaluation (step 20); the median is 20. Its speed-ups are 1 by definition
    (with an even number of seeds its median crossing can be "not reached": half its seeds end above the median)."""
    [suite] = build.build_report(derived_store).suites
    adamw = cells(tables.suite_table(suite), "adamw")
    crossings = [10 + (20 - T) / (20 - 10) * 10, math.inf, 20.0]
    assert adamw["steps to target (test)"].text == f"{statistics.median(crossings):.4g}"
    for column in ("speed-up (steps)", "speed-up (time)"):
        assert (adamw[column].text, adamw[column].sub) == ("1x", "baseline"), column
    assert adamw["effective throughput"].sub == "baseline"


def test_every_format_shows_the_derived_target(cli, derived_store, tmp_path):
    text = "perplexity <= 11 (adamw's final test value, median of 3 seeds)"
    terminal = cli("report", "--out", derived_store)
    assert terminal.exit_code == 0, terminal.output
    assert "effective throughput" in terminal.stdout
    assert text in " ".join(terminal.stdout.split())
    written = cli("report", "--out", derived_store, "--format", "all", "--to", tmp_path / "rep")
    assert written.exit_code == 0, written.output
    for name in ("report.md", "report.html"):
        page = html.unescape((tmp_path / "rep" / name).read_text())
        assert text in page, name
        assert "Target from a baseline" in page and "Effective throughput" in page, name


def test_without_an_ok_baseline_run_the_target_is_unavailable(cli, tmp_path):
    out = tmp_path / "results"
    write_derived_store(out, adamw_status="diverged")
    [suite] = build.build_report(out).suites
    table = tables.suite_table(suite)
    assert "perplexity: unavailable: no ok adamw runs" in table.caption
    muon = cells(table, "muon")
    assert (muon["steps to target (test)"].text, muon["steps to target (test)"].sub) == ("-", "target unavailable")
    assert muon["speed-up (steps)"].text == "-"
    result = cli("report", "--out", out)
    assert result.exit_code == 0, result.output
    assert "unavailable: no ok adamw runs" in " ".join(result.stdout.split())


def write_suite(tmp_path: Path, target: str) -> str:
    path = tmp_path / "suite.toml"
    path.write_text(f'task = "quadratic"\noptims = ["sgd"]\n[target]\n{target}\n')
    return str(path)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ('metric = "loss"\nvalue = 0.5\nfrom_baseline = "adamw"', "exactly one of target.value .* got both"),
        ('metric = "loss"', "exactly one of target.value .* got neither"),
        ('from_baseline = "adamw"', "need target.metric"),
        ('metric = "loss"\nfrom_baseline = "adamx"', "unknown optimizer 'adamx'"),
    ],
)
def test_target_needs_a_metric_and_exactly_one_of_value_and_baseline(tmp_path, target, message):
    with pytest.raises(UsageError, match=message):
        spec.load_suites(write_suite(tmp_path, target))


def test_bad_target_is_one_line_exit_2(cli, tmp_path):
    result = cli("run", "--suite", "quadratic", "--set", "target.from_baseline=adamw", "--out", tmp_path / "r")
    assert result.exit_code == 2
    assert "got both" in result.stderr
    assert not (tmp_path / "r" / "runs").exists() or not any((tmp_path / "r" / "runs").iterdir())


def test_set_from_baseline_is_stored_with_the_run_spec(tmp_path):
    (suite,), _ = spec.load_suites(
        write_suite(tmp_path, 'metric = "loss"\nvalue = 0.5'),
        ["target.value=nan", "target.from_baseline=adamw"],
    )
    assert suite.run_spec("sgd", 0)["target"] == {"metric": "loss", "from_baseline": "adamw"}
    (fixed,), _ = spec.load_suites(write_suite(tmp_path, 'metric = "loss"\nvalue = 0.5'))
    assert fixed.run_spec("sgd", 0)["target"] == {"metric": "loss", "value": 0.5}


def test_cli_run_and_report_of_shakespeare_llama_derive_the_target_from_adamw(cli, tmp_path):
    out = tmp_path / "results"
    (tmp_path / "data").mkdir()
    result = cli(
        "run", "--suite", "shakespeare-llama", "--optim", "adamw", "--optim", "muon", "--steps", "6",
        "--out", out, "--data-dir", tmp_path / "data",
        "--set", "budget.batch_size=4", "--set", "budget.eval_every=3", "--set", "budget.log_every=1",
        "--set", "task_args.seq_len=32", "--set", "task_args.eval_tokens=512", "--set", "task_args.n_layer=1",
        "--quiet",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    runs = read_runs(out)
    assert set(runs.status) == {"ok"}
    assert runs.target_step.isna().all() and runs.target_s.isna().all()
    assert all(json.loads(s)["target"] == FROM_ADAMW for s in runs.spec)
    adamw = runs[runs.optim == "adamw"].iloc[0]
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    # The language task holds out a validation split: the target is adamw's final validation perplexity.
    assert adamw.final_val_metric != adamw.final_eval_metric
    expected = f"perplexity <= {adamw.final_val_metric:g} (adamw's final validation value, median of 1 seed)"
    assert expected in " ".join(report.stdout.split())
