"""Across suites: AlgoPerf-style performance profiles and a rank table.

Performance profile (Dahan et al. 2023, "Benchmarking Neural Network Training Algorithms", §4.1): over the
suites S that have a target, let t(s, o) be optimizer o's median time to target on suite s (+inf when it
did not reach the target or did not run there) and t*(s) = min over o of t(s, o). The performance ratio is
r(s, o) = t(s, o) / t*(s) (+inf when t(s, o) or t*(s) is infinite; 1 when both are 0), and the profile is

    rho_o(tau) = |{s in S : r(s, o) <= tau}| / |S|,   for tau in [1, TAU_MAX] (TAU_MAX = 4).

The score is the normalised area under the profile, (1 / (TAU_MAX - 1)) * integral_1^TAU_MAX rho_o(tau) dtau,
which for a step function is exactly mean over s of max(0, TAU_MAX - r(s, o)) / (TAU_MAX - 1): 1 for an
optimizer that is fastest everywhere, 0 for one that never gets within TAU_MAX of the fastest.

Rank table: on each suite, optimizers are ranked by their median final eval metric (lower is better for a
metric that is minimised, higher for one that is maximised); equal medians share the mean of the ranks
they span ("average" ties), and optimizers without an `ok` run on the suite (or that did not run there) tie
for the last places in the same way. The table gives each optimizer's mean rank over suites.
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
    """Performance ratio r(s, o): rows suites, columns optimizers."""

    def rho(self, tau: float | np.ndarray) -> pd.DataFrame:
        """rho_o(tau) for each optimizer (columns) at each tau (rows)."""
        taus = np.atleast_1d(np.asarray(tau, dtype=float))
        fractions = (self.ratios.to_numpy()[None, :, :] <= taus[:, None, None]).mean(axis=1)
        return pd.DataFrame(fractions, index=taus, columns=self.ratios.columns)

    def score(self) -> pd.Series:
        """Normalised area under rho over [1, TAU_MAX] (module docstring)."""
        area = np.clip(TAU_MAX - self.ratios.to_numpy(), 0.0, None).mean(axis=0) / (TAU_MAX - 1.0)
        return pd.Series(area, index=self.ratios.columns)


def performance_profile(times: Mapping[str, Mapping[str, float]], optims: Sequence[str]) -> Profile:
    """Profile from times[suite][optim] (missing optimizers count as not reached)."""
    suites = tuple(sorted(times))
    ratios = pd.DataFrame(math.inf, index=list(suites), columns=list(optims), dtype=float)
    for suite in suites:
        row = {o: float(times[suite].get(o, math.inf)) for o in optims}
        best = min(row.values(), default=math.inf)
        for optim, t in row.items():
            if math.isinf(best) or math.isinf(t):
                continue
            ratios.loc[suite, optim] = 1.0 if t == best else (t / best if best > 0 else math.inf)
    return Profile(suites, ratios)


@dataclass(frozen=True)
class Ranks:
    ranks: pd.DataFrame
    """rank(s, o): rows suites, columns optimizers."""
    ranked: pd.DataFrame
    """Whether o had a value on s (False: tied for last)."""

    @property
    def mean(self) -> pd.Series:
        return self.ranks.mean(axis=0)


def rank_table(metrics: Mapping[str, Mapping[str, float]], modes: Mapping[str, str], optims: Sequence[str]) -> Ranks:
    """Ranks from metrics[suite][optim] (median final metric) and each suite's mode (module docstring)."""
    suites = sorted(metrics)
    values = pd.DataFrame(
        [[metrics[s].get(o, math.nan) for o in optims] for s in suites], index=suites, columns=list(optims), dtype=float
    )
    ranked = values.notna()
    ranks = pd.DataFrame(index=suites, columns=list(optims), dtype=float)
    for suite in suites:
        row = values.loc[suite]
        have = row.dropna()
        ranks.loc[suite, have.index] = have.rank(method="average", ascending=modes[suite] != "max")
        missing = row.index[row.isna()]
        if len(missing):
            ranks.loc[suite, missing] = (len(have) + 1 + len(optims)) / 2
    return Ranks(ranks, ranked)
