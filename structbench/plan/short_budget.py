"""`run --steps N`: a shortened budget keeps enough evaluations to time a target and draw a curve.

A suite's `eval_every` and `log_every` are chosen for its own budget; cut to N steps, a run of `shakespeare-llama`
(300 steps, an evaluation every 50) would be evaluated at steps 0 and N only, and time to target would be a straight
line between the two. So when the suite's values would leave fewer than MIN_EVALUATIONS evaluations in N steps
(counting the one before training and the final one), `--steps N` shortens both in proportion:

- the suite's evaluation intervals k: ceil(steps / eval_every) for a budget in steps, ceil(epochs) for a budget in
  epochs evaluated at every epoch's end (eval_every 0); at least MIN_EVALUATIONS - 1;
- eval_every becomes max(1, floor(N / k)), so the N steps hold at least k intervals, as the suite's budget did;
- log_every is scaled by the same factor as the budget, max(1, round(log_every * N / steps)), never above the new
  eval_every; for a budget in epochs (whose length in steps depends on the data) it is capped at the new eval_every.

A suite whose budget in steps says eval_every 0 (evaluate at the start and the end only), or whose budget in epochs
sets its own eval_every (its length in steps depends on the data), is left as it is, and so is a budget whose
eval_every or log_every the command line sets itself (`--set budget.eval_every=...`). The shortened values are part
of the effective spec each run stores; the command prints what it changed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from structbench.plan.spec import BUDGET_DEFAULTS, SuiteSpec, read_suite_file

MIN_EVALUATIONS = 5
SHORTENED = ("eval_every", "log_every")


def evaluations(steps: int, eval_every: int) -> int:
    """Evaluations of a run of `steps` steps: the one before training, one every `eval_every` steps, the last."""
    if eval_every <= 0:
        return 2
    return 1 + math.ceil(steps / eval_every)


def _suite_budget(suite: SuiteSpec) -> dict[str, object]:
    """The budget the suite file itself declares, with the defaults filled in."""
    return {**BUDGET_DEFAULTS, **read_suite_file(suite.source)[2].get("budget", {})}


def shorten(suite: SuiteSpec, steps: int) -> tuple[SuiteSpec, str]:
    """The suite with eval_every and log_every shortened for `steps` steps (module docstring), and what changed
    ("" when nothing did)."""
    budget = suite.budget
    if evaluations(steps, int(budget["eval_every"])) >= MIN_EVALUATIONS:
        return suite, ""
    own = _suite_budget(suite)
    own_steps, own_epochs, own_eval = int(own["steps"]), float(own["epochs"]), int(own["eval_every"])
    if own_epochs > 0 and own_eval <= 0:
        intervals = math.ceil(own_epochs)
    elif own_eval > 0 and own_epochs <= 0:
        intervals = math.ceil(own_steps / own_eval)
    else:
        return suite, ""
    eval_every = max(1, steps // max(intervals, MIN_EVALUATIONS - 1))
    log_every = int(budget["log_every"])
    if own_epochs <= 0:
        log_every = max(1, round(log_every * steps / own_steps))
    log_every = min(log_every, eval_every)
    shortened = {**budget, "eval_every": eval_every, "log_every": log_every}
    changes = [f"{k} {budget[k]} -> {shortened[k]}" for k in SHORTENED if shortened[k] != budget[k]]
    note = (
        f"{suite.name}: --steps {steps} shortens {' and '.join(changes)}, so each run is evaluated "
        f"{evaluations(steps, eval_every)} times instead of {evaluations(steps, int(budget['eval_every']))}."
    )
    return dataclasses.replace(suite, budget=shortened), note


def apply(suites: Sequence[SuiteSpec], steps: int, overrides: Sequence[str]) -> tuple[list[SuiteSpec], list[str]]:
    """Every suite shortened for `--steps` (unless `overrides`, the `--set` assignments, set either field), and a
    note per suite that changed."""
    given = {assignment.partition("=")[0].strip() for assignment in overrides}
    if given & {f"budget.{k}" for k in SHORTENED}:
        return list(suites), []
    result, notes = [], []
    for suite in suites:
        if suite.experiment is not None:
            result.append(suite)
            continue
        shortened, note = shorten(suite, steps)
        result.append(shortened)
        notes += [note] if note else []
    return result, list(dict.fromkeys(notes))
