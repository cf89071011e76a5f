"""The report's tables as plain data (cells of text), rendered alike by the terminal, Markdown and HTML writers.

Every quality column names its split ("val", "test"; "exact" for an exact objective), every median carries its
interval's kind ("min–max" below 5 seeds, "95% CI" from 5), a number is marked best in its column only from 3 seeds,
and a number a short budget makes unreliable (too few evaluations, a crossing interpolated over more than a quarter
of the run) carries the warning beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from structbench.report.analysis.profiles import TAU_COLUMNS, Profile, Ranks
from structbench.report.analysis.provenance import untuned, words
from structbench.report.analysis.selection import Score
from structbench.report.analysis.stats import MIN_BEST_SEEDS, MIN_SEEDS, Estimate, Paired
from structbench.report.analysis.summary import VariantSummary
from structbench.report.analysis.sweeps import Sweep
from structbench.report.analysis.variants import Variant
from structbench.report.build import Report, SuiteReport
from structbench.report.views.anchors import anchor
from structbench.report.views.format import (
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
from structbench.store.write import STATUSES

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
    """Whether the terminal may wrap the column's text at spaces (either way it folds what does not fit)."""
    prose: bool = False
    """Long text (messages, claims, evidence): wrapped to a readable width in HTML instead of widening the table."""


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[Column]
    rows: list[list[Cell]]
    caption: str = ""
    key: str = field(default="")


def status_text(statuses: dict[str, int] | Any) -> str:
    return " · ".join(f"{statuses[s]} {s}" for s in STATUSES if statuses.get(s)) or "-"


def _best(estimates: Sequence[Estimate], lower_is_better: bool = True) -> set[int]:
    """Rows holding the column's best finite median over at least MIN_BEST_SEEDS seeds; none when every such value
    is the same."""
    finite = {
        i: e.median if lower_is_better else -e.median
        for i, e in enumerate(estimates)
        if math.isfinite(e.median) and e.n >= MIN_BEST_SEEDS
    }
    if len(set(finite.values())) < 2:
        return set()
    top = min(finite.values())
    return {i for i, v in finite.items() if v == top}


def _estimate_cells(
    estimates: Sequence[Estimate], fmt: Callable[[Any], str], lower_is_better: bool = True, infinite: str = NOT_REACHED
) -> list[Cell]:
    best = _best(estimates, lower_is_better)
    cells = []
    for i, e in enumerate(estimates):
        text, sub = estimate_text(e, fmt, infinite)
        cells.append(Cell(text, sub, "best" if i in best else ("bad" if text == NOT_REACHED else "")))
    return cells


def _budget_flag(v: VariantSummary) -> str:
    """The warning a short budget puts beside a row's time to target (and speed-up), or ""."""
    parts = []
    if v.few_evaluations:
        fewest = min(v.few_evaluations.values())
        parts.append(f"⚠ {fewest} evaluations")
    if v.wide_crossings:
        widest = max(c.span for c in v.wide_crossings.values())
        parts.append(f"⚠ interpolated over {widest:.0%}")
    return "; ".join(parts)


def _flagged(cell: Cell, flag: str) -> Cell:
    if not flag:
        return cell
    sub = f"{cell.sub} {flag}".strip() if cell.sub else flag
    return Cell(cell.text, sub, "bad" if cell.tone in ("", "good", "best") else cell.tone, cell.title, cell.link)


def _speedup_cell(suite: SuiteReport, v: VariantSummary, unit: str) -> Cell:
    if v.target is None or not v.target.available:
        return Cell("-")
    derived = v.target.reference is not None
    baseline = suite.baseline_of(v)
    if not derived and baseline is None:
        return Cell("-")
    if v is baseline if not derived else _is_reference(v):
        return Cell("1x", "baseline", "muted")
    estimate = v.steps_to_target if unit == "steps" else v.seconds_to_target
    if math.isinf(estimate.median):
        return Cell(NOT_REACHED, tone="bad")
    ratio = suite.speedup(v, unit)
    if math.isinf(ratio):
        return Cell("∞", "reached before training" if derived else "baseline not reached", "good")
    cell = Cell(fmt_ratio(ratio), tone="good" if ratio > 1 else "")
    reference = baseline if not derived else None
    flags = [f for f in (_budget_flag(v), _budget_flag(reference) if reference is not None else "") if f]
    return _flagged(cell, "; ".join(dict.fromkeys(flags)))


