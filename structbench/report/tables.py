"""The report's tables as plain data (cells of text), rendered alike by the terminal, Markdown and HTML writers."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from structbench.report.anchors import anchor
from structbench.report.build import Report, SuiteReport
from structbench.report.format import (
    NOT_REACHED,
    estimate_text,
    fmt_bytes,
    fmt_num,
    fmt_percent,
    fmt_ratio,
    fmt_seconds,
    fmt_steps,
    signed_estimate_text,
)
from structbench.report.profiles import TAU_COLUMNS, Profile
from structbench.report.selection import Score
from structbench.report.stats import Estimate, Paired
from structbench.report.summary import VariantSummary
from structbench.report.sweeps import Sweep
from structbench.report.variants import Variant
from structbench.store import STATUSES

MAX_RANK_COLUMNS = 8


@dataclass(frozen=True)
class Cell:
    text: str
    sub: str = ""
    tone: str = ""
    """"" plain, "best" (best in its column), "good" / "bad" (a verdict or a failure), "muted"."""
    title: str = ""
    link: str = ""


@dataclass(frozen=True)
class Column:
    name: str
    group: str = "main"
    """The terminal prints each group as its own table (the first column repeated) to fit its width."""
    left: bool = False
    wrap: bool = True
    """Whether the terminal may wrap the column's text."""


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[Column]
    rows: list[list[Cell]]
    caption: str = ""
    key: str = field(default="")


TIME_COLUMNS = (
    Column("steps to target", "results"),
    Column("time to target", "results"),
    Column("speed-up (steps)", "results"),
    Column("speed-up (time)", "results"),
)


def status_text(statuses: dict[str, int] | Any) -> str:
    return " · ".join(f"{statuses[s]} {s}" for s in STATUSES if statuses.get(s)) or "-"


def _best(values: Sequence[float], lower_is_better: bool = True) -> set[int]:
    """Rows holding the column's best finite value; none when every finite value is the same."""
    finite = {i: v if lower_is_better else -v for i, v in enumerate(values) if math.isfinite(v)}
    if len(set(finite.values())) < 2:
        return set()
    top = min(finite.values())
    return {i for i, v in finite.items() if v == top}


def _estimate_cells(
    estimates: Sequence[Estimate], fmt: Callable[[Any], str], lower_is_better: bool = True, infinite: str = NOT_REACHED
) -> list[Cell]:
    best = _best([e.median for e in estimates], lower_is_better)
    cells = []
    for i, e in enumerate(estimates):
        text, sub = estimate_text(e, fmt, infinite)
        cells.append(Cell(text, sub, "best" if i in best else ("bad" if text == NOT_REACHED else "")))
    return cells


def _speedup_cell(suite: SuiteReport, v: VariantSummary, unit: str) -> Cell:
    if v.target is None or not v.target.available:
        return Cell("-")
    derived = v.target.reference is not None
    if not derived and suite.baseline is None:
        return Cell("-")
    if v is suite.baseline if not derived else _is_reference(v):
        return Cell("1x", "baseline", "muted")
    estimate = v.steps_to_target if unit == "steps" else v.seconds_to_target
    if math.isinf(estimate.median):
        return Cell(NOT_REACHED, tone="bad")
    ratio = suite.speedup(v, unit)
    if math.isinf(ratio):
        return Cell("∞", "reached before training" if derived else "baseline not reached", "good")
    return Cell(fmt_ratio(ratio), tone="good" if ratio > 1 else "")


def _is_reference(v: VariantSummary) -> bool:
    """Whether this row is the baseline variant its target was derived from (its speed-up is 1 by definition)."""
    reference = v.target.reference if v.target is not None else None
    return reference is not None and v.variant.label == reference.label and v.variant.optim == reference.optim


def _has_effective_throughput(variants: Sequence[VariantSummary]) -> bool:
    """Whether some row's target comes from a baseline whose runs record a throughput."""
    return any(
        v.target is not None and v.target.reference is not None and math.isfinite(v.target.reference.items)
        for v in variants
    )


