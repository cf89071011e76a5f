"""Where a setting's hyperparameters come from, as its rows say it.

A run stores `hparams_source` in its spec (spec.HPARAMS_SOURCES): "suite" (the suite names the optimizer: tuned for
it, or the paper's values it chose), "command line" (`--set hparams.<optim>.*`), "sweep" (one of several settings,
the report selecting one on validation) or "registry defaults" (an optimizer the suite does not name, run at the
registry's defaults: untuned here, so its numbers say little about the optimizer). Runs stored before that field
existed are placed by the built-in suite file (suite_files.named_optimizers): the suite's own when it names the
optimizer, registry defaults when it does not, unknown for a suite that is not built in.
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


def source_of(variant: Variant) -> str:
    """The HPARAMS_SOURCES entry of the variant's runs (the first run's), or UNKNOWN."""
    for text in variant.values("spec"):
        try:
            spec = json.loads(text) if isinstance(text, str) else {}
        except json.JSONDecodeError:
            spec = {}
        if isinstance(spec, dict) and isinstance(spec.get("hparams_source"), str):
            return spec["hparams_source"]
    named = suite_files.named_optimizers(variant.suite)
    if named is None:
        return UNKNOWN
    return "suite" if variant.optim_name in named else "registry defaults"


def untuned(source: str) -> bool:
    return source == "registry defaults"


def words(source: str, settings: int) -> str:
    """The row's "hyperparameters" cell: the source in words; a sweep says how many settings it chose from."""
    if settings > 1 or source == "sweep":
        return f"selected from {settings} settings" if settings > 1 else WORDS["sweep"]
    return WORDS.get(source, UNKNOWN)
