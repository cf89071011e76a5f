"""What `structbench list optims` prints about structbench's own optimizers, kept as data so that listing them does
not import torch (about 4 s on 2 cores): each optimizer's name, reference, summary, notes and hyperparameter table.

`optimizers.json` beside this module is written from the registry by `python -m structbench.optim.catalogue_writer`;
tests/optim/test_catalogue.py fails when it differs from what the registry would write now (an optimizer, a default
or a note changed without rewriting it). Plugins are not in it: listing them imports them, and torch with them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import metadata, resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from structbench.optim.registry import OptimizerEntry

FILE = "optimizers.json"
ENTRY_POINT_GROUP = "structbench.optimizers"
"""The entry-point group through which installed packages register optimizers (structbench.optim.plugins)."""


@dataclass(frozen=True)
class Listing:
    """One optimizer as `list optims` shows it; `hparams` holds (name, default, valid values, tuning, source) rows."""

    name: str
    reference: str
    summary: str
    notes: str
    hparams: tuple[tuple[str, str, str, str, str], ...]

    @classmethod
    def of(cls, entry: OptimizerEntry) -> Listing:
        return cls(entry.name, entry.reference, entry.summary, entry.notes, tuple(entry.hparams.rows()))

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Listing:
        return cls(**{**record, "hparams": tuple(tuple(row) for row in record["hparams"])})


def builtin() -> dict[str, Listing]:
    """structbench's own optimizers by name, as last written from the registry."""
    records = json.loads(resources.files("structbench").joinpath(FILE).read_text(encoding="utf-8"))
    return {record["name"]: Listing.from_record(record) for record in records}


def plugins_installed() -> bool:
    """Whether an installed package declares optimizers (then listing them needs the registry, and torch)."""
    return bool(metadata.entry_points(group=ENTRY_POINT_GROUP))


def text(entries: list[Listing]) -> str:
    """The catalogue file's text for `entries`."""
    return json.dumps([asdict(entry) for entry in entries], indent=1, ensure_ascii=False) + "\n"
