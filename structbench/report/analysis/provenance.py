"""Where a setting's hyperparameters come from, as its rows say it.

A run stores `hparams_source` in its spec (spec.HPARAMS_SOURCES): "suite" (the suite sets the optimizer's `lr` or
marks it tuned: tuned for it, or the paper's values it chose), "command line" (`--set hparams.<optim>.*`), "sweep"
(one of several settings, the report selecting one on validation) or "registry defaults" (an optimizer the suite
does not tune, run at the registry's defaults: untuned here, so its numbers say little about the optimizer).

A run that stores "suite", or that was stored before that field existed, is checked against its suite file
(suite_files.tuned_optimizers: the one it ran from where it still is, else the built-in suite of its name): the
suite's own when the suite tunes the optimizer, registry defaults when it only lists it (stores written before that
rule said "suite's" for those), unknown when no suite file can be read.
"""

from __future__ import annotations

import json

from structbench.report import suite_files
from structbench.report.analysis.variants import Variant

WORDS = {
    "suite": "suite's",
    "command line": "set on the command line",
    "sweep": "selected from a sweep",
    "registry defaults": "untuned here (registry defaults)",
}
UNKNOWN = "unknown"


def _first_spec(variant: Variant) -> dict:
    """The first of the variant's stored specs that reads as a JSON object, else {}."""
    for text in variant.values("spec"):
        try:
            spec = json.loads(text) if isinstance(text, str) else {}
        except json.JSONDecodeError:
            continue
        if isinstance(spec, dict):
            return spec
    return {}


def source_of(variant: Variant) -> str:
    """The HPARAMS_SOURCES entry of the variant's runs, or UNKNOWN. A stored "suite" (or none) is checked against
    the suite file: an optimizer the suite lists but does not tune is at the registry's defaults (module
    docstring)."""
    spec = _first_spec(variant)
    stored = spec.get("hparams_source") if isinstance(spec.get("hparams_source"), str) else None
    if stored not in (None, "suite"):
        return stored
    tuned = suite_files.tuned_optimizers(variant.suite, spec.get("source"))
    if tuned is None:
        return stored or UNKNOWN
    return "suite" if variant.optim_name in tuned else "registry defaults"


def untuned(source: str) -> bool:
    return source == "registry defaults"


def words(source: str, settings: int) -> str:
    """The row's "hyperparameters" cell: the source in words; a sweep says how many settings it chose from."""
    if settings > 1 or source == "sweep":
        return f"selected from {settings} settings" if settings > 1 else WORDS["sweep"]
    return WORDS.get(source, UNKNOWN)
