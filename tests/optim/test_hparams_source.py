"""Where each run's hyperparameters come from is stored in its spec (`hparams_source`), outside the run key."""

from __future__ import annotations

from structbench.plan import grid, spec


def _sources(suite: str, *overrides: str, optims: tuple[str, ...] = (), sweep: bool = False) -> dict[str, set[str]]:
    suites, _ = spec.load_suites(suite, list(overrides), list(optims), [], sweep)
    found: dict[str, set[str]] = {}
    for s in suites:
        for o in s.optims:
            found.setdefault(o, set()).add(s.run_spec(o, 0)["hparams_source"])
    return found


def test_listed_optimizers_are_the_suites_and_others_registry_defaults():
    # digits lists sgd and sets its hyperparameters; sumo is not in its list and has no [hparams.sumo] table.
    assert _sources("digits", optims=("sgd", "sumo")) == {"sgd": {"suite"}, "sumo": {"registry defaults"}}
    # smoke-quadratic runs every optimizer ("*"); adamw has no [hparams.adamw] table there: registry defaults.
    assert _sources("smoke-quadratic", optims=("adamw",)) == {"adamw": {"registry defaults"}}


def test_command_line_and_sweeps_name_themselves():
    baselines = ("sgd", "adamw")
    from_command_line = _sources("quadratic", "hparams.sgd.lr=0.3", optims=baselines)
    assert from_command_line == {"sgd": {"command line"}, "adamw": {"suite"}}
    assert _sources("quadratic", sweep=True, optims=baselines) == {"sgd": {"sweep"}, "adamw": {"sweep"}}


def test_the_source_is_not_part_of_the_run_key():
    [listed], _ = spec.load_suites("quadratic", [], ["sgd"])
    default = spec.SuiteSpec(**{**vars(listed), "hparams_source": {"sgd": "registry defaults"}})
    assert grid.run_key(listed, "sgd", 0, "cpu") == grid.run_key(default, "sgd", 0, "cpu")
