"""Runs grouped into variants: one optimizer under one effective configuration in one suite.

A suite's runs of one optimizer can differ in more than the seed — a learning-rate sweep, a `--set`
override of the budget or the target. Statistics over seeds only make sense within one configuration, so
the runs are grouped by their stored effective spec with the seed left out. A variant's label is the
optimizer's name plus the settings that tell it apart: the spec fields that differ between this
optimizer's variants in the suite, and any field outside the hyperparameters that differs between the
suite's variants at all (a different budget or target).

A report over several stores (`report --out A --out B`) keeps each store's runs apart: the runs carry their store's
label, and a variant is one optimizer in one store, named "adamw [A]" (its entry), so the same optimizer from two
machines or commits appears as two rows side by side.

When one seed of a variant ran more than once, one run counts: the latest run with a final status
(`store.FINAL_STATUSES`: ok, diverged, oom, solver_error, timeout) if the seed has one, else the latest run. So a
rerun that was interrupted or hit an error never hides an earlier result, and a seed with no result still shows
its failure. The seed's other runs are kept as "superseded" (listed, not used).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from structbench.report.views.anchors import anchor
from structbench.store.write import FINAL_STATUSES

IGNORED_SPEC_KEYS = frozenset({"seed", "source", "suite", "optim", "task", "hparams_source"})
IDENTITY_SPEC_KEYS = ("optim_plugin.",)
"""Spec fields that say where an optimizer's code came from (a plugin's kind, module, class, sha256): they set the
run key and sit in the runs appendix, never in a setting label across optimizers (the optimizer's name identifies
it). Within one optimizer they label its variants only when they differ (an edited plugin file)."""


class Columns:
    """A frame's columns as numpy arrays, read once: slicing arrays is far cheaper than slicing small frames."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, column: str) -> np.ndarray:
        if column not in self._arrays:
            series = self.frame[column]
            numeric = pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)
            self._arrays[column] = series.to_numpy(float, na_value=np.nan) if numeric else series.to_numpy(object)
        return self._arrays[column]


def entry_name(optim: str, store: str) -> str:
    """The optimizer as the report names it: "adamw", or "adamw [A]" in a report over several stores."""
    return f"{optim} [{store}]" if store else optim


def entries(runs: pd.DataFrame) -> list[str]:
    """In name order, the entry names of the optimizers that ran in some suite: those of the report's variants, known
    before any suite is built."""
    named = runs[runs["suite"].notna() & runs["optim"].notna()]
    stores = named["store"] if "store" in named.columns else pd.Series("", index=named.index)
    return sorted({entry_name(optim, store) for optim, store in zip(named["optim"], stores, strict=True)})


@dataclass(frozen=True, eq=False)
class Variant:
    suite: str
    optim: str
    """The entry name (entry_name): the optimizer, with its store in a report over several stores."""
    label: str
    config: Mapping[str, Any]
    latest: Columns
    rows: np.ndarray
    """Positions of this variant's runs that count (one per seed, in seed order: module docstring) in
    `latest.frame`."""
    older: Columns
    older_rows: np.ndarray
    optim_name: str = ""
    """The registry name of the optimizer."""
    store: str = ""
    """The store's label in a report over several stores, else ""."""

    def values(self, column: str) -> np.ndarray:
        """One column over the runs that count (numbers as floats with NaN for missing)."""
        return self.latest[column][self.rows]

    @property
    def run_ids(self) -> list[str]:
        return self.values("run_id").tolist()

    def spec_text(self) -> str:
        """The stored effective spec of the variant's first run, pretty-printed (its runs differ only in seed)."""
        try:
            return json.dumps(json.loads(self.values("spec")[0]), indent=1, sort_keys=True)
        except (TypeError, ValueError, IndexError):
            return "-"

    def runs_text(self) -> str:
        n = len(self.rows) + len(self.older_rows)
        return f"{n} run" if n == 1 else f"{n} runs"

    @property
    def anchor(self) -> str:
        return anchor("runs", f"{self.suite}-{self.label}")


def flatten(spec: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested spec -> {"budget.steps": 300, ...}; lists become JSON text."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):  # what JSON objects read as (a plain type check: far cheaper than Mapping's)
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, list) else value
    return flat


