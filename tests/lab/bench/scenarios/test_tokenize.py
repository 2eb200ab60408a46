"""`token-gateway bench tokenize` (gateway_lab.bench.scenarios.tokenize): deterministic
prose, prompts of a given token length, conversations the template renders, and the
multi-turn cache checked against full encodes."""

from __future__ import annotations

from functools import cache

from gateway.tokenization import Tokenizer
from gateway_lab.bench.scenarios import tokenize as scenario


@cache
def _qwen() -> Tokenizer:
    return Tokenizer.from_path(scenario.default_tokenizer_dir())


def test_text_is_deterministic_per_seed_and_prompts_have_their_length() -> None:
    tok = _qwen()
    a, b, c = scenario.TextGen(tok, 1), scenario.TextGen(tok, 1), scenario.TextGen(tok, 2)
    assert a.paragraph(50) == b.paragraph(50) != c.paragraph(50)
    sentence = a.sentence()
    assert sentence[0].isupper() and sentence[-1] in ".?!"
    text = scenario.prompt_of(tok, scenario.TextGen(tok, 3), 300)
    assert abs(len(tok.encode(text, add_special_tokens=False)) - 300) <= 3


def test_conversations_render_and_the_cache_matches_full_encodes() -> None:
    tok = _qwen()
    gen = scenario.TextGen(tok, 0)
    messages = scenario.conversation_messages(gen, 3)
    roles = [m["role"] for m in messages]
    assert roles[0] == "system" and roles.count("user") == 3 and "tool" in roles
    table, speedup = scenario.bench_multi_turn(tok, gen, 2, 2)  # exits if the cache ever differs
    assert any("PrefixTokenCache" in row[0] for row in table.rows) and speedup > 0


def test_timing_helpers() -> None:
    calls: list[int] = []
    per_call, reps = scenario.timed(lambda: calls.append(1), 0.0)
    assert reps == 1 and len(calls) == 2 and per_call >= 0  # a warm-up call, then at least one timed
