"""Suites: declarative TOML files resolved into effective, fully-typed run specifications.

A suite file names a task and its arguments, a budget, an optional schedule and target, the optimizers
and seeds to run, and per-optimizer hyperparameters. A suite may instead `include` other suites (the
smoke suite does): it then runs each of them in turn. `--set section.key=value` overrides any field of
the effective spec; the value is parsed as TOML and must match the type of the field it replaces.

`run --steps N` sets every run's budget to N steps (dropping budget.epochs) as the suite is resolved, and keeps enough
evaluations to time a target and draw a curve. A suite's `eval_every` and `log_every` are chosen for its own budget;
cut to N steps, a run of `shakespeare-llama` (300 steps, an evaluation every 50) would be evaluated at steps 0 and N
only, and time to target would be a straight line between the two. So when the suite's values would leave fewer than
MIN_EVALUATIONS evaluations in N steps (counting the one before training and the final one), `--steps N` shortens both
in proportion:

- the suite's evaluation intervals k: ceil(steps / eval_every) for a budget in steps, ceil(epochs) for a budget in
  epochs evaluated at every epoch's end (eval_every 0); at least MIN_EVALUATIONS - 1;
- eval_every becomes max(MIN_EVAL_INTERVAL, floor(N / k)), so the N steps hold up to k intervals, as the suite's
  budget did, but never more evaluations than one every MIN_EVAL_INTERVAL steps (a 200-epoch suite cut to 40 steps
  is evaluated 21 times, not 41: each evaluation may read a whole test split);
- log_every is scaled by the same factor as the budget, max(1, round(log_every * N / steps)), never above the new
  eval_every; for a budget in epochs (whose length in steps depends on the data) it is capped at the new eval_every.

A suite whose budget in steps says eval_every 0 (evaluate at the start and the end only), or whose budget in epochs
sets its own eval_every (its length in steps depends on the data), is left as it is, and so is a budget whose
eval_every or log_every the command line sets itself (`--set budget.eval_every=...`). So is a budget whose N steps are
too few to hold MIN_EVALUATIONS - 1 intervals of MIN_EVAL_INTERVAL steps: such a run is a smoke check, evaluated
before training and at the end only (eval_every 0), and the note says so (`--steps 3` on a per-epoch suite gives 2
evaluations, not 4). A smoke check also runs without warm-up steps (budget.warmup_steps 0: its timings include the
first steps' setup, which it has no steady state to separate from) unless the suite file or the command line sets
budget.warmup_steps; the note says so. The shortened values are part of the effective spec each run stores; each spec
says what changed, or why nothing did, in its `budget_note`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structbench import optim
from structbench.errors import UsageError
from structbench.optim import plugins
from structbench.plan import suite_file, suite_lookup
from structbench.plan.schedule import SCHEDULE_DEFAULTS, validate_schedule
from structbench.plan.sweep import Search, Swept, declared_sweep, grid_points, parse_swept, suite_sweep_table
from structbench.tasks import get_task

BUDGET_DEFAULTS: dict[str, Any] = {
    "steps": 100,
    "epochs": 0.0,
    "batch_size": 64,
    "grad_accum": 1,
    "grad_clip": 0.0,
    "eval_every": 0,
    "log_every": 1,
    "max_time_s": 0.0,
    "checkpoint_every": 0,
    "warmup_steps": 2,
    "empty_cache": False,
}
"""`epochs` > 0 replaces `steps` by epochs x the task's steps per epoch (and, with `eval_every` 0, evaluates at every
epoch's end); `batch_size` counts examples per optimizer step, split into `grad_accum` equal micro-batches;
`grad_clip` > 0 clips the global gradient norm to that value before each optimizer step; `max_time_s` > 0 ends a run
whose training loop (steps and evaluations) has run that many seconds with status `timeout`, at the end of the step
that crossed the limit, keeping the curves so far; `checkpoint_every` > 0 saves a checkpoint every that many steps
(structbench.execution.checkpoint), from which a rerun of the run continues; `warmup_steps` of the run's real steps
run untimed before its clock starts and are undone (structbench.execution.warmup: first kernel launches stay out of
time to target; 2 covers the optimizer's first step, which builds its state, and its first steady step); `empty_cache`
empties CUDA's allocator cache before the run (off: the run's growth to its working set would be timed)."""
TARGET_DEFAULTS: dict[str, Any] = {"metric": "", "value": math.nan, "from_baseline": ""}
"""A target names a `metric` (the task's metric or "loss") and exactly one of a fixed `value` and `from_baseline`, an
optimizer whose final evaluation of the metric (median over its seeds) becomes the target when the report is made."""
CHECK_DEFAULTS: dict[str, Any] = {"require_ok": False, "require_loss_decrease": False}
INT64_RANGE = (-(2**63), 2**63 - 1)
SEED_RANGE = INT64_RANGE
"""The seeds a run may take: the results store keeps a seed in an int64 column. torch.manual_seed and
torch.Generator.manual_seed accept [-2^63, 2^64 - 1] (a negative seed wraps modulo 2^64; tried with torch 2.13), so
every seed in this range, and the seed + 1 a task draws its batches with, is one torch takes."""


HPARAMS_SOURCES = ("sweep", "command line", "suite", "registry defaults")
"""Where a run's hyperparameters come from, stored with it (`hparams_source`): a sweep of settings (the report selects
one on validation), `--set hparams.<optim>.*`, the suite file (the optimizer is in its `optims` list or has an
`[hparams.<optim>]` table: tuned for the suite or the paper's values it chose), or the registry's defaults for an
optimizer the suite does not name (untuned here). The first that applies, in this order."""


@dataclass(frozen=True)
class SuiteSpec:
    """One runnable suite with every field resolved: defaults filled in, overrides applied, validated."""

    name: str
    description: str
    source: str
    task: str
    task_args: dict[str, Any]
    budget: dict[str, Any]
    schedule: dict[str, Any]
    target: dict[str, Any]
    optims: list[str]
    seeds: list[int]
    hparams: dict[str, dict[str, Any]]
    checks: dict[str, Any]
    experiment: str | None = None
    hparams_source: dict[str, str] = field(default_factory=dict)
    """Each optimizer's HPARAMS_SOURCES entry; not part of the run key (grid.run_key)."""
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The identity of each optimizer that is a plugin (structbench.optim.plugins): stored in its runs' spec as
    `optim_plugin`, so part of their run key."""
    budget_note: str = ""
    """What `--steps` shortened in the budget (eval_every, log_every), as the command says it; "" when nothing."""

    def run_spec_base(self) -> dict[str, Any]:
        """The fields of the effective spec every run of this suite shares."""
        return {
            "suite": self.name,
            "source": self.source,
            "task": self.task,
            "task_args": self.task_args,
            "budget": self.budget,
            "schedule": self.schedule,
            "target": self.stored_target(),
        }

    def stored_target(self) -> dict[str, Any] | None:
        """The target as stored with a run: None without one, else its metric and its fixed value or baseline."""
        if not self.target["metric"]:
            return None
        if self.target["from_baseline"]:
            return {"metric": self.target["metric"], "from_baseline": self.target["from_baseline"]}
        return {"metric": self.target["metric"], "value": self.target["value"]}

    def run_spec(self, optim_name: str, seed: int) -> dict[str, Any]:
        """The effective spec of one run, as stored in its `spec` column."""
        spec = {**self.run_spec_base(), "optim": optim_name, "hparams": self.hparams[optim_name], "seed": seed}
        if optim_name in self.hparams_source:
            spec["hparams_source"] = self.hparams_source[optim_name]
        if optim_name in self.plugins:
            spec["optim_plugin"] = self.plugins[optim_name]
        return spec


def load_suites(
    name_or_path: str,
    overrides: Sequence[str] = (),
    optims: Sequence[str] = (),
    seeds: Sequence[int] = (),
    sweep: bool = False,
    search: Search | None = None,
    steps: int | None = None,
) -> tuple[list[SuiteSpec], dict[str, Any]]:
    """Resolve a suite (expanding `include`) into runnable specs; return them and the suite's checks.

    Without sweeps a suite gives one spec covering all its optimizers. A swept field outside the hyperparameters
    gives one spec per value (their Cartesian product); swept hyperparameters (`--set` lists and ranges, with `sweep`
    or a `search` the suite's `[sweep.<optim>]` tables or else each optimizer's declared tuning ranges) give one
    single-optimizer spec per setting. `steps` (`run --steps`) makes every budget that many steps, shortening
    eval_every and log_every (module docstring) unless `overrides` sets either. Without `steps`, a suite file whose
    eval_every exceeds its steps is a usage error unless `overrides` sets either (`_check_evaluation_fits`).
    """
    check_include_cycles(name_or_path)
    given = {assignment.partition("=")[0].strip() for assignment in overrides}
    if steps is None:
        specs, checks = _load_suites(name_or_path, overrides, optims, seeds, sweep, search, None)
        if not given & {"budget.steps", "budget.eval_every"}:
            for spec in specs:
                _check_evaluation_fits(spec)
        return specs, checks
    shorten_to = None if given & {f"budget.{k}" for k in SHORTENED} else steps
    overrides = [*overrides, f"budget.steps={steps}", "budget.epochs=0"]
    warmup_given = "budget.warmup_steps" in given
    return _load_suites(name_or_path, overrides, optims, seeds, sweep, search, shorten_to, warmup_given)


def _load_suites(
    name_or_path: str,
    overrides: Sequence[str],
    optims: Sequence[str],
    seeds: Sequence[int],
    sweep: bool,
    search: Search | None,
    shorten_to: int | None,
    warmup_given: bool = False,
) -> tuple[list[SuiteSpec], dict[str, Any]]:
    name, path, raw = suite_file.read_suite_file(name_or_path)
    checks = _merge("checks", CHECK_DEFAULTS, raw.get("checks", {}))
    if "include" in raw:
        specs = [
            s
            for child in raw["include"]
            for s in _load_suites(child, overrides, optims, seeds, sweep, search, shorten_to, warmup_given)[0]
        ]
        return specs, checks
    specs = resolve_suite(name, path, raw, overrides, optims, seeds, checks, sweep, search)
    if shorten_to is None or "experiment" in raw:
        return specs, checks
    own = {**BUDGET_DEFAULTS, **raw.get("budget", {})}
    keep_warmup = warmup_given or "warmup_steps" in raw.get("budget", {})
    return [shorten(s, shorten_to, own, keep_warmup) for s in specs], checks


MIN_EVALUATIONS = 5
MIN_EVAL_INTERVAL = 2
"""`--steps N` never evaluates more often than every MIN_EVAL_INTERVAL steps (module docstring)."""
SHORTENED = ("eval_every", "log_every")


def evaluations(steps: int, eval_every: int) -> int:
    """Evaluations of a run of `steps` steps: the one before training, one every `eval_every` steps, the last."""
    if eval_every <= 0:
        return 2
    return 1 + math.ceil(steps / eval_every)


def shorten(suite: SuiteSpec, steps: int, own: Mapping[str, Any], keep_warmup: bool = False) -> SuiteSpec:
    """The suite with eval_every and log_every shortened for `steps` steps (module docstring) from `own`, the budget
    its file declares with the defaults filled in; what changed is its `budget_note`. A smoke check (`_too_short`)
    also runs without warm-up unless `keep_warmup` (the suite file or the command line sets budget.warmup_steps)."""
    budget = suite.budget
    if evaluations(steps, int(budget["eval_every"])) >= MIN_EVALUATIONS:
        return suite
    own_steps, own_epochs, own_eval = int(own["steps"]), float(own["epochs"]), int(own["eval_every"])
    if own_epochs > 0 and own_eval <= 0:
        intervals = math.ceil(own_epochs)
    elif own_eval > 0 and own_epochs <= 0:
        intervals = math.ceil(own_steps / own_eval)
    else:
        return suite
    if steps < MIN_EVAL_INTERVAL * (MIN_EVALUATIONS - 1):
        return _too_short(suite, steps, keep_warmup)
    eval_every = max(MIN_EVAL_INTERVAL, steps // max(intervals, MIN_EVALUATIONS - 1))
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
    return dataclasses.replace(suite, budget=shortened, budget_note=note)


def _check_evaluation_fits(suite: SuiteSpec) -> None:
    """A usage error for a suite file's budget in steps whose eval_every exceeds its steps: no evaluation would fall
    between the one before training and the final one, which eval_every 0 says. Budgets in epochs (whose steps depend
    on the data) and experiments (no budget) are left alone; so are budgets whose steps or eval_every the command
    line sets (`--steps` applies the shortening rule, module docstring; `--set` is the user's own choice)."""
    budget = suite.budget
    if not budget or budget["epochs"] > 0 or budget["eval_every"] <= budget["steps"]:
        return
    raise UsageError(
        f"suite {suite.name} ({suite.source}): budget.eval_every {budget['eval_every']} exceeds budget.steps "
        f"{budget['steps']}, so no evaluation would fall between the first and the last; set eval_every to at most "
        "steps, or to 0 to evaluate before training and at the end only."
    )


def _too_short(suite: SuiteSpec, steps: int, keep_warmup: bool) -> SuiteSpec:
    """The suite evaluated before training and at the end only: `steps` cannot hold the minimum curve, and without
    warm-up unless `keep_warmup` (module docstring)."""
    evaluated = evaluations(steps, int(suite.budget["eval_every"]))
    note = (
        f"{suite.name}: --steps {steps} is too short for {MIN_EVALUATIONS} evaluations at least {MIN_EVAL_INTERVAL} "
        f"steps apart, so eval_every is left at {suite.budget['eval_every']} and each run is evaluated {evaluated} "
        "times (before training and at the end): a smoke check, with no curve to time a target on"
    )
    warmup = int(suite.budget["warmup_steps"])
    if keep_warmup or warmup == 0:
        return dataclasses.replace(suite, budget_note=f"{note}.")
    note += (
        f"; its {warmup} warm-up steps are dropped (its times include the first steps' setup: "
        "--set budget.warmup_steps=N keeps them)."
    )
    return dataclasses.replace(suite, budget={**suite.budget, "warmup_steps": 0}, budget_note=note)


def check_include_cycles(name_or_path: str, chain: tuple[Path, ...] = ()) -> None:
    """A usage error naming the cycle when a suite includes itself, directly or through other suites.

    `chain` is the suite files (resolved paths) whose includes lead to this one."""
    _, path, raw = suite_file.read_suite_file(name_or_path)
    here = path.resolve()
    if here in chain:
        cycle = [*chain[chain.index(here) :], here]
        raise UsageError(f"suite file {path} includes itself: {' -> '.join(str(p) for p in cycle)}.")
    for child in raw.get("include", []):
        check_include_cycles(child, (*chain, here))


def resolve_suite(
    name: str,
    path: Path,
    raw: Mapping[str, Any],
    overrides: Sequence[str],
    optims: Sequence[str],
    seeds: Sequence[int],
    checks: dict[str, Any],
    sweep: bool = False,
    search: Search | None = None,
) -> list[SuiteSpec]:
    if "experiment" in raw:
        return [resolve_experiment_suite(name, path, raw, overrides, seeds, checks)]
    task_def = get_task(raw["task"])
    chosen = list(dict.fromkeys(optims)) or list(raw.get("optims", ["*"]))
    if chosen == ["*"]:
        chosen = optim.names()
    for optim_name in chosen:
        optim.get(optim_name)
    suite_hparams = raw.get("hparams", {})
    for optim_name in [*suite_hparams, *raw.get("tuned", [])]:
        optim.get(optim_name)
    plugin_records = {o: r for o in chosen if (r := plugins.record(o)) is not None}
    base: dict[str, Any] = {
        "task_args": _merge("task_args", task_def.defaults, raw.get("task_args", {})),
        "budget": _merge("budget", BUDGET_DEFAULTS, raw.get("budget", {})),
        "schedule": _merge("schedule", SCHEDULE_DEFAULTS, raw.get("schedule", {})),
        "target": _merge("target", TARGET_DEFAULTS, raw.get("target", {})),
        "seeds": list(seeds) or list(raw.get("seeds", [0])),
        "hparams": {o: _merge(f"hparams.{o}", optim.get(o).defaults, suite_hparams.get(o, {})) for o in chosen},
    }
    fixed, swept = split_overrides(overrides, base)
    for key, value in fixed:
        assign(base, key, value)
    global_swept = [s for s in swept if not s.key.startswith("hparams.")]
    per_optim = _optimizer_sweeps(name, raw, chosen, swept, sweep or search is not None)
    tuned = suite_lookup.tuned_optimizers(raw)
    sources = {o: hparams_source(o, tuned, [k for k, _ in fixed], per_optim[o]) for o in chosen}
    specs = []
    for point in grid_points(global_swept):
        effective = _assigned(base, point)
        for section in ("task_args", "budget", "schedule"):
            _check_numbers(section, effective[section])
        _validate_budget(effective["budget"], effective["schedule"])
        _validate_target(effective["target"], task_def.metric_name)
        if not any(per_optim.values()):
            settings = [{o: optim.validate(o, effective["hparams"][o]) for o in chosen}]
        else:
            settings = [
                {o: optim.validate(o, _assigned(effective, point)["hparams"][o])}
                for o in chosen
                for point in (search.points(per_optim[o]) if search is not None else grid_points(per_optim[o]))
            ]
        for hparams in settings:
            specs.append(
                SuiteSpec(
                    name=name,
                    description=str(raw.get("description", "")),
                    source=str(path),
                    task=task_def.name,
                    task_args=effective["task_args"],
                    budget=effective["budget"],
                    schedule=effective["schedule"],
                    target=effective["target"],
                    optims=list(hparams),
                    seeds=_checked_seeds(effective["seeds"]),
                    hparams=hparams,
                    checks=checks,
                    hparams_source={o: sources[o] for o in hparams},
                    plugins={o: plugin_records[o] for o in hparams if o in plugin_records},
                )
            )
    return specs


def hparams_source(optim_name: str, tuned: set[str], fixed_keys: Sequence[str], swept: Sequence[Swept]) -> str:
    """Where the optimizer's hyperparameters come from (HPARAMS_SOURCES): "suite" only for an optimizer the suite
    tunes (suite_lookup.tuned_optimizers), else the registry's defaults."""
    if swept:
        return "sweep"
    if any(key.startswith(f"hparams.{optim_name}.") for key in fixed_keys):
        return "command line"
    return "suite" if optim_name in tuned else "registry defaults"


def _assigned(effective: dict[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `effective` with each key of `point` assigned."""
    result = copy.deepcopy(effective)
    for key, value in point.items():
        assign(result, key, value)
    return result


def _optimizer_sweeps(
    suite: str, raw: Mapping[str, Any], chosen: Sequence[str], swept: Sequence[Swept], use_suite_tables: bool
) -> dict[str, list[Swept]]:
    """Each optimizer's swept hyperparameters: with --sweep / --search, the suite's `[sweep.<optim>]` table, or the
    tuning ranges the optimizer declares where the suite has no table for it; then the command line's swept
    `hparams.<optim>.*` fields, which replace an entry for the same key."""
    tables = raw.get("sweep", {})
    for optim_name in tables:
        optim.get(optim_name)
    per_optim: dict[str, list[Swept]] = {}
    for optim_name in chosen:
        fields: dict[str, Swept] = {}
        if use_suite_tables:
            table = tables.get(optim_name)
            declared = (
                suite_sweep_table(optim_name, table, suite)
                if table
                else declared_sweep(optim_name, optim.get(optim_name).hparams)
            )
            fields = {s.key: s for s in declared}
        for one in swept:
            if one.key.startswith(f"hparams.{optim_name}."):
                fields[one.key] = one
        per_optim[optim_name] = list(fields.values())
    return per_optim


def split_overrides(
    overrides: Sequence[str], effective: Mapping[str, Any]
) -> tuple[list[tuple[str, Any]], list[Swept]]:
    """`--set` assignments as (fixed key/value pairs, swept fields), wildcards expanded, every key and value checked.

    `hparams.*.key` applies to every optimizer of the grid that has `key` (a usage error when none has it).
    """
    fixed: list[tuple[str, Any]] = []
    swept: list[Swept] = []
    for assignment in overrides:
        key, sep, text = assignment.partition("=")
        key = ".".join(key_parts(key.strip()))
        if not sep or not key:
            raise UsageError(f"--set expects key=value, got {assignment!r}.")
        value = parse_value(text.strip())
        for concrete in expand_wildcard(key, effective):
            current = lookup(effective, concrete)
            one = None if isinstance(current, list) or concrete == "seeds" else parse_swept(concrete, value)
            if one is None:
                check_assignment(effective, concrete, value)
                fixed.append((concrete, value))
                swept = [s for s in swept if s.key != concrete]
                continue
            for candidate in one.grid():
                check_assignment(effective, concrete, candidate)
            swept = [s for s in swept if s.key != concrete] + [one]
            fixed = [(k, v) for k, v in fixed if k != concrete]
    return fixed, swept


def key_parts(key: str) -> list[str]:
    """The parts of a dotted `--set` key. A part in double quotes keeps its dots (TOML's quoted keys:
    `hparams."mypkg.optim:Lion".lr`); under `hparams` the optimizer's name is everything between `hparams.` and the
    last dot, so a plugin's `package.module:Class` may also be written unquoted (as a shell leaves it)."""
    parts, current, quoted = [], "", False
    for char in key:
        if char == '"':
            quoted = not quoted
        elif char == "." and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    if parts[0] == "hparams" and len(parts) > 3:
        parts = ["hparams", ".".join(parts[1:-1]), parts[-1]]
    return parts


def expand_wildcard(key: str, effective: Mapping[str, Any]) -> list[str]:
    parts = key_parts(key)
    if len(parts) != 3 or parts[0] != "hparams" or parts[1] != "*":
        return [key]
    owners = [o for o, hp in effective["hparams"].items() if parts[2] in hp]
    if not owners:
        raise UsageError(
            f"--set {key}: no optimizer of this grid ({', '.join(effective['hparams'])}) has a hyperparameter "
            f"{parts[2]!r}."
        )
    return [f"hparams.{o}.{parts[2]}" for o in owners]


def lookup(effective: Mapping[str, Any], key: str) -> Any:
    """The current value of a dotted key (a usage error naming the valid keys when it does not exist)."""
    parts = key_parts(key)
    if parts == ["seeds"]:
        return effective["seeds"]
    node: Any = effective
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(node, dict) or part not in node:
            raise UsageError(_bad_key_message(key, parts[:depth], node))
        node = node[part]
    leaf = parts[-1]
    if not isinstance(node, dict) or leaf not in node or isinstance(node[leaf], dict):
        raise UsageError(_bad_key_message(key, parts[:-1], node))
    return node[leaf]


def check_assignment(effective: Mapping[str, Any], key: str, value: Any) -> None:
    """A usage error when `value` cannot be assigned to `key` (unknown key, wrong type)."""
    assign(copy.deepcopy(dict(effective)), key, value)


def resolve_experiment_suite(
    name: str,
    path: Path,
    raw: Mapping[str, Any],
    overrides: Sequence[str],
    seeds: Sequence[int],
    checks: dict[str, Any],
) -> SuiteSpec:
    """A suite that runs a numerical experiment (no optimizer grid): its arguments live in `task_args`."""
    from structbench.experiments import get_experiment

    definition = get_experiment(raw["experiment"])
    effective: dict[str, Any] = {
        "task_args": _merge("task_args", definition.defaults, raw.get("task_args", {})),
        "seeds": list(seeds) or list(raw.get("seeds", [0])),
    }
    for assignment in overrides:
        apply_override(effective, assignment)
    _check_numbers("task_args", effective["task_args"])
    if definition.validate is not None:
        try:
            definition.validate(effective["task_args"])
        except (ValueError, TypeError) as exc:
            raise UsageError(f"experiment {definition.name!r}: {exc}") from None
    return SuiteSpec(
        name=name,
        description=str(raw.get("description", "")),
        source=str(path),
        task=f"experiment:{definition.name}",
        task_args=effective["task_args"],
        budget={},
        schedule={},
        target=dict(TARGET_DEFAULTS),
        optims=[],
        seeds=_checked_seeds(effective["seeds"]),
        hparams={},
        checks=checks,
        experiment=definition.name,
    )


def _merge(section: str, defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise UsageError(
            f"unknown {section} field(s) {', '.join(map(repr, unknown))}; valid: {', '.join(sorted(defaults))}."
        )
    merged = copy.deepcopy(dict(defaults))
    for key, value in given.items():
        merged[key] = coerce(f"{section}.{key}", value, defaults[key])
    return merged


def coerce(key: str, value: Any, like: Any) -> Any:
    """`value` converted to the type of `like` where that is lossless; a usage error otherwise."""
    if isinstance(like, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(like, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(like, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(like, str):
        if isinstance(value, str):
            return value
    elif isinstance(like, list):
        if isinstance(value, list):
            return value
    elif isinstance(like, dict):
        if isinstance(value, dict):
            return value
    elif like is None:
        return value
    raise UsageError(f"{key} must be of type {type(like).__name__}, got {value!r}.")


def parse_value(text: str) -> Any:
    """A --set value as TOML (numbers, booleans, lists, quoted strings), else the bare text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(effective: dict[str, Any], assignment: str) -> None:
    """Apply one fixed `section.key=value` (or `hparams.<optim>.key=value`, or `seeds=[...]`) to `effective`."""
    fixed, swept = split_overrides([assignment], effective)
    if swept:
        raise UsageError(f"--set {assignment}: sweeps are not supported here; give one value.")
    for key, value in fixed:
        assign(effective, key, value)


def assign(effective: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted `key` of `effective` to `value`, coerced to the field's type (usage errors otherwise)."""
    if key == "seeds":
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise UsageError(f"seeds must be a non-empty list of integers, got {value!r}.")
        effective["seeds"] = values
        return
    lookup(effective, key)
    *path, leaf = key_parts(key)
    node = effective
    for part in path:
        node = node[part]
    node[leaf] = coerce(key, value, node[leaf])


def _bad_key_message(key: str, prefix: Iterable[str], node: Any) -> str:
    base = ".".join(prefix)
    if not isinstance(node, dict):
        return f"--set: unknown key {key!r}: {base} is a single value, not a table."
    valid = [f"{base}.{k}" if base else k for k in node]
    return f"--set: unknown key {key!r}; valid here: {', '.join(sorted(valid))}."


def _validate_budget(budget: dict[str, Any], schedule: dict[str, Any]) -> None:
    for key in ("steps", "batch_size", "log_every"):
        if budget[key] < 1:
            raise UsageError(f"budget.{key} must be >= 1, got {budget[key]}.")
    for key in ("eval_every", "checkpoint_every", "warmup_steps"):
        if budget[key] < 0:
            raise UsageError(f"budget.{key} must be >= 0, got {budget[key]}.")
    if budget["grad_accum"] < 1 or budget["batch_size"] % budget["grad_accum"]:
        raise UsageError(
            f"budget.grad_accum must be >= 1 and divide budget.batch_size ({budget['batch_size']}), "
            f"got {budget['grad_accum']}."
        )
    for key in ("epochs", "grad_clip", "max_time_s"):
        if not (math.isfinite(budget[key]) and budget[key] >= 0):
            raise UsageError(f"budget.{key} must be a finite number >= 0, got {budget[key]}.")
    validate_schedule(schedule)


def _checked_seeds(seeds: Sequence[int]) -> list[int]:
    """The seeds, each checked against SEED_RANGE."""
    low, high = SEED_RANGE
    for seed in seeds:
        if not low <= seed <= high:
            raise UsageError(
                f"seed {seed} is out of range: a seed must lie in [-2^63, 2^63 - 1] = [{low}, {high}] "
                "(the results store keeps seeds as int64; torch.manual_seed takes [-2^63, 2^64 - 1])."
            )
    return list(seeds)


def _check_numbers(key: str, value: Any) -> None:
    """A usage error for a NaN or infinite float, or an integer outside int64 (TOML's integers: tomllib reads larger
    ones, the TOML 1.0 spec says they must be rejected), anywhere in `value` (a field, or a table or list of them)."""
    if isinstance(value, dict):
        for name, item in value.items():
            _check_numbers(f"{key}.{name}", item)
    elif isinstance(value, list):
        for item in value:
            _check_numbers(key, item)
    elif isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{key} must be a finite number, got {value}.")
    elif isinstance(value, int) and not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
        raise UsageError(f"{key} must be a 64-bit integer (at most {INT64_RANGE[1]} in size), got {value}.")


def _validate_target(target: dict[str, Any], task_metric: str | None) -> None:
    """The target's fields fit together and its metric is one the task reports (NaN `value` means no fixed value)."""
    if math.isinf(target["value"]):
        raise UsageError(f"target.value must be a finite number, got {target['value']}.")
    has_value, baseline = not math.isnan(target["value"]), target["from_baseline"]
    if target["metric"] and task_metric is not None and target["metric"] not in (task_metric, "loss"):
        raise UsageError(
            f"target.metric {target['metric']!r} is not reported by this task; use {task_metric!r} or 'loss'."
        )
    if not target["metric"]:
        if has_value or baseline:
            raise UsageError("target.value and target.from_baseline need target.metric (the task's metric or 'loss').")
        return
    if has_value == bool(baseline):
        raise UsageError(
            f"target {target['metric']!r} needs exactly one of target.value (a fixed threshold) and "
            f"target.from_baseline (an optimizer whose final {target['metric']} becomes the target), "
            f"got {'both' if has_value else 'neither'}."
        )
    if baseline:
        optim.get(baseline)
