"""Drawn figures kept beside the store, so a suite whose data did not change is not drawn again.

    <out>/.report-cache/figures/<suite>-<key>/manifest.json + one PNG per figure

The key is a SHA-256 over everything a suite's figures depend on: the suite's data digest (every run row
and curve point it reads, build.digest), the looks (colour, line style, fill) assigned to its optimizers, the source
of every module of the report package (plotting, targets, profiles, statistics: a change to any of them may change
a figure) and the matplotlib version. The cross-suite figures are kept the same way under the name ACROSS, with
the digest of every suite's digest. Entries hold plain JSON and PNG bytes, nothing executable. Only the
newest `KEEP` entries of a name are kept. As with the read cache, an unreadable entry is ignored and an
unwritable directory only means nothing is kept. Reading an entry loads neither the plotting module nor
matplotlib's drawing machinery.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

from structbench.report.cache_dir import CACHE_DIR
from structbench.report.figures.figure_file import FigureFile, Look
from structbench.store.atomic import replacing

KEEP = 3
ACROSS = "across suites"
"""The name the cross-suite figures are kept under (a suite of that name shares only the KEEP budget: keys differ)."""


def source_digest(package: Path) -> str:
    """SHA-256 over the paths (relative to `package`) and sources of the modules in `package` and its
    subpackages, in path order."""
    digest = hashlib.sha256()
    for module in sorted(package.rglob("*.py")):
        digest.update(module.relative_to(package).as_posix().encode())
        digest.update(module.read_bytes())
    return digest.hexdigest()


_CODE = source_digest(Path(__file__).parent.parent)
"""The whole report package: figures depend on its analysis (targets, profiles, statistics) as well as on plots."""


def _root(out: Path) -> Path:
    return out / CACHE_DIR / "figures"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def key(name: str, digest: str, looks: Mapping[str, Look]) -> str:
    """The entry key of figures called `name` drawn from data with `digest` in `looks`, the looks of the optimizers
    drawn."""
    mine = {o: list(looks[o]) for o in sorted(looks)}
    text = json.dumps([name, digest, mine, _CODE, matplotlib.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _entry(out: Path, name: str, digest: str, looks: Mapping[str, Look]) -> Path:
    return _root(out) / f"{_slug(name)}-{key(name, digest, looks)}"


def load(out: Path, name: str, digest: str, looks: Mapping[str, Look]) -> list[FigureFile] | None:
    """The kept figures of `name` for this digest and these colours, or None."""
    entry = _entry(out, name, digest, looks)
    try:
        manifest = json.loads((entry / "manifest.json").read_text(encoding="utf-8"))
        return [
            FigureFile(
                name=m["name"],
                title=m["title"],
                caption=m["caption"],
                png=(entry / f"{m['name']}.png").read_bytes(),
                run_ids=tuple(m["run_ids"]),
                suite=m["suite"],
                width=int(m["width"]),
                height=int(m["height"]),
            )
            for m in manifest
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(out: Path, name: str, digest: str, looks: Mapping[str, Look], figures: Sequence[FigureFile]) -> None:
    """Keep the figures as a new entry: a directory written under a temporary name and renamed into place
    (atomic.replacing), so a reader finds a whole entry or none."""
    root = _root(out)
    entry = _entry(out, name, digest, looks)
    fields = ("name", "title", "caption", "run_ids", "suite", "width", "height")
    manifest = [{k: getattr(f, k) for k in fields} for f in figures]
    try:
        root.mkdir(parents=True, exist_ok=True)
        with replacing(entry) as tmp:
            tmp.mkdir()
            for figure in figures:
                (tmp / f"{figure.name}.png").write_bytes(figure.png)
            (tmp / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
            shutil.rmtree(entry, ignore_errors=True)
        _prune(root, _slug(name))
    except OSError:
        return


def _prune(root: Path, slug: str) -> None:
    """Keep the newest KEEP entries of the name."""
    entries = [p for p in root.glob(f"{slug}-*") if p.is_dir() and len(p.name) == len(slug) + 33]
    entries.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