def _is_reference(v: VariantSummary) -> bool:
    """Whether this row is the baseline variant its target was derived from (its speed-up is 1 by definition)."""
    reference = v.target.reference if v.target is not None else None
    return reference is not None and v.variant.label == reference.label and v.variant.optim_name == reference.optim


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
    return _flagged(Cell(f"{reference.effective_throughput(seconds):,.0f}", reference.rate_unit), _budget_flag(v))


def _target_cell(estimate_cell: Cell, v: VariantSummary) -> Cell:
    """A steps or time to target cell, or why there is none."""
    if v.target is None:
        return Cell("-", "no target", "muted")
    if not v.target.available:
        return Cell("-", "target unavailable", "muted")
    return _flagged(estimate_cell, _budget_flag(v))


def _target_caption(suite: SuiteReport, effective: bool) -> str:
    targets = "; ".join(t.describe() for t in suite.targets)
    caption = (
        f" Target: {targets}; steps and time to target are measured on the {suite.timing_split or 'evaluation'} "
        "split, interpolated between the two evaluations that bracket the crossing (⚠: a run with fewer than 3 "
        "evaluations, or a crossing interpolated over one interval longer than a quarter of the run: that "
        "percentage of the run)."
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


def _split_word(suite: SuiteReport) -> str:
    """The evaluation's split as the headers name it."""
    return "exact" if suite.eval_split == "exact" else "test"


def _memory_cell(v: VariantSummary) -> Cell:
    """Peak memory with its source; CPU resident-set figures carry their caveat."""
    cell = Cell(fmt_bytes(v.peak_mem_bytes), v.mem_source)
    if "rss" in v.mem_source:
        title = (
            "CPU resident set: the process's peak during the run above its size before the run (rss-delta), or "
            "the whole process's peak (rss, older stores); allocator caches, and in a process's first run the "
            "one-time allocations torch makes on first use, make it approximate (run --executor local gives each run "
            "its own process), so the Pareto front uses optimizer-state bytes on CPU."
        )
        return Cell(cell.text, f"{v.mem_source} (approximate)", "muted", title)
    return cell


def _quality_columns(suite: SuiteReport, every_setting: bool) -> list[tuple[Column, str, bool]]:
    """(column, VariantSummary attribute, lower is better) of the quality columns (module docstring: the test split
    only for selected settings; a suite without validation shows the training loss per setting)."""
    arrow = "↓" if suite.metric_mode == "min" else "↑"
    lower = suite.metric_mode == "min"
    split = _split_word(suite)
    columns = []
    if suite.validated:
        columns += [
            (Column("final val loss ↓", "results"), "final_val_loss", True),
            (Column(f"final val {suite.metric_name} {arrow}", "results"), "final_val_metric", lower),
        ]
    elif every_setting:
        columns.append((Column("final training loss ↓", "results"), "final_train_loss", True))
    if not every_setting:
        columns += [
            (Column(f"final {split} loss ↓", "results"), "final_loss", True),
            (Column(f"final {split} {suite.metric_name} {arrow}", "results"), "final_metric", lower),
        ]
    return columns


@dataclass(frozen=True)
class _OptionalColumns:
    """Which of the suite table's optional columns it shows."""

    store: bool
    """Over several stores: each row's store."""
    timed: bool
    """With a target: steps and time to target and the speed-ups."""
    effective: bool
    """With a target from a baseline whose runs record a throughput."""
    throughput: bool
    """When some row records a throughput."""


def suite_table(suite: SuiteReport, every_setting: bool = False) -> Table:
    """One row per optimizer (its selected setting), or per setting: outcomes, quality, time to target, cost.

    A suite without a target has no time-to-target or speed-up columns; the every-setting table has no test-split
    numbers (the test split is reported for the selected setting only)."""
    variants = suite.variants if every_setting else list(suite.selected.values())
    timed = bool(suite.targets)
    shown = _OptionalColumns(
        store=len(suite.stores) > 1,
        timed=timed,
        effective=timed and _has_effective_throughput(variants),
        throughput=any(not math.isnan(v.throughput_per_s) for v in variants),
    )
    quality = _quality_columns(suite, every_setting)
    columns = _suite_columns(suite, quality, shown)
    rows = _suite_rows(suite, variants, quality, shown, every_setting)
    caption = _suite_caption(suite, variants, shown, every_setting)
    if every_setting:
        return Table(f"{suite.name}: every setting", columns, rows, caption, key=anchor("settings", suite.name))
    return Table(f"{suite.name}: results per optimizer", columns, rows, caption, key=anchor("suite", suite.name))


def _suite_columns(
    suite: SuiteReport, quality: Sequence[tuple[Column, str, bool]], shown: _OptionalColumns
) -> list[Column]:
    """The suite table's columns, grouped as the terminal prints them: results, time to target, cost."""
    timing = f" ({suite.timing_split})" if suite.timing_split else ""
    return [
        Column("optimizer", "all", left=True),
        *([Column("store", "results", left=True)] if shown.store else []),
        Column("runs", "results", left=True, wrap=False),
        Column("hyperparameters", "results", left=True),
        *(column for column, _, _ in quality),
        *(
            [
                Column(f"steps to target{timing}", "time to target"),
                Column(f"time to target{timing}", "time to target"),
                Column("speed-up (steps)", "time to target"),
                Column("speed-up (time)", "time to target"),
            ]
            if shown.timed
            else []
        ),
        *([Column("effective throughput", "time to target")] if shown.effective else []),
        Column("step time", "cost"),
        Column("optimizer share", "cost"),
        Column("compile", "cost"),
        *([Column("throughput", "cost")] if shown.throughput else []),
        Column("peak memory", "cost"),
        Column("state (measured)", "cost"),
        Column("state (analytic)", "cost"),
        Column("routing", "cost", left=True),
    ]


def _suite_rows(
    suite: SuiteReport,
    variants: Sequence[VariantSummary],
    quality: Sequence[tuple[Column, str, bool]],
    shown: _OptionalColumns,
    every_setting: bool,
) -> list[list[Cell]]:
    """The suite table's rows, one per variant; medians are marked best against the other rows of their column."""
    quality_cells = [
        _estimate_cells([getattr(v, attribute) for v in variants], fmt_num, lower) for _, attribute, lower in quality
    ]
    steps = _estimate_cells([v.steps_to_target for v in variants], fmt_steps)
    seconds = _estimate_cells([v.seconds_to_target for v in variants], fmt_seconds)
    settings = {o: sum(1 for v in suite.variants if v.optim == o) for o in suite.selected}
    return [
        _suite_row(
            suite,
            v,
            [cells[i] for cells in quality_cells],
            (_steps_to_target_cell(steps[i], v), _target_cell(seconds[i], v)),
            words(v.hparams_source, 1 if every_setting else settings.get(v.optim, 1)),
            shown,
        )
        for i, v in enumerate(variants)
    ]


def _steps_to_target_cell(estimate_cell: Cell, v: VariantSummary) -> Cell:
    """The steps to target cell, with how many seeds reached the target beside its interval."""
    if v.target is not None and v.target.available:
        reached = f"{v.reached}/{len(v.crossings)} reached"
        estimate_cell = Cell(estimate_cell.text, f"{estimate_cell.sub} {reached}".strip(), estimate_cell.tone)
    return _target_cell(estimate_cell, v)


def _suite_row(
    suite: SuiteReport,
    v: VariantSummary,
    quality: Sequence[Cell],
    to_target: tuple[Cell, Cell],
    source: str,
    shown: _OptionalColumns,
) -> list[Cell]:
    """One variant's cells: `quality` its quality columns', `to_target` its steps and time to target, `source` where
    its hyperparameters come from in words."""
    failed = any(v.statuses.get(s) for s in STATUSES if s != "ok")
    measured, analytic = _state_cells(v)
    return [
        Cell(
            v.label,
            "baseline" if v is suite.baseline_of(v) else "",
            "muted" if not v.has_ok else "",
            link=v.variant.anchor,
        ),
        *([Cell(v.variant.store)] if shown.store else []),
        Cell(status_text(v.statuses), tone="bad" if failed else ""),
        Cell(source, tone="bad" if untuned(v.hparams_source) else ""),
        *quality,
        *([*to_target, _speedup_cell(suite, v, "steps"), _speedup_cell(suite, v, "seconds")] if shown.timed else []),
        *([_effective_throughput_cell(v)] if shown.effective else []),
        Cell(fmt_seconds(v.step_time_s)),
        Cell(fmt_percent(v.optim_share)),
        Cell(fmt_seconds(v.compile_s)),
        *([_throughput_cell(v)] if shown.throughput else []),
        _memory_cell(v),
        measured,
        analytic,
        Cell(v.routing, title=v.routing_detail),
    ]


def _suite_caption(
    suite: SuiteReport, variants: Sequence[VariantSummary], shown: _OptionalColumns, every_setting: bool
) -> str:
    """What the suite table's numbers are: intervals, splits, hyperparameters, the target, memory, and (per
    optimizer) how a setting was selected."""
    caption = (
        f"Medians over seeds; below each, the smallest and largest seed's value (min–max) with fewer than {MIN_SEEDS} "
        f"seeds, else the 95% bootstrap CI; best in a column (bold) from {MIN_BEST_SEEDS} seeds."
    )
    if suite.validated:
        caption += (
            f" val: the validation split (selection, targets); {_split_word(suite)}: "
            + ("the exact objective" if suite.eval_split == "exact" else "the test split")
            + (", not shown per setting." if every_setting else ", for the selected setting only.")
        )
    else:
        caption += " These runs hold out no validation split."
    caption += " Hyperparameters: the suite's, or untuned here (the registry's defaults: not a finding)."
    if shown.timed:
        caption += _target_caption(suite, shown.effective)
    if any("rss" in v.mem_source for v in variants):
        caption += (
            " Peak memory on CPU is the process's resident set (approximate: allocator caches, and a process's "
            "first run counts torch's one-time allocations); optimizer-state bytes are exact."
        )
    if not every_setting and len(suite.variants) > len(suite.selected):
        caption += (
            " Optimizers run under several settings show their selected one (chosen on a validation metric, else on "
            "the training loss, never on the test split; the notes say which); the Markdown and HTML reports also "
            "list every setting."
        )
    return caption


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
    good = paired.verdict in ("faster", "fewer steps", "better")
    tone = ("good" if good else "bad") if paired.directional else "muted"
    test = f"Wilcoxon p={paired.p_value:.2g}" if paired.p_value is not None else ""
    return Cell(text, sub), Cell(paired.verdict, test, tone)


def comparison_table(suite: SuiteReport) -> Table | None:
    """Each optimizer's selected setting against the baseline of its store, paired by seed."""
    if not suite.comparisons:
        return None
    timed = bool(suite.targets)
    timing = f" ({suite.timing_split})" if suite.timing_split else ""
    split = _split_word(suite)
    stores = len(suite.stores) > 1
    columns = [Column("optimizer", left=True), *([Column("store", left=True)] if stores else [])]
    columns.append(Column("paired seeds"))
    if timed:
        columns += [
            Column(f"Δ time to target{timing}"),
            Column("verdict (time)", left=True, wrap=False),
            Column(f"Δ steps to target{timing}"),
            Column("verdict (steps)", left=True, wrap=False),
        ]
    columns += [Column(f"Δ final {split} {suite.metric_name}"), Column(f"verdict ({split})", left=True, wrap=False)]
    rows = []
    for c in suite.comparisons:
        timing_cells = [*_paired_cells(c.seconds, fmt_seconds), *_paired_cells(c.steps, fmt_steps)] if timed else []
        rows.append(
            [
                Cell(c.variant.label, link=c.variant.variant.anchor),
                *([Cell(c.variant.variant.store)] if stores else []),
                Cell(str(len(c.seeds))),
                *timing_cells,
                *_paired_cells(c.metric, fmt_num),
            ]
        )
    against = ", ".join(b.label for b in suite.baselines.values())
    caption = (
        f"Against {against} on the seeds both ran: the median of the per-seed differences (row minus baseline) with "
        f"its min–max below {MIN_SEEDS} pairs, else its 95% bootstrap CI. Below {MIN_SEEDS} pairs there is no "
        f"verdict ('too few seeds'). From {MIN_SEEDS}: the exact two-sided Wilcoxon signed-rank test; a direction "
        "needs p < 0.05 and a CI that excludes 0 (one that touches 0 gives 'no detectable difference'). With 5 "
        "pairs the smallest p is 0.0625, so a direction needs at least 6."
        + (" Pairs where neither reached the target are left out." if timed else "")
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
        Column("message", left=True, prose=True),
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
    """rho(tau) at a few tau and the normalised area, per optimizer over the suites it ran, best score first."""
    suites = len(profile.suites)
    rho = profile.rho(list(TAU_COLUMNS))
    score = profile.score()
    coverage = profile.coverage
    columns = [Column("optimizer", left=True), Column("suites run")]
    columns += [Column(f"ρ({t:g})") for t in TAU_COLUMNS] + [Column("score")]
    ran = [o for o in profile.ratios.columns if coverage[o] > 0]
    order = sorted(ran, key=lambda o: (-score[o], o))
    top = max((score[o] for o in ran), default=0.0)
    rows = [
        [Cell(o), Cell(f"{int(coverage[o])}/{suites}", tone="" if coverage[o] == suites else "muted")]
        + [Cell(f"{rho.loc[t, o]:.2f}") for t in TAU_COLUMNS]
        + [Cell(f"{score[o]:.3f}", tone="best" if score[o] == top and top > 0 else "")]
        for o in order
    ]
    caption = (
        f"Over {len(profile.suites)} suite(s) with a target ({', '.join(profile.suites)}), each optimizer over the "
        f"suites it ran (suites run). ρ(τ): the fraction of those suites where its median {basis} to target (on the "
        "validation split where the runs hold one out) is within a factor τ of the fastest optimizer's there. Score: "
        "the area under ρ over τ in [1, 4], divided by 3 (1: fastest everywhere it ran)."
    )
    return Table(f"Performance profile: {basis} to target", columns, rows, caption, key=f"profile-{basis}")


def rank_table(report: Report) -> Table | None:
    ranks = report.ranks
    if ranks is None:
        return None
    suites = list(ranks.ranks.index)
    per_suite = len(suites) <= MAX_RANK_COLUMNS
    columns = [Column("optimizer", left=True), Column("mean rank"), Column("suites run"), Column("with an ok run")]
    if per_suite:
        columns += [Column(s) for s in suites]
    mean = ranks.mean
    ran = [o for o in mean.index if ranks.coverage[o] > 0]
    best = min((mean[o] for o in ran), default=math.nan)
    rows = []
    for optim in sorted(ran, key=lambda o: (mean[o], o)):
        row = [
            Cell(optim),
            Cell(f"{mean[optim]:.2f}", tone="best" if mean[optim] == best else ""),
            Cell(
                f"{int(ranks.coverage[optim])}/{len(suites)}",
                tone="" if ranks.coverage[optim] == len(suites) else "muted",
            ),
            Cell(str(int(ranks.ranked[optim].sum()))),
        ]
        if per_suite:
            row += [_rank_cell(ranks, s, optim) for s in suites]
        rows.append(row)
    left_out = (
        f" Left out: {', '.join(report.left_out)} (smoke suites; --include-smoke counts them)."
        if report.left_out
        else ""
    )
    if report.without_ok:
        left_out += f" Left out: {', '.join(report.without_ok)} (no ok run)."
    caption = (
        "Rank by median final metric (test split) on each suite among the optimizers that ran it (1 = best; ties "
        "share the mean rank; one without an ok run there ties for last among them); not run: no rank. Mean rank "
        f"over the suites each optimizer ran (suites run).{left_out}"
    )
    return Table("Rank across suites", columns, rows, caption, key="ranks")


def _rank_cell(ranks: Ranks, suite: str, optim: str) -> Cell:
    if not ranks.ran.loc[suite, optim]:
        return Cell("-", "not run", "muted")
    return Cell(
        f"{ranks.ranks.loc[suite, optim]:g}",
        "" if ranks.ranked.loc[suite, optim] else "no ok run",
        "" if ranks.ranked.loc[suite, optim] else "muted",
    )


def runs_of_variant(variant: Variant, env_of: Mapping[str, str], superseded: bool = False) -> Table:
    """The variant's runs (or its superseded ones): id, seed, status, steps, start time, environment, command line."""
    columns = [
        Column("run", left=True),
        Column("seed"),
        Column("status", left=True),
        Column("steps"),
        Column("started (UTC)", left=True),
        Column("env", left=True),
        Column("command", left=True, prose=True),
    ]
    source, rows_at = (variant.older, variant.older_rows) if superseded else (variant.latest, variant.rows)
    values = [source[c][rows_at] for c in ("run_id", "seed", "status", "steps", "started_at", "command")]
    rows = [
        [
            Cell(str(run_id)),
            Cell(fmt_num(seed)),
            Cell(str(status) + (" (superseded)" if superseded else ""), tone="" if status == "ok" else "bad"),
            Cell(fmt_num(steps)),
            Cell(pd.Timestamp(started).strftime("%Y-%m-%d %H:%M:%S") if not pd.isna(started) else "-"),
            Cell(env_of.get(run_id, "-")),
            Cell(command if isinstance(command, str) else "-"),
        ]
        for run_id, seed, status, steps, started, command in zip(*values, strict=True)
    ]
    return Table("runs", columns, rows)


def frame_table(frame: pd.DataFrame, title: str) -> Table:
    """A result table (an experiment's) as a Table the writers split to fit, never cutting a number: text columns
    left-aligned, numbers right-aligned with 4 significant digits; the first column labels the rows."""
    columns = [
        Column(str(name), group="columns", left=not pd.api.types.is_numeric_dtype(frame[name]) or i == 0)
        for i, name in enumerate(frame.columns)
    ]
    rows = [[Cell(_frame_value_text(value)) for value in values] for values in frame.itertuples(index=False)]
    return Table(title, columns, rows)


def _frame_value_text(value: object) -> str:
    """A number with 4 significant digits, a missing value (None, NaN, NA) as "-", anything else as its text."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt_num(value) if isinstance(value, float) else str(value)


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
        Column("claim", left=True, prose=True),
        Column("holds", left=True),
        Column("evidence", left=True, prose=True),
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
    """One column per environment (E1, E2, ...), one row per recorded field, the number of runs last."""
    env = report.environments().set_index("env")
    columns = [Column("field", left=True), *(Column(str(e), left=True) for e in env.index)]
    rows = [[Cell(str(field)), *(Cell(str(v)) for v in env[field])] for field in env.columns]
    return Table("Environments", columns, rows, key="environments")
