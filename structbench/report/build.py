"""Assemble the report from the stores: per-suite summaries, baseline comparisons, and the cross-suite view.

Splits. A run that holds out a validation split records its final validation loss and metric (`final_val_*`) and a
validation curve beside the test split's (`final_eval_*`, split "eval"; a quadratic's evaluation is its exact
objective). Everything that chooses or times uses the validation split: the selection of a setting among several,
a target from a baseline (the baseline's final validation value) and time to target (the validation curve), hence
speed-ups and performance profiles. The test split is reported for the selected setting only (its final loss and
metric, the paired comparison of final metrics, the ranks); the every-setting table shows no test numbers. Runs
without a validation split (stored before there was one, or `val_fraction = 0`) are timed and selected as before (on
their evaluation, and on training loss), and the report says so.

Selected setting. When an optimizer ran a suite under several settings (a sweep), one selected setting
represents it wherever one row or number per optimizer is needed (the suite table, the baseline, the paired
comparisons, the curve plots, the profiles and the ranks); the Markdown and HTML reports also list every
setting. It is the one with the best median over seeds of a selection metric — the validation metric
(`final_val_metric`, the eval metric's name and direction) where the runs record one, else the validation loss
(`final_val_loss`), else the final training loss (`final_train_loss`: "selected on training loss (no validation
split)"). Settings whose runs diverged, ran out of memory, hit a solver error or timed out are never selected over
one whose runs did not; ties go to the label (selection.choose); the report says next to each such optimizer which
metric selected its setting, and the Sweeps section shows the selection metric against each swept hyperparameter.

Speed-up against the baseline: the baseline's median steps (seconds) to target divided by the variant's,
so 2.0x means the target in half the steps (time). A target from a baseline (`baseline_target`) divides that
baseline's total steps (seconds) instead, whatever `--baseline` names. In a report over several stores each row is
compared with the baseline of its own store.

Across suites (profiles.py): each optimizer over the suites it ran, with its coverage; smoke suites
(suite_files.is_smoke) are left out unless `include_smoke`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from structbench.report import suite_files
from structbench.report.analysis import filters
from structbench.report.analysis.baseline_target import targets_of
from structbench.report.analysis.curve_index import CurveIndex
from structbench.report.analysis.measurement import measurement_notes
from structbench.report.analysis.profiles import Profile, Ranks, performance_profile, rank_table
from structbench.report.analysis.provenance import untuned
from structbench.report.analysis.selection import Selection, choose
from structbench.report.analysis.stats import Paired, paired_difference
from structbench.report.analysis.summary import Evaluations, VariantSummary, summarize_variant
from structbench.report.analysis.sweeps import Sweep, sweeps_of
from structbench.report.analysis.targets import Crossing, Target
from structbench.report.analysis.variants import entries, group_variants
from structbench.store import read as load
from structbench.store import write as store
from structbench.store.write import Problem

EXPERIMENT_PREFIX = "experiment:"
EXACT_TASKS = ("quadratic",)
"""Tasks whose evaluation is an exact objective rather than a data split."""
ENV_COLUMNS = store.ENVIRONMENT_COLUMNS
"""What tells environments apart (the run's own command line is shown with the run instead)."""


@dataclass(frozen=True)
class Comparison:
    """A variant against the baseline of its store over the seeds both ran."""

    variant: VariantSummary
    baseline: VariantSummary
    seeds: tuple[int, ...]
    """The seeds both ran."""
    seconds: Paired | None
    steps: Paired | None
    metric: Paired | None
    """On the test split's final metric."""


@dataclass(frozen=True, eq=False)
class SuiteReport:
    name: str
    task: str
    metric_name: str
    metric_mode: str
    variants: list[VariantSummary]
    selected: dict[str, VariantSummary]
    """The selected setting of each optimizer (module docstring)."""
    selections: dict[str, Selection]
    """Each optimizer's selection metric, its settings' scores and the chosen one."""
    sweeps: list[Sweep]
    """The optimizers whose settings differ only in hyperparameters, for the Sweeps section."""
    baselines: dict[str, VariantSummary]
    """The baseline's selected setting in each store ("" in a report over one store)."""
    comparisons: list[Comparison]
    failures: pd.DataFrame
    superseded: pd.DataFrame
    notes: list[str]
    curves: pd.DataFrame
    """Curve points of the selected settings' runs (empty when plots are not drawn)."""
    digest: str
    """A digest of every run row and curve point the suite's numbers come from ("" when plots are not drawn)."""
    smoke: bool = False
    """A smoke suite: left out of the cross-suite aggregates unless asked for."""

    @property
    def baseline(self) -> VariantSummary | None:
        """The baseline's selected setting (of the first store that has one)."""
        return next(iter(self.baselines.values()), None)

    def baseline_of(self, variant: VariantSummary) -> VariantSummary | None:
        return self.baselines.get(variant.variant.store)

    @property
    def targets(self) -> list[Target]:
        seen: dict[str, Target] = {}
        for v in self.variants:
            if v.target is not None:
                seen.setdefault(v.target.describe(), v.target)
        return list(seen.values())

    @property
    def has_ok(self) -> bool:
        """Whether any of the suite's runs ended ok (a suite without one is left out of the cross-suite aggregates)."""
        return any(v.statuses.get("ok") for v in self.variants)

    @property
    def timed(self) -> bool:
        """Whether any target has a value (a target from a baseline without ok runs has none)."""
        return any(t.available for t in self.targets)

    @property
    def run_count(self) -> int:
        return sum(len(v.variant.rows) for v in self.variants) + len(self.superseded)

    @property
    def validated(self) -> bool:
        """Whether the runs hold out a validation split (any selected setting records one)."""
        return any(v.validated for v in self.variants)

    @property
    def eval_split(self) -> str:
        """What the runs' evaluation is: "exact" (an exact objective) or "test"."""
        return "exact" if self.task in EXACT_TASKS else "test"

    @property
    def timing_split(self) -> str:
        """The split time to target is measured on, over the selected settings."""
        splits = {v.timing_split for v in self.selected.values() if v.timing_split}
        if splits == {"validation"}:
            return "validation"
        return "test" if splits == {"test"} else " and ".join(sorted(splits, reverse=True))

    @property
    def stores(self) -> list[str]:
        return sorted({v.variant.store for v in self.variants})

    def speedup(self, variant: VariantSummary, unit: str) -> float:
        """Baseline median / variant median of steps or seconds to target; NaN when undefined.

        For a target from a baseline the numerator is that baseline's total steps or seconds (`baseline_target`).
        """
        pick = (lambda v: v.steps_to_target) if unit == "steps" else (lambda v: v.seconds_to_target)
        baseline = self.baseline_of(variant)
        if variant.target is not None and variant.target.reference is not None:
            reference = variant.target.reference
            base = reference.steps if unit == "steps" else reference.seconds
        elif baseline is None or variant.target is None or baseline.target is None:
            return math.nan
        else:
            base = pick(baseline).median
        mine = pick(variant).median
        if math.isnan(mine) or math.isnan(base) or math.isinf(mine):
            return math.nan
        if mine == 0:
            return 1.0 if base == 0 else math.inf
        return base / mine


@dataclass(frozen=True, eq=False)
class Report:
    out: Path
    """The first store (the figure cache is kept there)."""
    baseline: str
    filters: Mapping[str, str]
    suites: list[SuiteReport]
    profile_seconds: Profile | None
    profile_steps: Profile | None
    ranks: Ranks | None
    runs: pd.DataFrame
    problems: list[Problem]
    experiments: pd.DataFrame
    """Numerical-experiment runs (task "experiment:<name>"): not optimizer comparisons; their claims are listed."""
    notes: list[str] = field(default_factory=list)
    generated: datetime = field(default_factory=lambda: datetime.now(UTC))
    stores: tuple[Path, ...] = ()
    """Every store read, in the order given."""
    left_out: tuple[str, ...] = ()
    """Suites left out of the cross-suite aggregates (smoke suites)."""
    without_ok: tuple[str, ...] = ()
    """Suites left out of the cross-suite aggregates because none of their runs ended ok: nothing there to rank."""

    @property
    def optims(self) -> list[str]:
        return sorted({o for s in self.suites for o in s.selected})

    @property
    def aggregated(self) -> list[SuiteReport]:
        """The suites the profiles and ranks are over."""
        return [s for s in self.suites if s.name not in (*self.left_out, *self.without_ok)]

    def _env_columns(self) -> list[str]:
        several = "store" in self.runs.columns and (self.runs["store"] != "").any()
        return (["store"] if several else []) + list(ENV_COLUMNS)

    @functools.cached_property
    def _env_keys(self) -> pd.DataFrame:
        """Each run's environment fields as text (_env_text), worked out once for every table that lists them."""
        return self.runs[self._env_columns()].map(_env_text)

    def environments(self) -> pd.DataFrame:
        """Distinct environments (E1, E2, ...) with the number of runs in each (and their store, over several)."""
        table = self._env_keys.value_counts(sort=False).reset_index(name="runs")
        table.insert(0, "env", [f"E{i + 1}" for i in range(len(table))])
        return table

    def environment_of_runs(self) -> dict[str, str]:
        """run_id -> environment id."""
        merged = self._env_keys.merge(self.environments(), on=self._env_columns(), how="left")
        return dict(zip(self.runs["run_id"], merged["env"], strict=True))


def _env_text(value: object) -> str:
    """An environment field as text: "-" when not recorded, a whole number without its ".0" (integer columns read as
    floats when some files lack them)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _compare(variant: VariantSummary, baseline: VariantSummary, mode: str) -> Comparison:
    timed = all(t is not None and t.available for t in (variant.target, baseline.target))
    seconds = steps = None
    if timed:
        seconds = paired_difference(
            {s: c.seconds for s, c in variant.crossings.items()},
            {s: c.seconds for s, c in baseline.crossings.items()},
            "faster",
            "slower",
        )
        steps = paired_difference(
            {s: c.steps for s, c in variant.crossings.items()},
            {s: c.steps for s, c in baseline.crossings.items()},
            "fewer steps",
            "more steps",
        )
    better, worse = ("better", "worse") if mode == "min" else ("worse", "better")
    metric = paired_difference(variant.final_metric_by_seed, baseline.final_metric_by_seed, better, worse)
    seeds = tuple(
        sorted({int(s) for s in variant.variant.values("seed")} & {int(s) for s in baseline.variant.values("seed")})
    )
    return Comparison(variant, baseline, seeds, seconds, steps, metric if metric.seeds else None)


def _first_line(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if text.lstrip().startswith("Traceback") else lines[0].strip()


def _split_note(suite: SuiteReport) -> str:
    """Which split the suite's numbers come from, in words."""
    evaluation = "the exact objective" if suite.eval_split == "exact" else "the test split"
    if suite.validated:
        return (
            f"splits: settings are selected, targets set and timed on the validation split; final numbers are also "
            f"given on {evaluation}, for the selected setting only."
        )
    return (
        f"splits: these runs hold out no validation split, so time to target is measured on {evaluation} (the "
        "numbers compared) and settings are selected on training loss."
    )


def _interval_text(seed: int, crossing: Crossing) -> str:
    low, high = crossing.interval or (math.nan, math.nan)
    return f"seed {seed}: between the evaluations at steps {low:g} and {high:g}"


def _budget_notes(variants: Sequence[VariantSummary]) -> list[str]:
    notes = []
    few = {v.label: v.few_evaluations for v in variants if v.few_evaluations}
    if few:
        listed = "; ".join(
            f"{label} ({', '.join(f'seed {s}: {n}' for s, n in counts.items())})" for label, counts in few.items()
        )
        notes.append(
            f"too few evaluations: {listed}. With fewer than 3 evaluations a curve is a straight line between its "
            "ends, and time to target an interpolation over the whole run: lower budget.eval_every."
        )
    wide = {v.label: v.wide_crossings for v in variants if v.wide_crossings}
    if wide:
        listed = "; ".join(
            f"{label} ({', '.join(_interval_text(s, c) for s, c in crossings.items())})"
            for label, crossings in wide.items()
        )
        notes.append(
            f"time to target interpolated over more than a quarter of the run: {listed}; the crossing may lie "
            "anywhere in that interval."
        )
    untuned_rows = [v.label for v in variants if untuned(v.hparams_source)]
    if untuned_rows:
        notes.append(
            f"untuned here: {', '.join(untuned_rows)} ran at the registry's default hyperparameters (the suite does "
            "not name them); their numbers say little about the optimizers."
        )
    return notes


def build_suite(
    name: str, runs: pd.DataFrame, curves: pd.DataFrame, baseline_name: str, plotted: bool, smoke: bool = False
) -> SuiteReport:
    """One suite's numbers: its variants summarized, each optimizer's selected setting, the comparisons with the
    baseline of each store, its failures and its notes; `plotted` also keeps the selected settings' curves."""
    metric_name, metric_mode = _metric_of(runs)
    evals = Evaluations(CurveIndex(curves, "val"), CurveIndex(curves, "eval"))
    grouped = group_variants(runs)
    variants = [
        summarize_variant(v, evals, target) for v, target in zip(grouped, targets_of(grouped, metric_mode), strict=True)
    ]
    by_optim: dict[str, list[VariantSummary]] = {}
    for v in variants:
        by_optim.setdefault(v.optim, []).append(v)
    selections = {optim: choose([v.variant for v in vs], metric_name, metric_mode) for optim, vs in by_optim.items()}
    selected = {optim: by_optim[optim][s.chosen] for optim, s in selections.items()}
    baselines = {v.variant.store: v for v in selected.values() if v.variant.optim_name == baseline_name}
    comparisons = [
        _compare(v, baselines[v.variant.store], metric_mode)
        for v in selected.values()
        if v.variant.optim_name != baseline_name and v.variant.store in baselines
    ]
    superseded = variants[0].variant.older.frame if variants else runs.iloc[0:0]
    notes = _selection_notes(by_optim, selections, selected) + _run_notes(variants, superseded)
    plotted_ids = {r for v in selected.values() for r in v.variant.run_ids}
    report = SuiteReport(
        name=name,
        task=str(runs["task"].dropna().iloc[0]) if runs["task"].notna().any() else "-",
        metric_name=metric_name,
        metric_mode=metric_mode,
        variants=variants,
        selected=dict(sorted(selected.items())),
        selections=dict(sorted(selections.items())),
        sweeps=sweeps_of(by_optim, selections),
        baselines=dict(sorted(baselines.items())),
        comparisons=comparisons,
        failures=_failures(variants),
        superseded=superseded,
        notes=notes,
        curves=curves[curves["run_id"].isin(plotted_ids)] if plotted else curves.iloc[0:0],
        digest=digest(runs, curves) if plotted else "",
        smoke=smoke,
    )
    notes[:0] = [_split_note(report)]
    notes += _budget_notes(list(report.selected.values()))
    notes += measurement_notes(variants)
    return report


def _metric_of(runs: pd.DataFrame) -> tuple[str, str]:
    """The suite's evaluation metric and its direction: the most common among its runs ("-" and "min" when none
    records one)."""
    metric_name = (
        str(runs["eval_metric_name"].dropna().mode().iloc[0]) if runs["eval_metric_name"].notna().any() else "-"
    )
    modes = runs["eval_metric_mode"].dropna()
    return metric_name, str(modes.mode().iloc[0]) if len(modes) else "min"


def _selection_notes(
    by_optim: Mapping[str, Sequence[VariantSummary]],
    selections: Mapping[str, Selection],
    selected: Mapping[str, VariantSummary],
) -> list[str]:
    """For each optimizer run under several settings: which setting represents it, and the metric that selected it."""
    notes = []
    for optim, vs in by_optim.items():
        if len(vs) > 1:
            criterion = selections[optim].criterion
            best = "lowest" if criterion.mode == "min" else "highest"
            notes.append(
                f"{optim} ran under {len(vs)} settings; {selected[optim].label} represents it in the main table, "
                f"comparisons, plots, profiles and ranks — {criterion.describe()}"
                + (f", the {best} median over seeds." if criterion.column else ".")
            )
    return notes


def _run_notes(variants: Sequence[VariantSummary], superseded: pd.DataFrame) -> list[str]:
    """Runs timed without an evaluation curve, and runs superseded by a later run of their seed."""
    notes = []
    stored = sum(v.stored_target_used for v in variants)
    if stored:
        notes.append(f"{stored} run(s) have no evaluation curve: the runner's first-evaluation time to target is used.")
    if len(superseded):
        notes.append(
            f"{len(superseded)} run(s) of a seed that ran more than once are superseded (listed with the runs): "
            "per seed the latest run with a final status counts, else the latest run."
        )
    return notes


def _failures(variants: Sequence[VariantSummary]) -> pd.DataFrame:
    """Every run whose status is not ok, with the telling line of its error."""
    return pd.DataFrame(
        [
            {
                "run_id": run_id,
                "variant": v.label,
                "seed": seed,
                "status": status,
                "steps": steps,
                "message": _first_line(error),
            }
            for v in variants
            if v.statuses.get("ok", 0) < len(v.variant.rows)
            for run_id, seed, status, steps, error in zip(
                *(v.variant.values(c) for c in ("run_id", "seed", "status", "steps", "error")), strict=True
            )
            if status != "ok"
        ],
        columns=["run_id", "variant", "seed", "status", "steps", "message"],
    )


def digest(*frames: pd.DataFrame) -> str:
    """Content digest of the frames (row order ignored): equal digests mean equal data."""
    hasher = hashlib.sha256()
    for frame in frames:
        rows = np.sort(pd.util.hash_pandas_object(frame, index=False).to_numpy())
        hasher.update(",".join(map(str, frame.columns)).encode())
        hasher.update(rows.tobytes())
    return hasher.hexdigest()


def _has_target(spec_json: object) -> bool:
    try:
        spec = json.loads(spec_json) if isinstance(spec_json, str) else None
    except json.JSONDecodeError:
        return False
    return isinstance(spec, dict) and bool(spec.get("target"))


def _needs_curves(runs: pd.DataFrame, plotted: bool) -> list[str]:
    """Curves are read for the plots, and otherwise only where time to target is interpolated."""
    if plotted:
        return runs["run_id"].tolist()
    return runs.loc[runs["spec"].map(_has_target).astype(bool), "run_id"].tolist()


def _read_stores(stores: Sequence[Path]) -> tuple[pd.DataFrame, list[Problem]]:
    """Every store's runs; over several stores each row carries its store's label (the path as given) and its run
    id is prefixed by it, so that the same run copied into two stores stays two rows."""
    frames, problems = [], []
    several = len(stores) > 1
    for out in stores:
        runs, found = load.load_runs(out)
        label = str(out) if several else ""
        runs = runs.assign(store=label, stored_id=runs["run_id"])
        if several:
            runs["run_id"] = label + "/" + runs["run_id"]
        frames.append(runs)
        problems += found
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0], problems