def _effective_throughput_cell(v: VariantSummary) -> Cell:
    """The baseline's items over this row's median seconds to its target (a target from a baseline only)."""
    reference = v.target.reference if v.target is not None else None
    if reference is None or not math.isfinite(reference.items):
        return Cell("-")
    if _is_reference(v):
        return Cell("-", "baseline", "muted")
    seconds = v.seconds_to_target.median
    if math.isinf(seconds):
        return Cell(NOT_REACHED, tone="bad")
    if math.isnan(seconds) or seconds == 0:
        return Cell("-")
    return Cell(f"{reference.effective_throughput(seconds):,.0f}", reference.rate_unit)


def _target_cell(estimate_cell: Cell, v: VariantSummary) -> Cell:
    """A steps or time to target cell, or why there is none."""
    if v.target is None:
        return Cell("-", "no target", "muted")
    if not v.target.available:
        return Cell("-", "target unavailable", "muted")
    return estimate_cell


def _target_caption(suite: SuiteReport, effective: bool) -> str:
    targets = "; ".join(t.describe() for t in suite.targets)
    caption = (
        f" Target: {targets}; steps and time to target are interpolated between the two evaluations that bracket "
        "the crossing."
    )
    references = sorted({t.reference.optim for t in suite.targets if t.reference is not None})
    if references:
        caption += (
            f" Speed-up: {', '.join(references)}'s total steps (time) over this row's steps (time) to its final value "
            "(>1: reaches it sooner)."
        )
        return caption + (
            " Effective throughput: the items it trained on over this row's time to that value." if effective else ""
        )
    return caption + " Speed-up: the baseline's median over this row's (>1: faster than the baseline)."


def _state_cells(v: VariantSummary) -> tuple[Cell, Cell]:
    measured = Cell(fmt_bytes(v.state_bytes))
    if math.isnan(v.analytic_state_bytes):
        return measured, Cell("-", tone="muted", title="no analytic figure in the store for this optimizer")
    if math.isnan(v.state_bytes) or v.analytic_state_bytes == v.state_bytes:
        return measured, Cell(fmt_bytes(v.analytic_state_bytes), "matches" if not math.isnan(v.state_bytes) else "")
    return measured, Cell(
        fmt_bytes(v.analytic_state_bytes),
        f"≠ measured ({v.analytic_state_bytes - v.state_bytes:+.0f} B)",
        "bad",
    )


def suite_table(suite: SuiteReport, every_setting: bool = False) -> Table:
    """One row per optimizer (its selected setting), or per setting: outcomes, quality, time to target, cost.

    A suite without a target has no time-to-target or speed-up columns.
    """
    variants = suite.variants if every_setting else list(suite.selected.values())
    arrow = "↓" if suite.metric_mode == "min" else "↑"
    timed = bool(suite.targets)
    effective = timed and _has_effective_throughput(variants)
    throughput = any(not math.isnan(v.throughput_per_s) for v in variants)
    columns = [
        Column("optimizer", "all", left=True),
        Column("runs", "results", left=True, wrap=False),
        Column("final eval loss ↓", "results"),
        Column(f"final {suite.metric_name} {arrow}", "results"),
        *TIME_COLUMNS[: 4 if timed else 0],
        *([Column("effective throughput", "results")] if effective else []),
        Column("step time", "cost"),
        Column("optimizer share", "cost"),
        Column("compile", "cost"),
        *([Column("throughput", "cost")] if throughput else []),
        Column("peak memory", "cost"),
        Column("state (measured)", "cost"),
        Column("state (analytic)", "cost"),
        Column("routing", "cost", left=True),
    ]
    losses = _estimate_cells([v.final_loss for v in variants], fmt_num)
    metrics = _estimate_cells([v.final_metric for v in variants], fmt_num, suite.metric_mode == "min")
    steps = _estimate_cells([v.steps_to_target for v in variants], fmt_steps)
    seconds = _estimate_cells([v.seconds_to_target for v in variants], fmt_seconds)
    rows = []
    for i, v in enumerate(variants):
        failed = any(v.statuses.get(s) for s in STATUSES if s != "ok")
        reached = f"{v.reached}/{len(v.crossings)} reached" if v.target is not None else ""
        steps_cell, seconds_cell = _target_cell(steps[i], v), _target_cell(seconds[i], v)
        if v.target is not None and v.target.available:
            steps_cell = Cell(steps_cell.text, f"{steps_cell.sub} {reached}".strip(), steps_cell.tone)
        measured, analytic = _state_cells(v)
        rows.append(
            [
                Cell(
                    v.label,
                    "baseline" if v is suite.baseline else "",
                    "muted" if not v.has_ok else "",
                    link=v.variant.anchor,
                ),
                Cell(status_text(v.statuses), tone="bad" if failed else ""),
                losses[i],
                metrics[i],
                *(
                    [steps_cell, seconds_cell, _speedup_cell(suite, v, "steps"), _speedup_cell(suite, v, "seconds")]
                    if timed
                    else []
                ),
                *([_effective_throughput_cell(v)] if effective else []),
                Cell(fmt_seconds(v.step_time_s)),
                Cell(fmt_percent(v.optim_share)),
                Cell(fmt_seconds(v.compile_s)),
                *([_throughput_cell(v)] if throughput else []),
                Cell(fmt_bytes(v.peak_mem_bytes), v.mem_source),
                measured,
                analytic,
                Cell(v.routing, title=v.routing_detail),
            ]
        )
    caption = "Medians over seeds with 95% bootstrap CIs in brackets."
    if timed:
        caption += _target_caption(suite, effective)
    if every_setting:
        return Table(f"{suite.name}: every setting", columns, rows, caption, key=anchor("settings", suite.name))
    if len(suite.variants) > len(suite.selected):
        caption += (
            " Optimizers run under several settings show their selected one (chosen on a validation metric, else on "
            "the training loss, never on this evaluation; the notes say which); the Markdown and HTML reports also "
            "list every setting."
        )
    return Table(f"{suite.name}: results per optimizer", columns, rows, caption, key=anchor("suite", suite.name))


