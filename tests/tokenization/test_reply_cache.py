"""Reply token reuse: a reply sent back is tokenized as the ids that generated it, so the
next turn's prompt ids are the previous prompt's ids followed by the generated ids."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tokenization import PrefixTokenCache, Tokenizer
from gateway.tokenization.reply_cache import ReplyTokenCache, message_texts

SYSTEM = {"role": "system", "content": "You are a terse assistant that answers in one line."}


def pieces(qwen: Tokenizer, *parts: str) -> list[int]:
    """Ids a model could generate: each part tokenized on its own (not BPE of the whole)."""
    return [t for p in parts for t in qwen.encode(p, add_special_tokens=False)]


def generated(qwen: Tokenizer) -> tuple[str, list[int]]:
    ids = pieces(qwen, "Hel", "lo", " wor", "ld", "! Th", "e ans", "wer is 4", "2.")
    text = qwen.decode(ids, skip_special_tokens=False)
    assert text == "Hello world! The answer is 42."
    assert qwen.encode(text, add_special_tokens=False) != ids  # re-encoding would diverge
    return text, ids


def splice_encode(cache: ReplyTokenCache, prompt: PrefixTokenCache, salt: str | None, messages: list[dict[str, Any]], text: str) -> list[int]:
    """What ``Engine.render_chat`` does with the rendered text."""
    spans = cache.spans(salt, text, message_texts(messages))
    return cache.encode_spliced(text, spans, prompt.encode) if spans else prompt.encode(text)


@pytest.fixture
def caches(qwen: Tokenizer) -> tuple[ReplyTokenCache, PrefixTokenCache]:
    return ReplyTokenCache(qwen), PrefixTokenCache(qwen)


def test_second_turn_is_previous_prompt_plus_generated_ids(qwen: Tokenizer, caches: Any) -> None:
    cache, prompt = caches
    turn1 = [SYSTEM, {"role": "user", "content": "Say hello, then the answer."}]
    text1 = qwen.apply_chat_template(turn1)
    ids1 = splice_encode(cache, prompt, None, turn1, text1)
    assert ids1 == qwen.encode(text1, add_special_tokens=False)
    reply, gen = generated(qwen)
    eos = qwen.token_id("<|im_end|>")
    assert eos is not None and eos in qwen.eos_token_ids
    assert cache.record(None, reply, [*gen, eos])  # the stop token is dropped

    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "Again?"}]
    text2 = qwen.apply_chat_template(turn2)
    ids2 = splice_encode(cache, prompt, None, turn2, text2)
    assert ids2[: len(ids1) + len(gen)] == ids1 + gen
    assert qwen.decode(ids2, skip_special_tokens=False) == text2  # the same text, token for token
    assert ids2[len(ids1) + len(gen)] == eos  # the template's own end of turn follows

    # Third turn: both replies recorded, the prompt extends the second turn's prompt + reply.
    reply2_ids = pieces(qwen, "Ye", "s, ", "agai", "n.")
    reply2 = qwen.decode(reply2_ids, skip_special_tokens=False)
    assert cache.record(None, reply2, reply2_ids)
    turn3 = [*turn2, {"role": "assistant", "content": reply2}, {"role": "user", "content": "Bye."}]
    text3 = qwen.apply_chat_template(turn3)
    ids3 = splice_encode(cache, prompt, None, turn3, text3)
    assert ids3[: len(ids2) + len(reply2_ids)] == ids2 + reply2_ids
    assert qwen.decode(ids3, skip_special_tokens=False) == text3
    st = cache.stats()
    assert (st.recorded, st.spliced_spans, st.spliced_tokens) == (2, 3, 2 * len(gen) + len(reply2_ids))


def test_text_that_does_not_round_trip_is_not_recorded(qwen: Tokenizer, caches: Any) -> None:
    cache, _ = caches
    reply, gen = generated(qwen)
    assert not cache.record(None, reply[:-1], gen)  # a stop string cut the text
    assert not cache.record(None, "42.", pieces(qwen, "<think>\nhm\n</think>\n\n", "42."))  # reasoning stripped
    assert not cache.record(None, "", [])
    assert cache.lookup(None, reply[:-1]) is None
    assert cache.stats().rejected == 2


def test_unrecorded_or_rewritten_replies_are_encoded_as_usual(qwen: Tokenizer, caches: Any) -> None:
    cache, prompt = caches
    reply, gen = generated(qwen)
    cache.record(None, reply, gen)
    other = [SYSTEM, {"role": "user", "content": "x"}, {"role": "assistant", "content": "Not recorded."}, {"role": "user", "content": "y"}]
    text = qwen.apply_chat_template(other)
    assert splice_encode(cache, prompt, None, other, text) == qwen.encode(text, add_special_tokens=False)
    # A user quoting the reply is not spliced: only assistant messages are.
    quoted = [SYSTEM, {"role": "user", "content": reply}]
    text = qwen.apply_chat_template(quoted)
    assert splice_encode(cache, prompt, None, quoted, text) == qwen.encode(text, add_special_tokens=False)
    # The template rewrites a reply holding a think block: not found verbatim, not spliced.
    thought = "<think>\nx\n</think>\n\n" + reply
    cache.record(None, thought, pieces(qwen, "<think>\nx\n</think>\n\n") + gen)
    rewritten = [SYSTEM, {"role": "user", "content": "q"}, {"role": "assistant", "content": thought}, {"role": "user", "content": "z"}]
    text = qwen.apply_chat_template(rewritten)
    assert thought not in text
    assert splice_encode(cache, prompt, None, rewritten, text) == qwen.encode(text, add_special_tokens=False)


def test_tenants_are_isolated(qwen: Tokenizer, caches: Any) -> None:
    cache, prompt = caches
    reply, gen = generated(qwen)
    assert cache.record("tenant-a", reply, gen)
    assert cache.lookup("tenant-a", reply) is not None
    assert cache.lookup("tenant-b", reply) is None
    assert cache.lookup(None, reply) is None
    turn = [SYSTEM, {"role": "user", "content": "q"}, {"role": "assistant", "content": reply}, {"role": "user", "content": "z"}]
    text = qwen.apply_chat_template(turn)
    assert splice_encode(cache, prompt, "tenant-b", turn, text) == qwen.encode(text, add_special_tokens=False)
    assert gen == list(splice_encode(cache, prompt, "tenant-a", turn, text)[len(qwen.encode(text[: text.index(reply)], add_special_tokens=False)):][: len(gen)])


def test_bounded_by_entries_and_bytes_lru(qwen: Tokenizer) -> None:
    cache = ReplyTokenCache(qwen, max_entries=3)
    replies = [(f"reply number {i}", qwen.encode(f"reply number {i}", add_special_tokens=False)) for i in range(5)]
    for text, ids in replies[:3]:
        assert cache.record(None, text, ids)
    assert cache.lookup(None, replies[0][0]) is not None  # touched: now the most recent
    cache.record(None, *replies[3])
    assert cache.lookup(None, replies[1][0]) is None  # least recently used went first
    assert all(cache.lookup(None, replies[i][0]) is not None for i in (0, 2, 3))
    st = cache.stats()
    assert (st.entries, st.evictions) == (3, 1)

    one = len(replies[0][0]) + 4 * len(replies[0][1])
    small = ReplyTokenCache(qwen, max_bytes=2 * one + 1)
    for text, ids in replies:
        small.record(None, text, ids)
    st = small.stats()
    assert st.entries == 2 and st.bytes <= 2 * one + 1
    assert [small.lookup(None, t) is not None for t, _ in replies] == [False, False, False, True, True]
    huge = "x" * 64
    assert not ReplyTokenCache(qwen, max_bytes=32).record(None, huge, qwen.encode(huge, add_special_tokens=False))
    small.clear()
    assert small.stats().entries == 0 and small.stats().bytes == 0


def test_re_recording_replaces_without_leaking_bytes(qwen: Tokenizer) -> None:
    cache = ReplyTokenCache(qwen)
    ids = qwen.encode("same text", add_special_tokens=False)
    cache.record(None, "same text", ids)
    before = cache.stats().bytes
    cache.record(None, "same text", ids)
    assert cache.stats().bytes == before and cache.stats().entries == 1


def test_message_texts() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
        {"role": "assistant", "content": "b"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "c"},
    ]
    assert message_texts(messages) == [("a", False), ("b", True), ("c", False)]