def _read_curves(stores: Sequence[Path], runs: pd.DataFrame, plotted: bool) -> tuple[pd.DataFrame, list[Problem]]:
    frames, problems = [], []
    wanted = set(_needs_curves(runs, plotted))
    for out in stores:
        mine = runs[(runs["store"] == (str(out) if len(stores) > 1 else "")) & runs["run_id"].isin(wanted)]
        curves, found = load.load_curves(out, mine["stored_id"].tolist())
        if len(stores) > 1:
            curves = curves.assign(run_id=str(out) + "/" + curves["run_id"])
        frames.append(curves)
        problems += found
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0], problems


class SuiteListener(Protocol):
    """Told of each suite as soon as it is built (the report's figures are drawn meanwhile, render.Drawing, and its
    terminal text typeset, typesetting.Typesetting)."""

    def begin(self, suites: int, optims: Sequence[str]) -> None:
        """Before the first suite: how many suites there will be and the report's optimizers (Report.optims)."""

    def built(self, index: int, suite: SuiteReport) -> None:
        """Suite `index` (in Report.suites) is built; what follows changes only its notes."""


def build_report(
    out: Path | Sequence[Path],
    suites: Collection[str] | Mapping[str, Sequence[str]] = (),
    optims: Collection[str] = (),
    baseline: str = "adamw",
    since: pd.Timestamp | None = None,
    plotted: bool = False,
    baseline_given: bool = False,
    include_smoke: bool = False,
    listeners: Sequence[SuiteListener] = (),
) -> Report:
    """Read the stores and assemble every table's numbers; `plotted` also keeps the curves the plots draw; `listeners`
    hear of each suite as it is built. The filters are filters.apply's (a filter that matches nothing is a
    UsageError)."""
    stores = [out] if isinstance(out, Path) else list(out)
    everything, problems = _read_stores(stores)
    where = ", ".join(str(s) for s in stores)
    groups = dict(suites) if isinstance(suites, Mapping) else {name: [name] for name in suites}
    everything = filters.apply(everything, where, groups, optims, baseline, baseline_given, since)
    is_experiment = everything["task"].fillna("").str.startswith(EXPERIMENT_PREFIX).to_numpy(bool)
    runs, experiments = everything[~is_experiment], everything[is_experiment]
    curves, curve_problems = _read_curves(stores, runs, plotted)
    reports = _build_suites(runs, curves, baseline, plotted, listeners)
    left_out = tuple(s.name for s in reports if s.smoke and not include_smoke)
    without_ok = tuple(s.name for s in reports if s.name not in left_out and not s.has_ok)
    aggregated = [s for s in reports if s.name not in (*left_out, *without_ok)]
    optim_names = sorted({o for s in aggregated for o in s.selected})
    profile_seconds, profile_steps = _profiles(aggregated, optim_names)
    return Report(
        out=stores[0],
        baseline=baseline,
        filters=_filters_text(groups, optims, baseline, since),
        suites=reports,
        profile_seconds=profile_seconds,
        profile_steps=profile_steps,
        ranks=_ranks(aggregated, optim_names),
        runs=runs,
        problems=problems + curve_problems,
        experiments=experiments.reset_index(drop=True),
        notes=_report_notes(reports, baseline, left_out, without_ok),
        stores=tuple(stores),
        left_out=left_out,
        without_ok=without_ok,
    )


