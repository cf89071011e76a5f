"""Tests for the solver-failure policy of structbench.optim.base.StructuredOptimizer: `solver_failed`, `solver_ok`
and `end_on_solver_streaks`.

What each test checks against: the policy as the optimizers' docstrings state it, counted by hand. Every failure
adds to the run's `solver_failures`; the third failure in a row of one streak raises SolverError with the
optimizer's message; a success ends the streak; a streak keeps its storage (a Python int, an int64 CPU tensor
updated in place, or an entry present only while it runs), so a state dict that holds it round-trips unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from structbench.errors import SolverError
from structbench.optim.base import StructuredOptimizer
from structbench.optim.hparams import Declaration, ours, real


class _Probe(StructuredOptimizer):
    """The smallest StructuredOptimizer: one declared hyperparameter and no step."""

    hparams = Declaration(real("lr", 0.1, ours("test"), "(0, inf)"))


def _probe() -> _Probe:
    return _Probe([nn.Parameter(torch.zeros(2, 2))])


def _message(streak: int) -> str:
    return f"probe failed {streak} times in a row"


def test_the_third_consecutive_failure_raises_with_the_streak_in_the_message() -> None:
    opt, streaks = _probe(), {"streak": 0}
    opt.solver_failed(streaks, "streak", _message)
    opt.solver_failed(streaks, "streak", _message)
    assert streaks == {"streak": 2} and opt.solver_failures == 2
    with pytest.raises(SolverError, match=r"^probe failed 3 times in a row$"):
        opt.solver_failed(streaks, "streak", _message)
    assert streaks == {"streak": 3} and opt.solver_failures == 3


def test_a_success_ends_the_streak_but_not_the_runs_total() -> None:
    opt, streaks = _probe(), {"streak": 0}
    for _ in range(2):
        opt.solver_failed(streaks, "streak", _message)
    opt.solver_ok(streaks, "streak")
    assert streaks == {"streak": 0} and opt.solver_failures == 2
    for _ in range(2):
        opt.solver_failed(streaks, "streak", _message)
    assert streaks == {"streak": 2} and opt.solver_failures == 4
    with pytest.raises(SolverError):
        opt.solver_failed(streaks, "streak", _message)


def test_failures_counts_the_runs_total_apart_from_the_streak() -> None:
    opt, streaks = _probe(), {}
    opt.solver_failed(streaks, "streak", _message, failures=3)
    opt.solver_failed(streaks, "streak", _message, failures=0)
    assert streaks == {"streak": 2} and opt.solver_failures == 3


def test_an_absent_streak_starts_at_zero_and_a_success_stores_zero() -> None:
    opt, streaks = _probe(), {}
    opt.solver_ok(streaks, "streak")
    assert streaks == {"streak": 0} and type(streaks["streak"]) is int
    opt.solver_failed(streaks, "streak", _message)
    assert streaks == {"streak": 1} and type(streaks["streak"]) is int


def test_a_forgotten_streak_is_stored_only_while_it_runs() -> None:
    opt, p = _probe(), nn.Parameter(torch.zeros(3))
    streaks: dict[Any, int] = {}
    opt.solver_ok(streaks, p, forget=True)
    assert streaks == {}
    opt.solver_failed(streaks, p, _message)
    assert streaks == {p: 1}
    opt.solver_ok(streaks, p, forget=True)
    assert streaks == {}


def test_a_tensor_streak_is_counted_in_place_and_keeps_its_dtype_and_device() -> None:
    opt = _probe()
    counter = torch.zeros((), dtype=torch.int64)
    streaks = {"streak": counter}
    opt.solver_failed(streaks, "streak", _message)
    opt.solver_failed(streaks, "streak", _message)
    assert streaks["streak"] is counter and int(counter) == 2
    assert counter.dtype == torch.int64 and counter.device.type == "cpu"
    opt.solver_ok(streaks, "streak")
    assert streaks["streak"] is counter and int(counter) == 0
    for _ in range(2):
        opt.solver_failed(streaks, "streak", _message)
    with pytest.raises(SolverError, match=r"^probe failed 3 times in a row$"):
        opt.solver_failed(streaks, "streak", _message)


def test_a_deferred_check_counts_every_failure_of_the_step_before_raising() -> None:
    opt = _probe()
    states = [{"streak": 2}, {"streak": 2}, {"streak": 0}]
    for state in states:
        opt.solver_failed(state, "streak", None, failures=2)
    assert [state["streak"] for state in states] == [3, 3, 1] and opt.solver_failures == 6
    with pytest.raises(SolverError, match=r"^probe failed 3 times in a row$"):
        opt.end_on_solver_streaks(states, "streak", _message)
    opt.end_on_solver_streaks(states[2:], "streak", _message)


def test_a_streak_in_optimizer_state_survives_a_state_dict_round_trip() -> None:
    p = nn.Parameter(torch.zeros(2, 2))
    opt = _Probe([p])
    opt.state[p]["streak"] = torch.zeros((), dtype=torch.int64)
    opt.state[p]["count"] = 0
    for key in ("streak", "count"):
        opt.solver_failed(opt.state[p], key, _message)
        opt.solver_failed(opt.state[p], key, _message)
    resumed = _Probe([p])
    resumed.load_state_dict(opt.state_dict())
    assert resumed.state[p]["count"] == 2 and type(resumed.state[p]["count"]) is int
    assert resumed.state[p]["streak"].dtype == torch.int64 and int(resumed.state[p]["streak"]) == 2
    for key in ("streak", "count"):
        with pytest.raises(SolverError):
            resumed.solver_failed(resumed.state[p], key, _message)