def _seeds_cell(score: Score) -> Cell:
    """Ok seeds with a value; the runs that count and their failures below when some seeds have none."""
    if score.n == score.runs:
        return Cell(str(score.n))
    failed = ", ".join(f"{n} {s}" for s, n in score.failures.items())
    return Cell(str(score.n), f"of {score.runs}" + (f"; {failed}" if failed else ""), "bad" if score.failures else "")


SWEEP_RULE = (
    "median over the ok seeds (min – max over the seeds); a setting with a diverged, oom, solver_error or timeout "
    "run is never selected over one without."
)


def sweep_table(sweep: Sweep, captioned: bool = True) -> Table:
    """Every setting of a swept optimizer: ok seeds, the selection metric's median and range, the selected mark.

    Without `captioned` (the terminal, which states the rule once per suite) there is no caption: the metric's
    column header names it."""
    criterion = sweep.criterion
    columns = [
        Column("setting", left=True),
        Column("seeds"),
        Column(f"{criterion.name} {criterion.arrow}"),
        Column("min – max"),
        Column("selected", left=True),
    ]
    rows = []
    for point in sweep.settings:
        s = point.score
        spread = "-" if s.n == 0 else (fmt_num(s.lo) if s.n == 1 else f"{fmt_num(s.lo)} – {fmt_num(s.hi)}")
        rows.append(
            [
                Cell(sweep.setting_text(point), link=point.variant.variant.anchor),
                _seeds_cell(s),
                Cell(fmt_num(s.median), tone="best" if point.selected and s.n else ("muted" if not s.n else "")),
                Cell(spread),
                Cell("◀ selected" if point.selected else "", tone="good" if point.selected else ""),
            ]
        )
    title = f"{sweep.suite}: {sweep.optim} over {', '.join(sweep.names)}"
    key = anchor("sweep", f"{sweep.suite}-{sweep.optim}")
    described = criterion.describe()
    if not captioned:
        return Table(title, columns, rows, key=key)
    what = f"the final {criterion.name}, " if criterion.column else ""
    caption = f"{described[0].upper()}{described[1:]}: {what}{SWEEP_RULE}"
    if len(sweep.keys) > 1:
        caption += " The figure plots each hyperparameter with the others held at the selected setting's values."
    return Table(title, columns, rows, caption, key=key)


