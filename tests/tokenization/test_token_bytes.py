"""The byte-level detokenizer's bytes: each step's text is ``DecodeStream``'s, exactly."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers
from tokenizers.decoders import DecodeStream

from gateway.tokenization import IncrementalDetokenizer, Tokenizer
from gateway.tokenization.token_bytes import for_backend

from .helpers import PROPERTY, multilingual_text

MANY = settings(PROPERTY, max_examples=300)


def decode_stream_steps(tok: Tokenizer, ids: Sequence[int], skip: bool, context: Sequence[int] = ()) -> list[str]:
    """What ``DecodeStream`` gives per id (None as ""): the reference the relay used to send."""
    stream = DecodeStream(ids=list(context) or None, skip_special_tokens=skip)
    return [stream.step(tok.backend, i) or "" for i in ids]


def qwen_ids(vocab_size: int) -> st.SearchStrategy[int]:
    """Any id, weighted towards the single bytes (broken and partial UTF-8), the added
    tokens, and U+FFFD's own bytes."""
    return st.one_of(
        st.integers(0, vocab_size - 1),
        st.integers(0, 255),
        st.integers(151643, vocab_size - 1),
        st.sampled_from([5691, 29333]),
    )


def test_a_byte_level_tokenizer_has_its_bytes(qwen: Tokenizer) -> None:
    for skip in (True, False):
        table = qwen.token_bytes(skip)
        assert table is not None
        ids = qwen.encode("Hello, 世界! <think>ok</think>", add_special_tokens=False)
        assert table.text(ids) == qwen.decode(ids, skip_special_tokens=skip)
    im_end = qwen.token_id("<|im_end|>")
    assert im_end is not None
    assert qwen.token_bytes(True).text([im_end]) == ""  # type: ignore[union-attr]
    assert qwen.token_bytes(False).text([im_end]) == "<|im_end|>"  # type: ignore[union-attr]
    assert qwen.token_bytes(True).text([qwen.vocab_size + 5]) == ""  # type: ignore[union-attr]  # unknown: skipped


def test_warming_checks_both_tables_once(qwen_dir: Path) -> None:
    tok = Tokenizer.from_path(qwen_dir)
    tok.warm_token_bytes()
    first = tok.token_bytes(True), tok.token_bytes(False)
    assert all(t is not None for t in first)
    assert (tok.token_bytes(True), tok.token_bytes(False)) == first  # kept, not checked again


def test_other_decoders_keep_decode_stream() -> None:
    backend = BackendTokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Replace("a", "b")])
    assert for_backend(backend, True) is None
    backend.decoder = decoders.Metaspace()
    assert for_backend(backend, True) is None
    backend.decoder = decoders.ByteLevel()
    assert for_backend(backend, True) is None  # not a BPE model


@MANY
@given(data=st.data(), skip=st.booleans())
def test_each_step_is_decode_streams_text(qwen: Tokenizer, data: st.DataObject, skip: bool) -> None:
    ids = data.draw(st.lists(qwen_ids(qwen.vocab_size), max_size=40))
    detok = IncrementalDetokenizer(qwen, skip)
    assert detok._bytes is not None  # the byte path is the one under test
    assert [detok.step_one(i) for i in ids] == decode_stream_steps(qwen, ids, skip)
    assert "".join(decode_stream_steps(qwen, ids, skip)) + detok.flush() == qwen.decode(ids, skip_special_tokens=skip)


@PROPERTY
@given(prompt=multilingual_text(10), output=multilingual_text(30))
def test_text_and_a_seeded_stream_step_as_decode_stream(qwen: Tokenizer, prompt: str, output: str) -> None:
    context = qwen.encode(prompt, add_special_tokens=False)
    ids = qwen.encode(output, add_special_tokens=False)
    seeded = IncrementalDetokenizer(qwen, True, context_ids=context)
    kept = seeded._context  # the context DecodeStream is seeded with (one ending inside a character is dropped)
    assert [seeded.step_one(i) for i in ids] == decode_stream_steps(qwen, ids, True, kept)
    plain = IncrementalDetokenizer(qwen, True)
    assert [plain.step([i]) for i in ids] == decode_stream_steps(qwen, ids, True)
