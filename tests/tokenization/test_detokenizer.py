"""Incremental detokenizer: the joined stream equals one decode of all ids, exactly."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from gateway.tokenization import IncrementalDetokenizer, Tokenizer

from .helpers import PROPERTY, multilingual_text

MANY = settings(PROPERTY, max_examples=200)  # these properties are cheap: look harder

REPLACEMENT = "\ufffd"


def stream(
    detok: IncrementalDetokenizer, ids: Sequence[int], chunk_sizes: Sequence[int] = (1,)
) -> list[str]:
    """Feed ``ids`` in chunks (sizes cycled), then flush; return every piece."""
    pieces: list[str] = []
    i = k = 0
    while i < len(ids):
        size = max(1, chunk_sizes[k % len(chunk_sizes)])
        pieces.append(detok.step(ids[i : i + size]))
        i, k = i + size, k + 1
    pieces.append(detok.flush())
    return pieces


def qwen_ids(vocab_size: int) -> st.SearchStrategy[int]:
    """Any id, with extra weight on the 256 single-byte pieces and the added tokens."""
    return st.one_of(
        st.integers(0, vocab_size - 1),
        st.integers(0, 255),
        st.integers(151643, vocab_size - 1),
    )


@MANY
@given(data=st.data(), skip=st.booleans())
def test_random_ids_stream_to_the_full_decode(
    qwen: Tokenizer, data: st.DataObject, skip: bool
) -> None:
    ids = data.draw(st.lists(qwen_ids(qwen.vocab_size), max_size=40))
    sizes = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=5))
    expected = qwen.decode(ids, skip_special_tokens=skip)
    assert "".join(stream(IncrementalDetokenizer(qwen, skip), ids)) == expected
    assert "".join(stream(IncrementalDetokenizer(qwen, skip), ids, sizes)) == expected


@MANY
@given(text=multilingual_text(), sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_encoded_text_streams_back_without_broken_characters(
    qwen: Tokenizer, text: str, sizes: list[int]
) -> None:
    ids = qwen.encode(text, add_special_tokens=False)
    for skip in (True, False):
        expected = qwen.decode(ids, skip_special_tokens=skip)
        for chunking in ([1], sizes):
            pieces = stream(IncrementalDetokenizer(qwen, skip), ids, chunking)
            assert "".join(pieces) == expected
            if REPLACEMENT not in expected:  # never a half character on the wire
                assert not any(REPLACEMENT in p for p in pieces)


@PROPERTY
@given(prompt=multilingual_text(10), output=multilingual_text(20))
def test_seeding_with_the_prompt_changes_nothing_for_byte_level(
    qwen: Tokenizer, prompt: str, output: str
) -> None:
    context = qwen.encode(prompt, add_special_tokens=False)
    ids = qwen.encode(output, add_special_tokens=False)
    seeded = IncrementalDetokenizer(qwen, True, context_ids=context)
    assert "".join(stream(seeded, ids)) == qwen.decode(ids)


def test_emoji_is_held_until_complete(qwen: Tokenizer) -> None:
    family = "👩‍👩‍👧‍👦"
    ids = qwen.encode(family, add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(qwen)
    pieces = [detok.step([i]) for i in ids]
    assert all(REPLACEMENT not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == family
    assert "".join(pieces[:-1]) != family  # really streamed piecewise


def test_flush_releases_a_trailing_broken_sequence(qwen: Tokenizer) -> None:
    ids = qwen.encode("ok ", add_special_tokens=False)
    partial = [qwen.backend.token_to_id("ä")]  # byte 0xE4 alone: the first byte of 中
    detok = IncrementalDetokenizer(qwen)
    assert detok.step(ids) == "ok "
    assert detok.step(partial) == ""  # held: it may still complete
    assert detok.flush() == REPLACEMENT == qwen.decode(partial)
    with pytest.raises(RuntimeError):
        detok.step(ids)


def test_special_tokens_are_skipped_or_kept(qwen: Tokenizer) -> None:
    ids = qwen.encode("Hi<|im_end|>", add_special_tokens=False)
    assert "".join(stream(IncrementalDetokenizer(qwen, True), ids)) == "Hi"
    assert "".join(stream(IncrementalDetokenizer(qwen, False), ids)) == "Hi<|im_end|>"


@pytest.fixture(scope="module")
def metaspace() -> Tokenizer:
    """A small SentencePiece-style tokenizer (Metaspace, prefix space on the first word)."""
    backend = BackendTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.decoder = decoders.Metaspace(prepend_scheme="first")
    corpus = ["hello world again and again", "the world says hello", "again the hello"] * 20
    backend.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
    )
    return Tokenizer(backend, name="metaspace")


def test_metaspace_leading_space_matches_decode(metaspace: Tokenizer) -> None:
    ids = metaspace.encode("hello world again", add_special_tokens=False)
    split = next(i for i in range(1, len(ids)) if metaspace.id_to_piece(ids[i]).startswith("▁"))
    prompt, output = ids[:split], ids[split:]
    # Unseeded: the same text a non-streaming response gets (no leading space).
    plain = "".join(stream(IncrementalDetokenizer(metaspace), output))
    assert plain == metaspace.decode(output) and not plain.startswith(" ")
    # Seeded with the prompt: the text as it continues the prompt (leading space kept).
    seeded = "".join(stream(IncrementalDetokenizer(metaspace, context_ids=prompt), output))
    assert seeded == metaspace.decode(ids)[len(metaspace.decode(prompt)) :]
    assert seeded.startswith(" ")


def test_inconsistent_decoder_does_not_break_the_stream() -> None:
    """A decoder whose output is not prefix-stable makes DecodeStream raise; the stream
    switches to full decodes and keeps going instead of failing the response."""
    backend = BackendTokenizer(models.WordLevel({"a": 0, "b": 1, "c": 2, "<unk>": 3}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    detok = IncrementalDetokenizer(Tokenizer(backend))
    pieces = stream(detok, [0, 1, 2, 2])
    assert pieces == ["a", "", "c", "c", ""]  # "a" was already sent; the rest continues


@MANY
@given(data=st.data(), skip=st.booleans())
def test_step_many_joins_to_the_full_decode(qwen: Tokenizer, data: st.DataObject, skip: bool) -> None:
    """Several ids per DecodeStream call (a whole answer): the joined text, flush included,
    is one decode of all ids, whatever the chunking and however the ids end."""
    ids = data.draw(st.lists(qwen_ids(qwen.vocab_size), max_size=40))
    sizes = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    detok = IncrementalDetokenizer(qwen, skip)
    pieces: list[str] = []
    i = k = 0
    while i < len(ids):
        size = sizes[k % len(sizes)]
        pieces.append(detok.step_many(ids[i : i + size]))
        i, k = i + size, k + 1
    assert "".join(pieces) + detok.flush() == qwen.decode(ids, skip_special_tokens=skip)
