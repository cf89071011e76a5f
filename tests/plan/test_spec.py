"""Suite resolution: defaults, typed overrides, includes, validation."""

from __future__ import annotations

import math

import pytest

from structbench import optim
from structbench.errors import UsageError
from structbench.plan import spec, suite_file


def test_every_builtin_suite_resolves():
    for name in suite_file.suite_names():
        suites, _ = spec.load_suites(name)
        assert suites and all((s.optims or s.experiment) and s.seeds for s in suites)


def test_defaults_fill_in_and_overrides_are_typed():
    (suite,), _ = spec.load_suites(
        "quadratic", ["budget.steps=12", "hparams.sgd.nesterov=true", "task_args.cond_left=5", "seeds=[3, 4]"]
    )
    assert suite.budget["steps"] == 12
    assert suite.hparams["sgd"]["nesterov"] is True
    assert suite.task_args["cond_left"] == 5.0 and isinstance(suite.task_args["cond_left"], float)
    assert suite.seeds == [3, 4]
    assert suite.hparams["adamw"]["beta2"] == optim.get("adamw").defaults["beta2"]
    assert suite.target == {"metric": "rel_subopt", "value": 0.01, "from_baseline": ""}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("budget.steps=1.5", "must be of type int"),
        ("hparams.sgd.nesterov=1", "must be of type bool"),
        ("task_args.spectrum=3", "must be of type str"),
        ("budget=3", "unknown key"),
        ("hparams.muonx.lr=1", "unknown key 'hparams.muonx.lr'"),
        ("seeds=[1.5]", "seeds must be a non-empty list of integers"),
        ("budget.steps=0", "budget.steps must be >= 1"),
        ("schedule.kind=exponential", "unknown schedule.kind"),
    ],
)
def test_bad_overrides_are_usage_errors(override, message):
    with pytest.raises(UsageError, match=message):
        spec.load_suites("quadratic", [override])


def test_include_expands_children_and_keeps_the_parent_checks():
    suites, checks = spec.load_suites("smoke", optims=["sgd"])
    assert [s.name for s in suites] == ["smoke-quadratic", "smoke-mlp"]
    assert all(s.optims == ["sgd"] for s in suites)
    assert checks == {"require_ok": True, "require_loss_decrease": True}


def test_star_means_every_registered_optimizer():
    (suite,), _ = spec.load_suites("smoke-quadratic")
    assert suite.optims == optim.names()


def test_unknown_suite_field_is_reported(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('task = "quadratic"\nbudjet = {steps = 3}\n')
    with pytest.raises(UsageError, match="unknown field"):
        spec.load_suites(str(path))
    path.write_text("task = [")
    with pytest.raises(UsageError, match="not valid TOML"):
        spec.load_suites(str(path))


def test_run_spec_drops_an_unset_target():
    (suite,), _ = spec.load_suites("smoke-mlp", optims=["adamw"])
    assert math.isnan(suite.target["value"])
    assert suite.run_spec("adamw", 0)["target"] is None
