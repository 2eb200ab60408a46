"""A run-time-joined model's vocabulary in Python tables (tokenization/vocabulary_table.py):
the tokenizer around them decodes, looks ids and tokens up and counts its vocabulary as
the file's own does, for every id, special and partial UTF-8 included, and the serving
process builds no model of the vocabulary and no tiktoken table for it; a vocabulary whose
decode is not its ids' bytes gets no tables."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers
from tokenizers.decoders import DecodeStream

from gateway.tokenization import IncrementalDetokenizer, Tokenizer, backend_parts, vocabulary_table
from gateway.tokenization.backend_parts import BackendParts, split_backend
from gateway.tokenization.fast_bpe import byte_decoder
from gateway.tokenization.vocabulary_table import table_backend, table_of, unreached_pieces

from .helpers import PROPERTY, copy_tokenizer, multilingual_text, small_byte_level_tokenizer

TEXTS = ["Hello, world! It's 12:45.", "L'été à Zürich, 東京 and слово 😀", "<|im_start|>user\nhi<|im_end|>\n<think>", "  \n\t x"]


class _Elsewhere:
    """A stand-in for the helper process: the whole tokenizer's ids, every call kept."""

    def __init__(self, full: Tokenizer) -> None:
        self.full, self.calls = full, []  # type: ignore[var-annotated]

    def __call__(self, texts: Sequence[str], add_special_tokens: bool, plain: bool) -> list[list[int]]:
        self.calls.append((list(texts), add_special_tokens, plain))
        if plain:
            return [self.full.special_text.plain().encode(t, add_special_tokens=False).ids for t in texts]
        return [self.full.encode(t, add_special_tokens=add_special_tokens) for t in texts]


