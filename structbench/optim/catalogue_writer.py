"""Write `structbench/optimizers.json`, the catalogue `structbench list optims` reads (structbench.catalogue), from the
registry: `python -m structbench.optim.catalogue_writer` after changing an optimizer's entry or declaration."""

from __future__ import annotations

from pathlib import Path

import structbench
from structbench import catalogue
from structbench.optim import registry

PATH = Path(structbench.__file__).with_name(catalogue.FILE)


def registry_text() -> str:
    """The catalogue's text as the registry would write it now: structbench's own optimizers, not plugins."""
    own = [registry.get(name) for name in registry.names() if registry.get(name).origin is None]
    return catalogue.text([catalogue.Listing.of(entry) for entry in own])


def main() -> None:
    PATH.write_text(registry_text(), encoding="utf-8")
    print(f"wrote {PATH}")


if __name__ == "__main__":
    main()