def _throughput_cell(v: VariantSummary) -> Cell:
    if math.isnan(v.throughput_per_s):
        return Cell("-")
    return Cell(f"{v.throughput_per_s:,.0f}", v.throughput_unit)


def _paired_cells(paired: Paired | None, fmt: Callable[[Any], str]) -> tuple[Cell, Cell]:
    if paired is None:
        return Cell("-"), Cell("-")
    text, sub = signed_estimate_text(paired.difference, fmt)
    directional = not paired.verdict.startswith("no detectable")
    good = paired.verdict in ("faster", "fewer steps", "better")
    return Cell(text, sub), Cell(paired.verdict, tone=("good" if good else "bad") if directional else "muted")


def comparison_table(suite: SuiteReport) -> Table | None:
    """Each optimizer's selected setting against the baseline's, paired by seed."""
    if not suite.comparisons:
        return None
    assert suite.baseline is not None
    timed = bool(suite.targets)
    columns = [Column("optimizer", left=True), Column("paired seeds")]
    if timed:
        columns += [
            Column("Δ time to target"),
            Column("verdict", left=True),
            Column("Δ steps to target"),
            Column("verdict", left=True),
        ]
    columns += [Column(f"Δ final {suite.metric_name}"), Column("verdict", left=True)]
    rows = []
    for c in suite.comparisons:
        timing = [*_paired_cells(c.seconds, fmt_seconds), *_paired_cells(c.steps, fmt_steps)] if timed else []
        rows.append(
            [
                Cell(c.variant.label, link=c.variant.variant.anchor),
                Cell(str(len(c.seeds))),
                *timing,
                *_paired_cells(c.metric, fmt_num),
            ]
        )
    caption = (
        f"Against {suite.baseline.label} on the seeds both ran: median of the per-seed differences (row minus "
        "baseline) with its 95% bootstrap CI. A verdict needs at least 3 paired seeds and a CI that excludes 0"
        + ("; pairs where neither reached the target are left out." if timed else ".")
    )
    return Table(
        f"{suite.name}: paired comparison with the baseline", columns, rows, caption, key=anchor("paired", suite.name)
    )


def failure_table(suite: SuiteReport) -> Table | None:
    """Every run that did not end ok: none is dropped silently."""
    if suite.failures.empty:
        return None
    columns = [
        Column("run", left=True),
        Column("setting", left=True),
        Column("seed"),
        Column("status", left=True),
        Column("at step"),
        Column("message", left=True),
    ]
    rows = [
        [
            Cell(str(r.run_id)),
            Cell(str(r.variant)),
            Cell(fmt_num(r.seed)),
            Cell(str(r.status), tone="bad"),
            Cell(fmt_num(r.steps)),
            Cell(str(r.message) or "-"),
        ]
        for r in suite.failures.itertuples()
    ]
    return Table(f"{suite.name}: runs that did not end ok", columns, rows, key=anchor("failures", suite.name))


def profile_table(profile: Profile, basis: str) -> Table:
    """rho(tau) at a few tau and the normalised area, per optimizer, best score first."""
    rho = profile.rho(list(TAU_COLUMNS))
    score = profile.score()
    columns = [Column("optimizer", left=True)] + [Column(f"ρ({t:g})") for t in TAU_COLUMNS] + [Column("score")]
    order = sorted(profile.ratios.columns, key=lambda o: (-score[o], o))
    top = score.max()
    rows = [
        [Cell(o)]
        + [Cell(f"{rho.loc[t, o]:.2f}") for t in TAU_COLUMNS]
        + [Cell(f"{score[o]:.3f}", tone="best" if score[o] == top and top > 0 else "")]
        for o in order
    ]
    caption = (
        f"Over {len(profile.suites)} suite(s) with a target ({', '.join(profile.suites)}). ρ(τ): fraction of suites "
        f"where the optimizer's median {basis} to target is within a factor τ of the fastest optimizer's. Score: the "
        "area under ρ over τ in [1, 4], divided by 3 (1: fastest everywhere)."
    )
    return Table(f"Performance profile: {basis} to target", columns, rows, caption, key=f"profile-{basis}")


