"""The quickstart's main job, `structbench run --suite quadratic`, compares the structured optimizers with the
first-order baselines, at settings whose refresh intervals all act within its budget."""

from __future__ import annotations

from structbench.plan import spec

STRUCTURED = ["muon", "shampoo", "soap", "asgo", "fismo"]
INTERVALS = {
    "shampoo": ("stat_interval", "root_interval"),
    "soap": ("precondition_frequency",),
    "asgo": ("tau",),
    "fismo": ("precond_every",),
}
"""Each optimizer's hyperparameters that say every how many steps a statistic or preconditioner is refreshed."""
DECAY_KEYS = ("weight_decay", "sgd_weight_decay")


def test_the_quadratic_suite_runs_the_baselines_and_the_structured_optimizers():
    (suite,), _ = spec.load_suites("quadratic")
    assert suite.optims == ["sgd", "adamw", *STRUCTURED]
    assert suite.seeds == [0, 1, 2]


def test_every_refresh_interval_acts_at_least_ten_times_within_the_budget():
    (suite,), _ = spec.load_suites("quadratic")
    steps = suite.budget["steps"]
    for optim_name, keys in INTERVALS.items():
        for key in keys:
            assert suite.hparams[optim_name][key] * 10 <= steps, (optim_name, key)


def test_no_optimizer_decays_its_weights_so_the_optimum_is_the_problems():
    (suite,), _ = spec.load_suites("quadratic")
    for optim_name, hparams in suite.hparams.items():
        # the optimizer's own decay, and for shampoo its active SGD base's
        assert all(hparams[key] == 0.0 for key in DECAY_KEYS if key in hparams), optim_name


def test_a_short_run_of_the_suite_reports_every_optimizer(cli, tmp_path):
    out = tmp_path / "results"
    result = cli("run", "--suite", "quadratic", "--seed", "0", "--steps", "5", "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    report = cli("report", "--out", out)
    assert report.exit_code == 0, report.output
    rows = {line.split("│")[1].strip() for line in report.stdout.splitlines() if line.count("│") > 3}
    assert {"sgd", "adamw", *STRUCTURED} <= rows