def _build_suites(
    runs: pd.DataFrame, curves: pd.DataFrame, baseline: str, plotted: bool, listeners: Sequence[SuiteListener]
) -> list[SuiteReport]:
    """Every suite of the runs, by name, each told to the listeners as soon as it is built."""
    by_suite = list(runs.groupby("suite", sort=True))
    for listener in listeners:
        listener.begin(len(by_suite), entries(runs))
    reports = []
    for name, group in by_suite:
        suite_curves = curves[curves["run_id"].isin(group["run_id"])]
        reports.append(build_suite(name, group, suite_curves, baseline, plotted, suite_files.is_smoke(str(name))))
        for listener in listeners:
            listener.built(len(reports) - 1, reports[-1])
    return reports


def _profiles(aggregated: Sequence[SuiteReport], optim_names: Sequence[str]) -> tuple[Profile | None, Profile | None]:
    """The performance profiles of seconds and of steps to target over the timed suites (None without one)."""
    timed = [s for s in aggregated if s.timed]
    if not timed:
        return None, None
    profile_seconds = performance_profile(
        {s.name: {o: v.seconds_to_target.median for o, v in s.selected.items()} for s in timed}, optim_names
    )
    profile_steps = performance_profile(
        {s.name: {o: v.steps_to_target.median for o, v in s.selected.items()} for s in timed}, optim_names
    )
    return profile_seconds, profile_steps