def rank_table(report: Report) -> Table | None:
    ranks = report.ranks
    if ranks is None:
        return None
    suites = list(ranks.ranks.index)
    per_suite = len(suites) <= MAX_RANK_COLUMNS
    columns = [Column("optimizer", left=True), Column("mean rank"), Column("suites with an ok run")]
    if per_suite:
        columns += [Column(s) for s in suites]
    mean = ranks.mean
    best = mean.min()
    rows = []
    for optim in sorted(mean.index, key=lambda o: (mean[o], o)):
        row = [
            Cell(optim),
            Cell(f"{mean[optim]:.2f}", tone="best" if mean[optim] == best else ""),
            Cell(f"{int(ranks.ranked[optim].sum())}/{len(suites)}"),
        ]
        if per_suite:
            row += [
                Cell(f"{ranks.ranks.loc[s, optim]:g}", tone="" if ranks.ranked.loc[s, optim] else "muted")
                for s in suites
            ]
        rows.append(row)
    caption = (
        "Rank by median final eval metric on each suite (1 = best; ties share the mean rank; an optimizer without "
        "an ok run on a suite ties for last there)."
    )
    return Table("Rank across suites", columns, rows, caption, key="ranks")


def runs_of_variant(variant: Variant, env_of: Mapping[str, str], superseded: bool = False) -> Table:
    """The variant's runs (or its superseded ones): id, seed, status, steps, start time, environment."""
    columns = [
        Column("run", left=True),
        Column("seed"),
        Column("status", left=True),
        Column("steps"),
        Column("started (UTC)", left=True),
        Column("env", left=True),
    ]
    source, rows_at = (variant.older, variant.older_rows) if superseded else (variant.latest, variant.rows)
    values = [source[c][rows_at] for c in ("run_id", "seed", "status", "steps", "started_at")]
    rows = [
        [
            Cell(str(run_id)),
            Cell(fmt_num(seed)),
            Cell(str(status) + (" (superseded)" if superseded else ""), tone="" if status == "ok" else "bad"),
            Cell(fmt_num(steps)),
            Cell(pd.Timestamp(started).strftime("%Y-%m-%d %H:%M:%S") if not pd.isna(started) else "-"),
            Cell(env_of.get(run_id, "-")),
        ]
        for run_id, seed, status, steps, started in zip(*values, strict=True)
    ]
    return Table("runs", columns, rows)


def _claims(text: object) -> list[dict[str, Any]]:
    try:
        claims = json.loads(text) if isinstance(text, str) else []
    except json.JSONDecodeError:
        claims = []
    return [c for c in claims if isinstance(c, dict)] if isinstance(claims, list) else []


def experiment_table(report: Report) -> Table | None:
    """Each numerical-experiment run's claims: whether each holds, and the numbers behind it."""
    runs = report.experiments
    if runs.empty:
        return None
    columns = [
        Column("suite", left=True),
        Column("seed"),
        Column("status", left=True),
        Column("claim", left=True),
        Column("holds", left=True),
        Column("evidence", left=True),
    ]
    rows = []
    for run in runs.itertuples():
        claims = _claims(run.claims) or [{}]
        for claim in claims:
            holds = claim.get("holds")
            rows.append(
                [
                    Cell(str(run.suite), title=str(run.run_id)),
                    Cell(fmt_num(run.seed)),
                    Cell(str(run.status), tone="" if run.status == "ok" else "bad"),
                    Cell(str(claim.get("statement", "-")), str(claim.get("source", ""))),
                    Cell(
                        "-" if holds is None else ("yes" if holds else "no"),
                        tone={True: "good", False: "bad"}.get(holds, ""),
                    ),
                    Cell(str(claim.get("evidence", "-"))),
                ]
            )
    caption = "Experiment suites compute a table rather than train; each claim they check is listed with its evidence."
    return Table("Numerical experiments", columns, rows, caption, key="experiments")


def environment_table(report: Report) -> Table:
    env = report.environments()
    columns = [Column(c, left=c != "runs") for c in env.columns]
    rows = [[Cell(str(v)) for v in record] for record in env.itertuples(index=False)]
    return Table("Environments", columns, rows, key="environments")
