"""A paper's claim as a small experiment that ends in one of three verdicts, and the rules that give the verdict.

A claim is registered with its paper, an id, the paper's statement and where it is made (arXiv id with the table,
figure, section or lemma), and the paper's own number. Running it at a scale ("ci": seconds, for the tests; "cpu":
minutes, the scale whose verdicts are reported; "gpu": the longer version) gives an Outcome: the verdict, the
numbers measured, the seeds and split they rest on, the budget, and how the hyperparameters were chosen.

Verdicts:
- HOLDS: our numbers support the statement at this scale;
- FAILS ("does not hold at this scale"): they do not, and the numbers say by how much;
- UNTESTABLE ("not testable here"): the claim cannot be checked with what this scale or machine has (too few seeds
  for a paired test, a GPU, data the user lacks); the reason is given.

Training comparisons use the verdict statistics of `structbench.report.analysis.stats`: the median paired difference
over seeds with its 95% bootstrap interval and the exact Wilcoxon signed-rank test. Below MIN_SEEDS (5) pairs the
verdict is UNTESTABLE ("too few seeds"), never "no difference"; with 5 pairs the smallest two-sided p is 0.0625, so a
direction needs at least 6 seeds that all agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from structbench.report.analysis.stats import MIN_SEEDS, Paired, median_ci, paired_difference

HOLDS = "holds"
FAILS = "does not hold at this scale"
UNTESTABLE = "not testable here"
VERDICTS = (HOLDS, FAILS, UNTESTABLE)
SCALES = ("ci", "cpu", "gpu")


@dataclass(frozen=True)
class Outcome:
    """What running a claim found."""

    verdict: str
    numbers: dict[str, float]
    """The measured numbers behind the verdict, by name (finite unless a run failed)."""
    summary: str
    """Our numbers in words, set beside the paper's."""
    seeds: str = "1 (a single evaluation)"
    """How many seeds, which ones, and on which split the verdict rests."""
    budget: str = ""
    tuning: str = "not applicable (no hyperparameters)"
    reason: str = ""
    """Why the verdict is UNTESTABLE, or what limits it."""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")


@dataclass(frozen=True)
class Context:
    """Where a claim runs: the device, the data root (for suites with datasets) and a progress callback."""

    device: torch.device
    data_root: Path
    progress: Callable[[str], None] | None = None


@dataclass(frozen=True)
class ClaimDef:
    paper: str
    claim_id: str
    statement: str
    source: str
    """Where the paper makes the statement: arXiv id and table / figure / section / lemma."""
    paper_value: str
    """The paper's own number(s) for the statement."""
    run: Callable[[str, Context], Outcome]
    """(scale, context) -> Outcome."""
    needs: frozenset[str] = field(default_factory=frozenset)
    """Optimizers whose behaviour the verdict depends on (a broken one should flip it)."""


def untestable(reason: str, numbers: Mapping[str, float] | None = None, **fields: Any) -> Outcome:
    return Outcome(UNTESTABLE, dict(numbers or {}), summary=reason, reason=reason, **fields)


def seeds_text(seeds: list[int], split: str) -> str:
    listed = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2 else seeds
    return f"{len(seeds)} (seeds {listed}), {split}"


def paired_numbers(prefix: str, paired: Paired) -> dict[str, float]:
    """The paired comparison's numbers that exist and are finite: the median difference, its interval (from 2
    pairs), the p-value (from MIN_SEEDS pairs) and the number of pairs."""
    d = paired.difference
    values = {
        f"{prefix}_median_diff": d.median,
        f"{prefix}_diff_lo": d.lo,
        f"{prefix}_diff_hi": d.hi,
        f"{prefix}_p": paired.p_value,
        f"{prefix}_n": float(len(paired.seeds)),
    }
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


def paired_text(paired: Paired) -> str:
    d = paired.difference
    interval = "" if d.lo is None else f" [{d.lo:.4g}, {d.hi:.4g}] ({'95% CI' if d.n >= MIN_SEEDS else 'min–max'})"
    p = "" if paired.p_value is None else f", Wilcoxon p={paired.p_value:.3g}"
    return f"median paired difference {d.median:.4g}{interval}{p}: {paired.verdict}"


def better(a: Mapping[int, float], b: Mapping[int, float], lower_is_better: bool) -> tuple[str, Paired]:
    """HOLDS when A is detectably better than B over paired seeds (stats.paired_difference), FAILS when the test
    finds no such difference or the opposite one, UNTESTABLE below MIN_SEEDS pairs."""
    paired = paired_difference(a, b, "lower", "higher")
    if len(paired.seeds) < MIN_SEEDS:
        return UNTESTABLE, paired
    wanted = "lower" if lower_is_better else "higher"
    return (HOLDS if paired.verdict == wanted else FAILS), paired


def within(a: Mapping[int, float], b: Mapping[int, float], margin: float, higher_is_better: bool) -> tuple[str, Paired]:
    """Non-inferiority: HOLDS when the 95% bootstrap interval of the paired difference A - B (oriented so that
    positive is better) lies above -margin; FAILS otherwise; UNTESTABLE below MIN_SEEDS pairs."""
    sign = 1.0 if higher_is_better else -1.0
    oriented_a = {seed: sign * value for seed, value in a.items()}
    oriented_b = {seed: sign * value for seed, value in b.items()}
    paired = paired_difference(oriented_a, oriented_b, "worse", "better")
    if len(paired.seeds) < MIN_SEEDS or paired.difference.lo is None:
        return UNTESTABLE, paired
    return (HOLDS if paired.difference.lo > -margin else FAILS), paired


def median_of(values: Mapping[int, float]) -> float:
    return median_ci(values.values()).median
