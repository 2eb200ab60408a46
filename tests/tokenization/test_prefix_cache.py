"""Multi-turn tokenization cache: always exactly the ids of a full encode."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import AddedToken

from gateway.tokenization import PrefixTokenCache, Tokenizer, prefix_cache

from .helpers import FRAGMENTS, PROPERTY, multilingual_text


def full(qwen: Tokenizer, text: str) -> list[int]:
    return qwen.encode(text, add_special_tokens=False)


message_text = multilingual_text(12)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Alternating turns with reasoning, tool calls and tool results mixed in."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(message_text)})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(message_text)})
        reply: dict[str, Any] = {"role": "assistant", "content": draw(message_text)}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(message_text)
        if draw(st.booleans()):
            reply["tool_calls"] = [
                {"function": {"name": "lookup", "arguments": {"q": draw(message_text)}}}
            ]
            messages.append(reply)
            messages.append({"role": "tool", "content": draw(message_text)})
            continue
        messages.append(reply)
    return messages


@PROPERTY
@given(conversation=conversations(), thinking=st.booleans(), min_chunk=st.integers(0, 48))
def test_every_turn_equals_a_full_encode(
    qwen: Tokenizer, conversation: list[dict[str, Any]], thinking: bool, min_chunk: int
) -> None:
    cache = PrefixTokenCache(qwen, min_chunk_chars=min_chunk)
    kwargs = {"enable_thinking": thinking}
    for end in range(1, len(conversation) + 1):
        if conversation[end - 1]["role"] == "assistant":
            continue
        prompt = qwen.apply_chat_template(conversation[:end], chat_template_kwargs=kwargs)
        assert cache.encode(prompt) == full(qwen, prompt)
        assert cache.encode(prompt) == full(qwen, prompt)  # an exact repeat too


@PROPERTY
@given(
    base=st.lists(st.sampled_from(FRAGMENTS), max_size=20),
    tails=st.lists(
        st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3))), max_size=4
    ),
    min_chunk=st.integers(0, 16),
)
def test_arbitrary_texts_sharing_prefixes(
    qwen: Tokenizer, base: list[str], tails: list[list[str]], min_chunk: int
) -> None:
    """Texts that share a prefix and differ right after (or inside) added tokens."""
    cache = PrefixTokenCache(qwen, min_chunk_chars=min_chunk)
    prefix = "".join(base)
    for tail in [[], *tails]:
        text = prefix + "".join(tail)
        assert "".join(cache.split(text)) == text
        assert cache.encode(text) == full(qwen, text)


def test_counters_show_reuse_across_turns(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen)
    messages = [{"role": "system", "content": "You are terse. " * 20}]
    reused_before = 0
    for turn in range(4):
        messages.append({"role": "user", "content": f"Question {turn}: " + "why? " * 30})
        prompt = qwen.apply_chat_template(messages)
        assert cache.encode(prompt) == full(qwen, prompt)
        stats = cache.stats()
        assert stats.lookups == turn + 1
        if turn:
            assert stats.reused_tokens > reused_before  # this turn reused the history
        reused_before = stats.reused_tokens
        messages.append({"role": "assistant", "content": f"Because {turn}."})
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (3, 1)
    assert 0.5 < stats.reused_token_fraction < 1
    assert stats.hit_rate == 0.75


def test_memory_stays_bounded_and_results_exact(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen, max_entries=6, max_tokens=300, min_chunk_chars=0)
    for conversation in range(8):
        messages = [{"role": "system", "content": f"System {conversation % 3}"}]
        for turn in range(5):
            messages.append({"role": "user", "content": f"u{conversation}-{turn} " * 9})
            prompt = qwen.apply_chat_template(messages)
            assert cache.encode(prompt) == full(qwen, prompt)
            stats = cache.stats()
            assert stats.entries <= 6 and stats.cached_tokens <= 300
            messages.append({"role": "assistant", "content": "ok " * 5})
    assert cache.stats().evictions > 0
    cache.clear()
    assert (cache.stats().entries, cache.stats().cached_tokens) == (0, 0)


def test_a_chunk_larger_than_the_budget_is_not_kept(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen, max_tokens=10)
    text = "<|im_start|>user\n" + "word " * 50 + "<|im_end|>"
    assert cache.encode(text) == full(qwen, text)
    assert cache.stats().cached_tokens <= 10


def test_a_prompt_the_caller_refuses_is_not_kept_and_a_far_longer_one_skips_the_cache(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen)
    messages = [{"role": "user", "content": f"message {i} of a long conversation"} for i in range(40)]
    prompt = qwen.apply_chat_template(messages)
    ids = full(qwen, prompt)
    assert cache.encode(prompt, refused_at=len(ids)) == ids  # refused: counted, encoded, not kept
    assert (cache.stats().lookups, cache.stats().entries) == (1, 0)
    assert cache.encode(prompt, refused_at=len(ids) + 1) == ids  # fits: kept as ever
    assert cache.stats().entries > 0
    kept = cache.stats()
    far = len(prompt) // prefix_cache.REFUSED_CHARS_PER_TOKEN - 1  # more characters than this many a token
    assert cache.encode(prompt + " more", refused_at=far) == full(qwen, prompt + " more")
    assert cache.stats() == kept  # the cache was not asked
    assert cache.encode(prompt + " more", refused_at=0) == full(qwen, prompt + " more")  # no limit: asked
    assert cache.stats().lookups == kept.lookups + 1


def test_no_cut_after_tokens_that_swallow_whitespace(qwen_dir: Path) -> None:
    tok = Tokenizer.from_path(qwen_dir)
    tok.backend.add_special_tokens([AddedToken("<R>", rstrip=True, normalized=False)])
    tok = Tokenizer(tok.backend)
    cache = PrefixTokenCache(tok, min_chunk_chars=0)
    text = "a<R>   b<|im_end|> c"
    assert cache.split(text) == ["a<R>   b<|im_end|>", " c"]
    assert cache.encode(text) == tok.encode(text, add_special_tokens=False)


def test_single_word_tokens_disable_cutting(qwen_dir: Path) -> None:
    tok = Tokenizer.from_path(qwen_dir)
    tok.backend.add_tokens([AddedToken("zork", single_word=True)])
    cache = PrefixTokenCache(Tokenizer(tok.backend))
    assert not cache.splits_text
    text = "<|im_start|>zork<|im_end|>"
    assert cache.split(text) == [text]
    assert cache.encode(text) == cache.encode(text) == tok.encode(text, add_special_tokens=False)


def test_concurrent_use_is_exact(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen, max_entries=40)
    errors: list[str] = []

    def client(seed: int) -> None:
        messages = [{"role": "system", "content": "shared system prompt " * 5}]
        for turn in range(6):
            messages.append({"role": "user", "content": f"client {seed} turn {turn} 日本 😀"})
            prompt = qwen.apply_chat_template(messages)
            if cache.encode(prompt) != full(qwen, prompt):
                errors.append(f"client {seed} turn {turn}")
            messages.append({"role": "assistant", "content": f"reply {turn}"})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert cache.stats().entries <= 40


def test_bad_limits_are_refused(qwen: Tokenizer) -> None:
    with pytest.raises(ValueError):
        PrefixTokenCache(qwen, max_entries=0)


def test_word_cuts_are_on_for_qwen_and_exact(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen, min_text_chunk_chars=16)
    assert cache.word_cuts
    system = "You are a careful assistant and you answer in short plain words. " * 8
    first, second = system + "What is the capital of France?", system + "Name three rivers, please!"
    assert len(cache.split_words(first)) > 3 and "".join(cache.split_words(first)) == first
    for text in (first, second, first):
        assert cache.encode_prompt(text) == qwen.encode(text, add_special_tokens=True)
    stats = cache.stats()
    assert stats.hits == 2 and stats.reused_tokens > len(qwen.encode(system, add_special_tokens=False)) // 2


@PROPERTY
@given(
    words=st.lists(st.one_of(st.sampled_from(FRAGMENTS), message_text, st.sampled_from([" ", "  ", "\n", "a b", "Z y", "'s x"])), max_size=30),
    tails=st.lists(st.lists(st.one_of(st.sampled_from(FRAGMENTS), message_text), max_size=4), max_size=3),
    min_chunk=st.integers(1, 24),
)
def test_plain_text_prompts_with_shared_prefixes_are_exact(
    qwen: Tokenizer, words: list[str], tails: list[list[str]], min_chunk: int
) -> None:
    """Word cuts never change the ids, whatever the text (added tokens, spaces, scripts)."""
    cache = PrefixTokenCache(qwen, min_text_chunk_chars=min_chunk)
    prefix = "".join(words)
    for tail in [[], *tails]:
        text = prefix + "".join(tail)
        assert "".join(cache.split_words(text)) == text
        assert cache.encode_prompt(text) == qwen.encode(text, add_special_tokens=True)


def test_whitespace_swallowing_added_tokens_disable_word_cuts(qwen_dir: Path) -> None:
    tok = Tokenizer.from_path(qwen_dir)
    tok.backend.add_special_tokens([AddedToken("<R>", rstrip=True, normalized=False)])
    cache = PrefixTokenCache(Tokenizer(tok.backend), min_text_chunk_chars=4)
    assert not cache.word_cuts
    text = "words and words <R> more words " * 40
    assert cache.encode_prompt(text) == tok.encode(text, add_special_tokens=True)


def test_short_chunks_are_encoded_once_wherever_they_sit(qwen: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new conversation misses the trie after its new message, but the generation
    prompt after it (a short chunk) comes from the short-chunk table: only the new
    message is encoded, and the ids stay exactly a full encode's."""
    cache = PrefixTokenCache(qwen)
    encoded: list[str] = []
    real = qwen.encode_batch

    def counting(texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        encoded.extend(texts)
        return real(texts, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(qwen, "encode_batch", counting)
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    for i in range(5):
        prompt = qwen.apply_chat_template([system, {"role": "user", "content": f"Question number {i}, please?"}])
        assert cache.encode(prompt) == full(qwen, prompt)
    tail = "\n<|im_start|>assistant\n"
    assert encoded.count(tail) == 1
    assert len(encoded) == 3 + 4  # system, first question, tail; then each new question alone
    cache.clear()
    prompt = qwen.apply_chat_template([system, {"role": "user", "content": "Again?"}])
    assert cache.encode(prompt) == full(qwen, prompt)
    assert encoded.count(tail) == 2  # clear() forgets the short chunks too


def test_short_texts_go_to_the_fast_encoder_whole_once_it_is_built(qwen_dir: Path) -> None:
    from gateway.tokenization.prefix_cache import DIRECT_CHARS

    tok = Tokenizer.from_path(qwen_dir)  # its own: the session tokenizer keeps the HF encoder
    cache = PrefixTokenCache(tok)
    chat = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there, é 東京<|im_end|>\n<|im_start|>assistant\n"
    assert cache.encode(chat) == full(tok, chat) and cache.stats().lookups == 1  # not built: the cache
    assert tok.fast_bpe is not None
    for text in (chat, chat.replace("Hello", "Bye"), "x" * DIRECT_CHARS):
        assert cache.encode(text) == full(tok, text)
    assert cache.stats().lookups == 1  # short texts are not looked up any more
    long = chat + "more words " * (DIRECT_CHARS // 10)
    assert cache.encode(long) == full(tok, long) and cache.stats().lookups == 2
    hits = cache.stats().hits
    assert cache.encode(long + chat) == full(tok, long + chat) and cache.stats().hits == hits + 1


def test_new_chars_counts_what_an_encode_would_hand_the_tokenizer(qwen: Tokenizer) -> None:
    cache = PrefixTokenCache(qwen)
    system = "<|im_start|>system\n" + "You answer briefly and well. " * 300 + "<|im_end|>"
    turn = "\n<|im_start|>user\nWhat is the time?<|im_end|>\n<|im_start|>assistant\n"
    chat = system + turn
    assert cache.new_chars(chat) == len(chat)  # nothing cached yet
    assert cache.encode(chat) == full(qwen, chat)
    assert cache.new_chars(chat) == 0
    other = system + "\n<|im_start|>user\nAnd the date, please?<|im_end|>\n<|im_start|>assistant\n"
    assert 0 < cache.new_chars(other) <= len(other) - len(system)
    assert cache.new_chars("short text") == len("short text")  # encoded whole, the cache not asked
    assert cache.new_chars(chat, refused_at=10) == len(chat)  # far past a refusal: encoded whole

    shared = "alpha beta gamma delta " * 400
    assert cache.new_chars(shared + "first question", prompt=True) == len(shared) + len("first question")
    assert cache.encode_prompt(shared + "first question") == qwen.encode(shared + "first question", add_special_tokens=True)
    left = cache.new_chars(shared + "second question", prompt=True)
    assert 0 < left < 2 * cache.min_text_chunk_chars
    assert cache.new_chars("alpha beta", prompt=True) == len("alpha beta")
