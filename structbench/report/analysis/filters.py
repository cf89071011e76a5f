"""The report's filters (--suite, --optim, --baseline, --since), applied to the runs read.

A filter that matches nothing is a usage error (exit 2) that names what the stores hold and the closest name ("did
you mean 'fismo'?"), as `run` answers an unknown name, instead of an empty report that looks like a result: every
--suite name must have runs (a suite that includes others, such as `smoke`, in at least one of them), every --optim
name runs in the suites kept, a --baseline given on the command line runs
there too, and --since must leave a run. The default baseline may be absent (the report then says so).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping, Sequence

import pandas as pd

from structbench.errors import UsageError

SHOWN_NAMES = 12


def _unknown(kind: str, name: str, known: Sequence[str], where: str) -> UsageError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listed = ", ".join(known[:SHOWN_NAMES]) + (", ..." if len(known) > SHOWN_NAMES else "")
    return UsageError(f"no runs of {kind} {name!r} in {where}.{hint} Stored: {listed or 'none'}.")


def apply(
    runs: pd.DataFrame,
    where: str,
    suites: Mapping[str, Sequence[str]] | None = None,
    optims: Collection[str] = (),
    baseline: str | None = "adamw",
    baseline_given: bool = False,
    since: pd.Timestamp | None = None,
) -> pd.DataFrame:
    """The runs the filters keep (module docstring). `suites` maps each --suite name to the suite names it stands for
    (suite_files.expand). An --optim filter keeps the baseline's runs (when there is one: None keeps only the named
    optimizers); the baseline must have runs only when `baseline_given` (named on the command line)."""
    suite_names = sorted(set(runs["suite"].dropna()))
    for name, members in (suites or {}).items():
        if not set(members) & set(suite_names):
            raise _unknown("suite", name, suite_names, where)
    if suites:
        runs = runs[runs["suite"].isin([m for members in suites.values() for m in members])]
        where = f"{where} for suite(s) {', '.join(suites)}"
    optim_names = sorted(set(runs["optim"].dropna()) - {"-"})
    baselines = [baseline] if baseline is not None else []
    for name in [*optims, *(baselines if baseline_given else [])]:
        if name not in optim_names:
            raise _unknown("optimizer", name, optim_names, where)
    if optims:
        runs = runs[runs["optim"].isin([*optims, *baselines])]
    if since is not None:
        kept = runs[runs["started_at"] >= since]
        if kept.empty and not runs.empty:
            latest = pd.Timestamp(runs["started_at"].max()).strftime("%Y-%m-%d %H:%M:%S")
            raise UsageError(f"no runs in {where} started at or after {since.isoformat()} (the latest: {latest} UTC).")
        runs = kept
    return runs
