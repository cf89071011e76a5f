"""Assemble the report from the store: per-suite summaries, baseline comparisons, and the cross-suite view.

Selected setting. When an optimizer ran a suite under several settings (a sweep), one selected setting
represents it wherever one row or number per optimizer is needed (the suite table, the baseline, the paired
comparisons, the curve plots, the profiles and the ranks); the Markdown and HTML reports also list every
setting. The setting is never chosen on the suite's evaluation, which is the test split the report compares on
(final eval loss and metric, time to target): it is the one with the best median over seeds of a selection
metric — the validation metric (`final_val_metric`, the eval metric's name and direction) where the runs
record one, else the validation loss (`final_val_loss`), else the final training loss (`final_train_loss`:
"selected on training loss (no validation split)"). Settings whose runs diverged, ran out of memory, hit a
solver error or timed out are never selected over one whose runs did not; ties go to the label (selection.choose);
the report says next to each such optimizer which metric selected its setting, and the Sweeps section shows the
selection metric against each swept hyperparameter (sweeps.py).

Speed-up against the baseline: the baseline's median steps (seconds) to target divided by the variant's,
so 2.0x means the target in half the steps (time). A target from a baseline (`baseline_target`) divides that
baseline's total steps (seconds) instead, whatever `--baseline` names.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from structbench.report import load
from structbench.report.baseline_target import targets_of
from structbench.report.curve_index import CurveIndex
from structbench.report.profiles import Profile, Ranks, performance_profile, rank_table
from structbench.report.selection import Selection, choose
from structbench.report.stats import Paired, paired_difference
from structbench.report.summary import VariantSummary, summarize_variant
from structbench.report.sweeps import Sweep, sweeps_of
from structbench.report.targets import Target
from structbench.report.variants import group_variants
from structbench.store import Problem

EXPERIMENT_PREFIX = "experiment:"
ENV_COLUMNS = (
    "device",
    "device_name",
    "torch_version",
    "structbench_version",
    "git_commit",
    "hostname",
    "python_version",
)


@dataclass(frozen=True)
class Comparison:
    """A variant against the suite's baseline over the seeds both ran."""

    variant: VariantSummary
    baseline: VariantSummary
    seeds: tuple[int, ...]
    """The seeds both ran."""
    seconds: Paired | None
    steps: Paired | None
    metric: Paired | None


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
    baseline: VariantSummary | None
    comparisons: list[Comparison]
    failures: pd.DataFrame
    superseded: pd.DataFrame
    notes: list[str]
    curves: pd.DataFrame
    """Curve points of the selected settings' runs (empty when plots are not drawn)."""
    digest: str
    """A digest of every run row and curve point the suite's numbers come from ("" when plots are not drawn)."""

    @property
    def targets(self) -> list[Target]:
        seen: dict[str, Target] = {}
        for v in self.variants:
            if v.target is not None:
                seen.setdefault(v.target.describe(), v.target)
        return list(seen.values())

    @property
    def timed(self) -> bool:
        """Whether any target has a value (a target from a baseline without ok runs has none)."""
        return any(t.available for t in self.targets)

    @property
    def run_count(self) -> int:
        return sum(len(v.variant.rows) for v in self.variants) + len(self.superseded)

    def speedup(self, variant: VariantSummary, unit: str) -> float:
        """Baseline median / variant median of steps or seconds to target; NaN when undefined.

        For a target from a baseline the numerator is that baseline's total steps or seconds (`baseline_target`).
        """
        pick = (lambda v: v.steps_to_target) if unit == "steps" else (lambda v: v.seconds_to_target)
        if variant.target is not None and variant.target.reference is not None:
            reference = variant.target.reference
            base = reference.steps if unit == "steps" else reference.seconds
        elif self.baseline is None or variant.target is None or self.baseline.target is None:
            return math.nan
        else:
            base = pick(self.baseline).median
        mine = pick(variant).median
        if math.isnan(mine) or math.isnan(base) or math.isinf(mine):
            return math.nan
        if mine == 0:
            return 1.0 if base == 0 else math.inf
        return base / mine


@dataclass(frozen=True, eq=False)
class Report:
    out: Path
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

    @property
    def optims(self) -> list[str]:
        return sorted({o for s in self.suites for o in s.selected})

    def environments(self) -> pd.DataFrame:
        """Distinct environments (E1, E2, ...) with the number of runs in each."""
        env = self.runs[list(ENV_COLUMNS)].fillna("-").astype(str)
        table = env.value_counts(sort=False).reset_index(name="runs")
        table.insert(0, "env", [f"E{i + 1}" for i in range(len(table))])
        return table

    def environment_of_runs(self) -> dict[str, str]:
        """run_id -> environment id."""
        env = self.environments()
        keys = self.runs[list(ENV_COLUMNS)].fillna("-").astype(str)
        merged = keys.merge(env, on=list(ENV_COLUMNS), how="left")
        return dict(zip(self.runs["run_id"], merged["env"], strict=True))


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


