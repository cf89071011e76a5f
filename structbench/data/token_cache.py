"""Tokenized corpora on disk: tokenize once, then memory-map (issue #8).

:func:`prepare_tokens` reads a corpus, splits it (:func:`~structbench.data.text.split_corpus`),
builds the tokenizer and returns the train, validation and test token streams as read-only memmaps
of ``.npy`` files. Each split's stream is its documents' tokens, in corpus order, with the tokens of
:data:`~structbench.data.text.DOCUMENT_SEPARATOR` between consecutive documents (every document
is encoded on its own, so no token spans two documents).

Cache layout, under ``cache_dir`` (default ``<data root>/cache``)::

    tokens/<key>/train.npy, val.npy, test.npy, meta.json
                                                 key: corpus content hash + split + tokenizer fingerprint
    tokenizers/bpe-<vocab>-<key>.json             trained BPE models

An entry is built in a hidden temporary directory and renamed into place, so a crash never
leaves a half entry. On load, ``meta.json`` must match the key's inputs and each array its
recorded dtype, length, byte size and sha256; anything else is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from structbench.data.text import CORPUS_OPTIONS, DOCUMENT_SEPARATOR, load_corpus, split_corpus
from structbench.data.tokenizers import Tokenizer, build_tokenizer, token_dtype
from structbench.errors import UsageError

CACHE_FORMAT = 2
"""Version of the entry layout and stream definition; part of every key."""
SPLITS = ("train", "val", "test")
PROGRESS_MIN_CHARS = 1_000_000
"""Corpora at least this long show a progress bar while tokenizing (only on a terminal)."""


@dataclass(frozen=True)
class TokenData:
    """Token streams of one corpus + tokenizer.

    ``train``, ``val`` and ``test`` are read-only 1-D memmaps (uint16 when ``vocab_size <= 65535``, else
    uint32); ``source`` is a one-line description; ``record`` holds what a run should store (see
    :func:`prepare_tokens`); ``cache_path`` is the entry's directory.
    """

    train: np.memmap
    val: np.memmap
    test: np.memmap
    vocab_size: int
    tokenizer: Tokenizer
    source: str
    record: dict[str, object]
    cache_path: Path


def prepare_tokens(
    corpus: str,
    tokenizer: str,
    data_root: Path,
    *,
    val_fraction: float = 0.1,
    split_seed: int = 0,
    corpus_options: dict | None = None,
    tokenizer_options: dict | None = None,
    cache_dir: Path | None = None,
) -> TokenData:
    """Tokenize ``corpus`` with ``tokenizer`` (or load the cached result) and split it.

    ``corpus_options`` go to :func:`~structbench.data.text.load_corpus` (``text_field``,
    ``glob``, ``encoding``, ``hf_split``, ``hf_config``), ``tokenizer_options`` to
    :func:`~structbench.data.tokenizers.build_tokenizer`. The char and bpe vocabularies are
    learnt from the train documents plus the separator. ``record`` holds the corpus (name, kind,
    path, content sha256, documents, characters), the split (unit, seed, fraction, held-out
    documents), the tokenizer (name, fingerprint, vocab size, options, details), the dtype, and
    per split the token count and the sha256 of the token array.
    """
    corpus_options = dict(corpus_options or {})
    tokenizer_options = dict(tokenizer_options or {})
    unknown = sorted(set(corpus_options) - CORPUS_OPTIONS)
    if unknown:
        raise UsageError(f"corpus takes no option {', '.join(unknown)} (accepted: {', '.join(sorted(CORPUS_OPTIONS))})")
    text = load_corpus(corpus, data_root, **corpus_options)
    split = split_corpus(text, val_fraction, split_seed)
    cache_root = cache_dir if cache_dir is not None else data_root / "cache"
    tok = build_tokenizer(tokenizer, (*split.train, DOCUMENT_SEPARATOR), data_root, cache_root, **tokenizer_options)
    dtype = token_dtype(tok.vocab_size)
    key_fields: dict[str, object] = {
        "format": CACHE_FORMAT,
        "corpus_sha256": text.sha256,
        "split": split.record,
        "tokenizer": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "separator": DOCUMENT_SEPARATOR,
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode("utf-8")).hexdigest()[:32]
    entry = cache_root / "tokens" / key
    arrays = _load_entry(entry, key_fields)
    if arrays is None:
        _build_entry(entry, key_fields, {"train": split.train, "val": split.val, "test": split.test}, tok, dtype)
        arrays = _load_entry(entry, key_fields)
        if arrays is None:
            raise UsageError(f"the token cache entry {entry} was written but does not read back; delete it and rerun")
    (train, train_sha), (val, val_sha), (test, test_sha) = (arrays[split] for split in SPLITS)
    record: dict[str, object] = {
        "corpus": text.name,
        "corpus_kind": text.kind,
        "path": text.where,
        "sha256": text.sha256,
        "documents": len(text.documents),
        "characters": text.characters,
        "split": split.record,
        "tokenizer": {
            "name": tok.name,
            "fingerprint": tok.fingerprint,
            "vocab_size": tok.vocab_size,
            "options": tokenizer_options,
            "details": tok.details,
        },
        "dtype": dtype.name,
        "separator": DOCUMENT_SEPARATOR,
        "tokens": {"train": int(train.shape[0]), "val": int(val.shape[0]), "test": int(test.shape[0])},
        "tokens_sha256": {"train": train_sha, "val": val_sha, "test": test_sha},
        "cache_key": key,
    }
    source = f"{text.name} ({text.kind}: {text.where}), {tok.name} tokenizer ({tok.vocab_size} ids)"
    return TokenData(train, val, test, tok.vocab_size, tok, source, record, entry)


def _array_sha256(array: np.ndarray) -> str:
    digest = hashlib.sha256()
    step = 1 << 24
    for start in range(0, array.shape[0], step):
        digest.update(np.ascontiguousarray(array[start : start + step]).tobytes())
    return digest.hexdigest()


def _load_entry(entry: Path, key_fields: dict[str, object]) -> dict[str, tuple[np.memmap, str]] | None:
    """The entry's (memmap, sha256) per split, or None if it is absent, stale or damaged in any way."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        if meta.get("key_fields") != json.loads(json.dumps(key_fields)):
            return None
        arrays = {}
        for split in SPLITS:
            facts = meta["arrays"][split]
            path = entry / f"{split}.npy"
            if path.stat().st_size != facts["bytes"]:
                return None
            array = np.load(path, mmap_mode="r")
            if array.dtype.name != key_fields["dtype"] or array.shape != (facts["tokens"],):
                return None
            if _array_sha256(array) != facts["sha256"]:
                return None
            arrays[split] = (array, facts["sha256"])
        return arrays
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