def config_of(spec_json: str | None) -> dict[str, Any]:
    """The run's effective configuration: its flattened spec without seed and naming fields."""
    try:
        spec = json.loads(spec_json) if spec_json else {}
    except json.JSONDecodeError:
        spec = {}
    return {k: v for k, v in flatten(spec).items() if k.split(".")[0] not in IGNORED_SPEC_KEYS}


def varying_keys(configs: list[Mapping[str, Any]], keys: set[str]) -> set[str]:
    return {k for k in keys if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1}


def _short(key: str) -> str:
    return key.removeprefix("hparams.")


def _value_text(value: Any) -> str:
    if value is None:
        return "null"
    return f"{value:g}" if isinstance(value, float) else str(value)


def sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers in numeric order before anything else in text order."""
    if isinstance(value, bool) or value is None:
        return (1, math.inf, str(value))
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (1, math.inf, str(value))


def _label(optim: str, config: Mapping[str, Any], keys: list[str]) -> str:
    """The entry name and the settings that tell the variant apart; a key its configuration lacks is left out, never
    shown as `None`."""
    settings = ", ".join(f"{_short(k)}={_value_text(config[k])}" for k in keys if k in config)
    return f"{optim} {settings}" if settings else optim


def suite_wide_keys(configs: list[Mapping[str, Any]]) -> set[str]:
    """The fields outside the hyperparameters and the code's identity that differ between a suite's variants."""
    varying = varying_keys(configs, {k for c in configs for k in c})
    return {k for k in varying if not k.startswith(("hparams.", *IDENTITY_SPEC_KEYS))}


def group_variants(runs: pd.DataFrame) -> list[Variant]:
    """One suite's runs as variants, in optimizer (and store) order and then by the settings that tell them apart."""
    if "store" not in runs.columns:
        runs = runs.assign(store="")
    keys = [json.dumps(config_of(spec), sort_keys=True, default=str) for spec in runs["spec"]]
    config_of_key = {key: json.loads(key) for key in set(keys)}
    final = runs["status"].isin(list(FINAL_STATUSES)).to_numpy(bool)
    # Within a seed, the run that sorts last counts: runs with a final status sort after the others, then by time.
    ordered = runs.assign(_config=keys, _final=final).sort_values(["_final", "started_at", "run_id"], kind="stable")
    counts = ~ordered.duplicated(["optim", "store", "_config", "seed"], keep="last").to_numpy()
    ordered = ordered.drop(columns="_final")
    latest = ordered[counts].sort_values(["optim", "store", "_config", "seed"], kind="stable").reset_index(drop=True)
    older = ordered[~counts].sort_values(["started_at", "run_id"], kind="stable").reset_index(drop=True)
    rows_of = latest.groupby(["optim", "store", "_config"], sort=False).indices
    older_rows_of = older.groupby(["optim", "store", "_config"], sort=False).indices if len(older) else {}
    latest_columns = Columns(latest.drop(columns="_config"))
    older_columns = Columns(older.drop(columns="_config"))
    all_configs = list(config_of_key.values())
    suite_wide = suite_wide_keys(all_configs)
    suite = str(runs["suite"].iloc[0])
    variants: list[Variant] = []
    for optim, store in sorted({(optim, store) for optim, store, _ in rows_of}):
        mine = [key for o, s, key in rows_of if (o, s) == (optim, store)]
        own = [config_of_key[key] for key in mine]
        label_keys = sorted(varying_keys(own, {k for c in own for k in c}) | suite_wide)
        mine.sort(key=lambda k: [sort_key(config_of_key[k].get(name)) for name in label_keys])
        entry = entry_name(optim, store)
        for key in mine:
            variants.append(
                Variant(
                    suite=suite,
                    optim=entry,
                    label=_label(entry, config_of_key[key], label_keys),
                    config=config_of_key[key],
                    latest=latest_columns,
                    rows=rows_of[(optim, store, key)],
                    older=older_columns,
                    older_rows=older_rows_of.get((optim, store, key), np.array([], dtype=int)),
                    optim_name=optim,
                    store=store,
                )
            )
    return variants