def build_suite(name: str, runs: pd.DataFrame, curves: pd.DataFrame, baseline_name: str, plotted: bool) -> SuiteReport:
    metric_name = (
        str(runs["eval_metric_name"].dropna().mode().iloc[0]) if runs["eval_metric_name"].notna().any() else "-"
    )
    modes = runs["eval_metric_mode"].dropna()
    metric_mode = str(modes.mode().iloc[0]) if len(modes) else "min"
    evals = CurveIndex(curves, "eval")
    grouped = group_variants(runs)
    variants = [
        summarize_variant(v, evals, target) for v, target in zip(grouped, targets_of(grouped, metric_mode), strict=True)
    ]
    by_optim: dict[str, list[VariantSummary]] = {}
    for v in variants:
        by_optim.setdefault(v.optim, []).append(v)
    selections = {optim: choose([v.variant for v in vs], metric_name, metric_mode) for optim, vs in by_optim.items()}
    selected = {optim: by_optim[optim][s.chosen] for optim, s in selections.items()}
    baseline = selected.get(baseline_name)
    comparisons = (
        [_compare(v, baseline, metric_mode) for o, v in selected.items() if o != baseline_name]
        if baseline is not None
        else []
    )
    notes: list[str] = []
    for optim, vs in by_optim.items():
        if len(vs) > 1:
            criterion = selections[optim].criterion
            best = "lowest" if criterion.mode == "min" else "highest"
            notes.append(
                f"{optim} ran under {len(vs)} settings; {selected[optim].label} represents it in the main table, "
                f"comparisons, plots, profiles and ranks — {criterion.describe()}"
                + (f", the {best} median over seeds." if criterion.column else ".")
            )
    stored = sum(v.stored_target_used for v in variants)
    if stored:
        notes.append(f"{stored} run(s) have no evaluation curve: the runner's first-evaluation time to target is used.")
    superseded = variants[0].variant.older.frame if variants else runs.iloc[0:0]
    if len(superseded):
        notes.append(
            f"{len(superseded)} run(s) of a seed that ran more than once are superseded (listed with the runs): "
            "per seed the latest run with a final status counts, else the latest run."
        )
    failures = pd.DataFrame(
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
    plotted_ids = {r for v in selected.values() for r in v.variant.run_ids}
    return SuiteReport(
        name=name,
        task=str(runs["task"].dropna().iloc[0]) if runs["task"].notna().any() else "-",
        metric_name=metric_name,
        metric_mode=metric_mode,
        variants=variants,
        selected=dict(sorted(selected.items())),
        selections=dict(sorted(selections.items())),
        sweeps=sweeps_of(by_optim, selections),
        baseline=baseline,
        comparisons=comparisons,
        failures=failures,
        superseded=superseded,
        notes=notes,
        curves=curves[curves["run_id"].isin(plotted_ids)] if plotted else curves.iloc[0:0],
        digest=digest(runs, curves) if plotted else "",
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


def build_report(
    out: Path,
    suites: Collection[str] = (),
    optims: Collection[str] = (),
    baseline: str = "adamw",
    since: pd.Timestamp | None = None,
    plotted: bool = False,
) -> Report:
    """Read the store and assemble every table's numbers; `plotted` also keeps the curves the plots draw."""
    everything, problems = load.load_runs(out, suites, set(optims) | {baseline} if optims else (), since)
    is_experiment = everything["task"].fillna("").str.startswith(EXPERIMENT_PREFIX).to_numpy(bool)
    runs, experiments = everything[~is_experiment], everything[is_experiment]
    curves, curve_problems = load.load_curves(out, _needs_curves(runs, plotted))
    problems = problems + curve_problems
    reports = [
        build_suite(name, group, curves[curves["run_id"].isin(group["run_id"])], baseline, plotted)
        for name, group in runs.groupby("suite", sort=True)
    ]
    optim_names = sorted({o for s in reports for o in s.selected})
    timed = [s for s in reports if s.timed]
    profile_seconds = profile_steps = None
    if timed:
        profile_seconds = performance_profile(
            {s.name: {o: v.seconds_to_target.median for o, v in s.selected.items()} for s in timed}, optim_names
        )
        profile_steps = performance_profile(
            {s.name: {o: v.steps_to_target.median for o, v in s.selected.items()} for s in timed}, optim_names
        )
    ranks = (
        rank_table(
            {s.name: {o: v.final_metric.median for o, v in s.selected.items()} for s in reports},
            {s.name: s.metric_mode for s in reports},
            optim_names,
        )
        if reports
        else None
    )
    filters = {
        "suites": ", ".join(suites) or "all",
        "optimizers": ", ".join(sorted(set(optims) | {baseline})) if optims else "all",
        "since": since.isoformat() if since is not None else "-",
    }
    notes = []
    if reports and not any(s.baseline is not None for s in reports):
        notes.append(f"the baseline {baseline!r} has no runs in this report: no speed-ups or paired comparisons.")
    else:
        for suite in reports:
            if suite.baseline is None:
                suite.notes.insert(0, f"the baseline {baseline!r} did not run this suite: no speed-ups or comparisons.")
    return Report(
        out=out,
        baseline=baseline,
        filters=filters,
        suites=reports,
        profile_seconds=profile_seconds,
        profile_steps=profile_steps,
        ranks=ranks,
        runs=runs,
        problems=problems,
        experiments=experiments.reset_index(drop=True),
        notes=notes,
    )