@pytest.fixture(scope="module")
def joined(qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Tokenizer, _Elsewhere]:
    """Qwen3 with BOS added by its config, as a model joining with a helper gets it (tables,
    every encode elsewhere), the files parsed whole, and the stand-in helper."""
    folder = copy_tokenizer(qwen_dir, tmp_path_factory.mktemp("tables"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(add_bos_token=True, bos_token="<|endoftext|>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    full = Tokenizer.from_path(folder)
    split = split_backend((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert split is not None
    tok = Tokenizer.from_path(folder, parse=lambda _: table_backend(split[0]))  # type: ignore[arg-type,return-value]
    other = _Elsewhere(full)
    backend_parts.encode_elsewhere(tok.backend, other)
    return tok, full, other


def test_the_tables_answer_as_the_whole_tokenizer(joined: tuple[Tokenizer, Tokenizer, _Elsewhere]) -> None:
    tok, full, _ = joined
    assert tok.vocabulary_in_tables and not full.vocabulary_in_tables
    assert json.loads(tok.backend.model.__getstate__())["vocab"].__len__() < 1000  # no model of the vocabulary here
    assert tok.vocab_size == full.vocab_size
    assert tok.added_tokens == full.added_tokens and tok.special_token_ids == full.special_token_ids
    assert (tok.bos_token_id, tok.eos_token_ids) == (full.bos_token_id, full.eos_token_ids)
    assert tok.backend.post_processor.__getstate__() == full.backend.post_processor.__getstate__()
    ids = range(full.vocab_size + 3)
    assert [tok.id_to_piece(i) for i in ids] == [full.id_to_piece(i) for i in ids]
    for piece in [full.id_to_piece(i) for i in range(0, full.vocab_size, 37)] + ["nope", "<|im_end|>"]:
        assert tok._token_to_id(piece) == full.backend.token_to_id(piece)  # type: ignore[arg-type]


def test_random_ids_decode_as_the_whole_tokenizer(joined: tuple[Tokenizer, Tokenizer, _Elsewhere]) -> None:
    """Specials kept and skipped, unknown ids, single bytes cutting characters, long lists."""
    tok, full, _ = joined
    rnd = random.Random(11)
    specials = sorted(full.added_tokens)
    for _ in range(1500):
        ids = [rnd.choice(specials) if rnd.random() < 0.1 else rnd.randrange(256) if rnd.random() < 0.3
               else rnd.randrange(full.vocab_size + 2) for _ in range(rnd.randint(1, 40))]  # fmt: skip
        for skip in (True, False):
            assert tok.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    long = [rnd.randrange(full.vocab_size) for _ in range(5000)]  # past the ids decoded holding the GIL
    assert tok.decode(long) == full.decode(long)
    for text in TEXTS:
        real = full.encode(text, add_special_tokens=False)
        assert tok.decode(real, skip_special_tokens=False) == text


@PROPERTY
@given(text=multilingual_text(), cut=st.integers(0, 3))
def test_a_stream_of_a_joined_model_is_the_whole_tokenizers(
    joined: tuple[Tokenizer, Tokenizer, _Elsewhere], text: str, cut: int
) -> None:
    """Each step's text equals DecodeStream's over the whole tokenizer, and the joined text
    its decode: real ids, with a few cut off the front (a stream that starts inside a character)."""
    tok, full, _ = joined
    ids = full.encode(text, add_special_tokens=False)[cut:]
    for skip in (True, False):
        stream = DecodeStream(skip_special_tokens=skip)
        expected = [stream.step(full.backend, i) or "" for i in ids]
        mine = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        assert [mine.step([i]) for i in ids] == expected
        assert "".join(expected) + mine.flush() == full.decode(ids, skip_special_tokens=skip)


def test_every_encode_goes_to_the_helper_and_nothing_is_built_here(joined: tuple[Tokenizer, Tokenizer, _Elsewhere]) -> None:
    tok, full, other = joined
    other.calls.clear()
    assert tok.fast_bpe is None and tok.merges_elsewhere
    for text in TEXTS:
        assert tok.encodes_elsewhere(text)
        for special in (False, True):
            assert tok.encode(text, add_special_tokens=special) == full.encode(text, add_special_tokens=special)
    assert len(other.calls) == 2 * len(TEXTS)
    assert tok.encode_batch(TEXTS, add_special_tokens=False) == full.encode_batch(TEXTS, add_special_tokens=False)
    assert tok.special_text.plain_ids(["<|im_end|>"]) == full.special_text.plain_ids(["<|im_end|>"])
    for tag in ["<think>", "</think>", "<|im_end|>", "hello", " world", "東京", "東京 x", "◁think▷", "nope nope"]:
        assert tok.token_id(tag) == full.token_id(tag), tag
    tok.build_merges()  # serve's start-up build leaves it to the other process
    assert tok.install_encoders(None, None) is None
    assert tok.backend not in backend_parts._WHOLE


def test_without_the_helper_the_whole_tokenizer_is_built_here_from_the_same_parts(qwen_dir: Path) -> None:
    full = Tokenizer.from_path(qwen_dir)
    split = split_backend((qwen_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert split is not None
    tok = Tokenizer.from_path(qwen_dir, parse=lambda _: table_backend(split[0]))  # type: ignore[arg-type,return-value]
    assert not tok.merges_elsewhere
    tok.build_merges()  # what the catalog does when the helper could not hold it
    assert tok.backend in backend_parts._WHOLE
    assert tok.encode("東京 and words", add_special_tokens=False) == full.encode("東京 and words", add_special_tokens=False)
    assert tok.decode(full.encode("東京", add_special_tokens=False)) == "東京"


def test_the_tables_are_built_in_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vocabulary_table, "_STEP_CHARS", 5)  # 258 pieces: many steps, a short last one
    small = BackendTokenizer.from_file(str(small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json"))
    small.decoder = decoders.ByteLevel()
    text = small.to_str()
    split = split_backend(text)
    assert split is not None
    steps: list[int] = []
    backend = table_backend(split[0], after_step=lambda: steps.append(1))
    whole = BackendTokenizer.from_str(text)
    assert backend is not None and len(steps) > 20
    table = table_of(backend)
    assert table is not None and table.size == whole.get_vocab_size(with_added_tokens=True)
    assert [table.id_to_token(i) for i in range(258)] == [whole.id_to_token(i) for i in range(258)]
    assert table.token_to_id("abc") == 257 and table.token_to_id("x y") is None


def _byte_fallback_tokenizer(folder: Path) -> Path:
    """A sentencepiece-style tokenizer (▁ pieces, byte fallback, a decoder chain)."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}, "▁a": 257, "b": 258}
    tok = BackendTokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_a_vocabulary_whose_decode_is_not_its_bytes_gets_no_tables(tmp_path: Path) -> None:
    folder = _byte_fallback_tokenizer(tmp_path / "sp")
    split = split_backend((folder / "tokenizer.json").read_text())
    assert split is not None
    assert table_backend(split[0]) is None
    data = json.loads((small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json").read_text())
    data["decoder"] = None  # no decoder: HF joins the pieces with spaces
    split = split_backend(json.dumps(data))
    assert split is not None
    assert table_backend(split[0]) is None


def test_an_added_token_that_would_decode_otherwise_gets_no_tables(tmp_path: Path) -> None:
    """An added token spelled in the byte alphabet decodes through it, not as its content."""
    tok = BackendTokenizer.from_file(str(small_byte_level_tokenizer(tmp_path / "small") / "tokenizer.json"))
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(["Ġx"])
    split = split_backend(tok.to_str())
    assert split is not None
    assert table_backend(split[0]) is None


def _parts(tok: BackendTokenizer) -> BackendParts:
    split = split_backend(tok.to_str())
    assert split is not None
    return split[0]


def test_the_wide_probe_vocabulary_decodes_as_its_file(tmp_path: Path) -> None:
    """A vocabulary of pieces the byte alphabet spells, plus an EOS, with no merges to reach them."""
    alphabet = byte_decoder()
    vocab = {c: i for i, c in enumerate(sorted(alphabet, key=alphabet.__getitem__))}
    for word in ["ab", "abc", "ĠĠ", "æĿ±", "äº¬"]:
        vocab[word] = len(vocab)
    tok = BackendTokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    backend = table_backend(_parts(tok))
    assert backend is not None
    mine = Tokenizer(backend)
    rnd = random.Random(3)
    size = tok.get_vocab_size(with_added_tokens=True)
    for _ in range(300):
        ids = [rnd.randrange(size) for _ in range(rnd.randint(1, 12))]
        for skip in (True, False):
            assert mine.decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)


TAGS = ["<think>", "</think>", "<|im_end|>", "hello", " world", "world", "東京", "東京 x", "◁think▷", "nope nope", " ", "\n\n",
        "Hello", "<tool_call>", "a<|im_end|>", "ĠĠ", "\u00e9", "e\u0301", "</tool_call>", "12", "123", "!!!"]


def test_token_look_ups_are_told_from_the_tables_once_the_unreached_pieces_are_known(
    joined: tuple[Tokenizer, Tokenizer, _Elsewhere],
) -> None:
    """No round trip from the event loop's thread for a stop string or a think tag."""
    tok, full, other = joined
    table = table_of(tok.backend)
    assert table is not None
    from array import array

    found = array("I")
    found.frombytes(unreached_pieces(full.backend))
    table.unreached = frozenset(found)
    try:
        other.calls.clear()
        tok._token_ids.clear()
        pieces = [full.id_to_piece(i) for i in range(0, 151643, 101)]
        texts = TAGS + [full.decode([i], skip_special_tokens=False) for i in range(0, 151643, 101)] + [p or "" for p in pieces]
        for text in texts:
            assert tok.token_id(text) == full.token_id(text), text
        asked = [t for call in other.calls for t in call[0]]
        assert all(any(a.content in t for a in full.added_tokens.values()) for t in asked), asked  # only those
    finally:
        table.unreached = None


@PROPERTY
@given(text=multilingual_text())
def test_a_text_is_one_token_from_the_tables_as_from_the_whole_tokenizer(
    joined: tuple[Tokenizer, Tokenizer, _Elsewhere], text: str
) -> None:
    tok, full, _ = joined
    table = table_of(tok.backend)
    assert table is not None
    table.unreached = frozenset()  # Qwen3's model reaches every piece (the test above checks it through the real list)
    try:
        tok._token_ids.clear()
        for piece in (text, text[:3], text[-2:]):
            assert tok.token_id(piece) == full.token_id(piece)
    finally:
        table.unreached = None


def test_the_unreached_pieces_are_those_the_model_does_not_encode_whole(tmp_path: Path) -> None:
    alphabet = byte_decoder()
    vocab = {c: i for i, c in enumerate(sorted(alphabet, key=alphabet.__getitem__))}
    vocab.update({"ab": 256, "abc": 257, "bc": 258})  # "abc" only from "ab" + "c": no such merge
    tok = BackendTokenizer(models.BPE(vocab, [("a", "b"), ("b", "c")]))
    from array import array

    found = array("I")
    found.frombytes(unreached_pieces(tok))
    assert list(found) == [257]
