"""Across suites: AlgoPerf-style performance profiles and a rank table.

Coverage: an optimizer is judged only on the suites it ran. A suite it never ran says nothing about it (it was not
run there, which is not a failure), so neither ranks it last nor counts against its profile; its coverage (the
suites it ran, of those aggregated) is shown beside every aggregate.

Performance profile (Dahan et al. 2023, "Benchmarking Neural Network Training Algorithms", §4.1): over the
suites S that have a target, let S_o be those optimizer o ran, t(s, o) its median time to target on s in S_o
(+inf when it did not reach the target) and t*(s) = min of t(s, o) over the optimizers that ran s. The performance
ratio is r(s, o) = t(s, o) / t*(s) (+inf when t(s, o) or t*(s) is infinite; 1 when both are 0), and the profile is

    rho_o(tau) = |{s in S_o : r(s, o) <= tau}| / |S_o|,   for tau in [1, TAU_MAX] (TAU_MAX = 4).

The score is the normalised area under the profile, (1 / (TAU_MAX - 1)) * integral_1^TAU_MAX rho_o(tau) dtau,
which for a step function is exactly the mean over s in S_o of max(0, TAU_MAX - r(s, o)) / (TAU_MAX - 1): 1 for
an optimizer that is fastest everywhere it ran, 0 for one that never gets within TAU_MAX of the fastest.

Rank table: on each suite, the optimizers that ran it are ranked by their median final metric (lower is better for
a metric that is minimised, higher for one that is maximised); equal medians share the mean of the ranks they span
("average" ties), and those without an `ok` run there tie for the last places among them in the same way. An
optimizer that did not run a suite has no rank there. The table gives each optimizer's mean rank over the suites it
ran. A suite where no run ended ok is left out of both (build.Report.without_ok): with nothing to rank, its lone
optimizer would "tie for last" and rank first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TAU_MAX = 4.0
TAU_GRID = np.linspace(1.0, TAU_MAX, 301)
TAU_COLUMNS = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)


@dataclass(frozen=True)
class Profile:
    suites: tuple[str, ...]
    ratios: pd.DataFrame
    """Performance ratio r(s, o): rows suites, columns optimizers; NaN where o did not run s."""

    @property
    def coverage(self) -> pd.Series:
        """|S_o|: the suites each optimizer ran."""
        return self.ratios.notna().sum(axis=0)

    def rho(self, tau: float | np.ndarray) -> pd.DataFrame:
        """rho_o(tau) for each optimizer (columns) at each tau (rows), over the suites it ran."""
        taus = np.atleast_1d(np.asarray(tau, dtype=float))
        ratios = self.ratios.to_numpy()
        within = (ratios[None, :, :] <= taus[:, None, None]).sum(axis=1)
        ran = np.maximum(self.coverage.to_numpy(), 1)
        return pd.DataFrame(within / ran, index=taus, columns=self.ratios.columns)

    def score(self) -> pd.Series:
        """Normalised area under rho over [1, TAU_MAX] (module docstring); NaN for an optimizer that ran none."""
        area = (TAU_MAX - self.ratios).clip(lower=0.0).mean(axis=0, skipna=True) / (TAU_MAX - 1.0)
        return area


def performance_profile(times: Mapping[str, Mapping[str, float]], optims: Sequence[str]) -> Profile:
    """Profile from times[suite][optim] over the optimizers that ran each suite (module docstring): an optimizer
    missing from times[suite] did not run it; +inf is a run that did not reach the target."""
    suites = tuple(sorted(times))
    ratios = pd.DataFrame(math.nan, index=list(suites), columns=list(optims), dtype=float)
    for suite in suites:
        row = {o: float(t) for o, t in times[suite].items() if o in optims}
        best = min(row.values(), default=math.inf)
        for optim, t in row.items():
            if math.isinf(best) or math.isinf(t) or math.isnan(t):
                ratios.loc[suite, optim] = math.inf
            else:
                ratios.loc[suite, optim] = 1.0 if t == best else (t / best if best > 0 else math.inf)
    return Profile(suites, ratios)


@dataclass(frozen=True)
class Ranks:
    ranks: pd.DataFrame
    """rank(s, o): rows suites, columns optimizers; NaN where o did not run s."""
    ranked: pd.DataFrame
    """Whether o had an ok result on s (False where it ran without one, tied for last, or did not run)."""

    @property
    def ran(self) -> pd.DataFrame:
        return self.ranks.notna()

    @property
    def coverage(self) -> pd.Series:
        """The suites each optimizer ran."""
        return self.ran.sum(axis=0)

    @property
    def mean(self) -> pd.Series:
        """Mean rank over the suites each optimizer ran."""
        return self.ranks.mean(axis=0, skipna=True)


def rank_table(metrics: Mapping[str, Mapping[str, float]], modes: Mapping[str, str], optims: Sequence[str]) -> Ranks:
    """Ranks from metrics[suite][optim] (median final metric; NaN without an ok run; an optimizer missing from
    metrics[suite] did not run it) and each suite's mode (module docstring)."""
    suites = sorted(metrics)
    ranks = pd.DataFrame(math.nan, index=suites, columns=list(optims), dtype=float)
    ranked = pd.DataFrame(False, index=suites, columns=list(optims))
    for suite in suites:
        row = pd.Series({o: float(v) for o, v in metrics[suite].items() if o in optims}, dtype=float)
        have = row.dropna()
        ranks.loc[suite, have.index] = have.rank(method="average", ascending=modes[suite] != "max")
        ranked.loc[suite, have.index] = True
        missing = row.index[row.isna()]
        if len(missing):
            ranks.loc[suite, missing] = len(have) + (1 + len(missing)) / 2
    return Ranks(ranks, ranked)