def _ranks(aggregated: Sequence[SuiteReport], optim_names: Sequence[str]) -> Ranks | None:
    """The optimizers ranked by final metric in each suite (None without a suite)."""
    if not aggregated:
        return None
    return rank_table(
        {s.name: {o: v.final_metric.median for o, v in s.selected.items()} for s in aggregated},
        {s.name: s.metric_mode for s in aggregated},
        optim_names,
    )


def _filters_text(
    groups: Mapping[str, Sequence[str]], optims: Collection[str], baseline: str, since: pd.Timestamp | None
) -> dict[str, str]:
    """The filters the report was made with, as the report states them."""
    return {
        "suites": ", ".join(groups) or "all",
        "optimizers": ", ".join(sorted(set(optims) | {baseline})) if optims else "all",
        "since": since.isoformat() if since is not None else "-",
    }


def _report_notes(
    reports: Sequence[SuiteReport], baseline: str, left_out: Sequence[str], without_ok: Sequence[str]
) -> list[str]:
    """The report's notes: smoke suites and suites without an ok run left out, and a baseline that ran nowhere; where
    the baseline ran some suites but not others, each suite it missed (in some store) gets the note first among its
    own instead."""
    notes = []
    if left_out:
        notes.append(
            f"smoke suite(s) {', '.join(left_out)} are left out of the cross-suite profiles and ranks (a few dozen "
            "steps at default hyperparameters; --include-smoke counts them)."
        )
    if without_ok:
        notes.append(
            f"suite(s) {', '.join(without_ok)} have no ok run: left out of the cross-suite profiles and ranks "
            "(nothing there to rank)."
        )
    if reports and not any(s.baselines for s in reports):
        notes.append(f"the baseline {baseline!r} has no runs in this report: no speed-ups or paired comparisons.")
    else:
        for suite in reports:
            missing = [store or "this store" for store in suite.stores if store not in suite.baselines]
            if missing:
                suite.notes.insert(
                    0,
                    f"the baseline {baseline!r} did not run this suite"
                    + (f" in {', '.join(missing)}" if len(suite.stores) > 1 else "")
                    + ": no speed-ups or comparisons there.",
                )
    return notes