@contextlib.contextmanager
def _progress(total_chars: int) -> Iterator[Progress]:
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("tokenizing"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal or total_chars < PROGRESS_MIN_CHARS,
    )
    with progress:
        yield progress


def _encode_split(
    texts: Sequence[str], tok: Tokenizer, dtype: np.dtype, advance: Callable[[int], None]
) -> list[np.ndarray]:
    separator = tok.encode(DOCUMENT_SEPARATOR).astype(dtype)
    pieces: list[np.ndarray] = []
    for index, document in enumerate(texts):
        if index:
            pieces.append(separator)
        pieces.append(tok.encode(document).astype(dtype))
        advance(len(document))
    return pieces


def _build_entry(
    entry: Path,
    key_fields: dict[str, object],
    texts: dict[str, Sequence[str]],
    tok: Tokenizer,
    dtype: np.dtype,
) -> None:
    """Tokenize every split into a temporary directory, then rename it to ``entry``."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}.", suffix=".tmp"))
    except OSError as error:
        raise UsageError(f"cannot write the token cache under {entry.parent}: {error}") from None
    try:
        arrays_meta = {}
        total = sum(len(t) for split_texts in texts.values() for t in split_texts)
        with _progress(total) as progress:
            task = progress.add_task("tokenizing", total=total)
            for split in SPLITS:
                pieces = _encode_split(texts[split], tok, dtype, lambda n: progress.advance(task, n))
                path = staging / f"{split}.npy"
                length = sum(p.shape[0] for p in pieces)
                out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(length,))
                offset = 0
                pieces.reverse()
                while pieces:
                    piece = pieces.pop()
                    out[offset : offset + piece.shape[0]] = piece
                    offset += piece.shape[0]
                out.flush()
                digest = _array_sha256(out)
                del out
                arrays_meta[split] = {"tokens": length, "bytes": path.stat().st_size, "sha256": digest}
        meta = {"key_fields": key_fields, "arrays": arrays_meta}
        (staging / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
        if entry.exists():
            if _load_entry(entry, key_fields) is not None:
                return
            shutil.rmtree(entry)
        try:
            os.rename(staging, entry)
        except OSError:
            if _load_entry(entry, key_fields) is None:
                raise
    except OSError as error:
        raise UsageError(f"cannot write the token cache entry {entry}: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
