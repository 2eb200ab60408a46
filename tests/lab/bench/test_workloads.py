"""Workload generators: deterministic, exact lengths, ideal hit rate, trace round trip."""

from __future__ import annotations

import dataclasses
import json
import random
import statistics

import pytest
from tokenizers import Tokenizer

from gateway_lab.bench.workloads import (
    LOGNORMAL_CAP,
    OUTPUT_SPREADS,
    ChatConfig,
    GspConfig,
    LongMixConfig,
    RequestSpec,
    Vocab,
    Workload,
    ZipfGspConfig,
    default_tokenizer_dir,
    gsp,
    ideal_hit_rate,
    iter_gsp,
    load_trace,
    long_context_mix,
    multi_turn_chat,
    output_length,
    with_poisson_arrivals,
    write_trace,
    zipf_gsp,
)

SMALL = GspConfig(groups=4, prompts_per_group=3, system_tokens=40, question_tokens=7, output_tokens=5)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.from_tokenizer_dir()


def test_gsp_is_deterministic_and_seed_dependent(vocab: Vocab) -> None:
    a, b = gsp(SMALL, vocab, seed=1), gsp(SMALL, vocab, seed=1)
    assert a.requests == b.requests
    assert gsp(SMALL, vocab, seed=2).requests != a.requests


def test_gsp_shape_and_exact_lengths(vocab: Vocab) -> None:
    w = gsp(SMALL, vocab, seed=3)
    assert len(w) == 12 and w.name == "gsp"
    by_group: dict[str, list[RequestSpec]] = {}
    for spec in w:
        assert spec.endpoint == "completions" and spec.max_tokens == 5 and spec.ignore_eos
        assert spec.prompt_token_ids is not None and len(spec.prompt_token_ids) == 47
        by_group.setdefault(spec.group, []).append(spec)
    assert sorted(by_group) == ["g0", "g1", "g2", "g3"]
    for specs in by_group.values():
        assert len(specs) == 3
        assert len({s.prompt_token_ids[:40] for s in specs}) == 1  # one system prompt per group
        assert len({s.prompt_token_ids[40:] for s in specs}) == 3  # unique questions
    assert len({s.prompt_token_ids[:40] for s in w}) == 4
    # shuffled: not in generation (group by group) order
    assert [s.group for s in w] != [s.group for s in iter_gsp(SMALL, vocab, seed=3)]


def test_text_prompts_tokenize_to_the_same_ids(vocab: Vocab) -> None:
    tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    by_ids = gsp(SMALL, vocab, seed=4)
    by_text = gsp(dataclasses.replace(SMALL, text_prompts=True), vocab, seed=4)
    for a, b in zip(by_ids, by_text, strict=True):
        assert b.prompt_token_ids is None and b.prompt is not None
        assert tuple(tok.encode(b.prompt, add_special_tokens=False).ids) == a.prompt_token_ids
    ideal = ideal_hit_rate(by_text, tokenize=lambda s: tok.encode(s, add_special_tokens=False).ids)
    assert ideal == ideal_hit_rate(by_ids)


def test_ideal_hit_rate_hand_checked() -> None:
    # page 1: [1,2,3] then [1,2,4]: 6 tokens, 2 of them seen before
    assert ideal_hit_rate([[1, 2, 3], [1, 2, 4]]) == pytest.approx(2 / 6)
    # order does not matter
    assert ideal_hit_rate([[1, 2, 4], [1, 2, 3]]) == pytest.approx(2 / 6)
    # a divergence cuts the match: [1,9,3] shares only its first token with [1,2,3]
    assert ideal_hit_rate([[1, 2, 3], [1, 9, 3]]) == pytest.approx(1 / 6)
    # pages of 2: [1,2 | 3,4 | 5] and [1,2 | 3,4 | 6]: two whole pages hit; the tail never does
    assert ideal_hit_rate([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]], page_size=2) == pytest.approx(4 / 10)
    # pages of 4: the shared [1,2,3] is less than a page, so nothing hits
    assert ideal_hit_rate([[1, 2, 3, 4], [1, 2, 3, 5]], page_size=4) == 0.0
    assert ideal_hit_rate([[1, 2, 3, 4], [1, 2, 3, 4]], page_size=4) == pytest.approx(0.5)
    assert ideal_hit_rate([]) == 0.0


def test_gsp_ideal_matches_the_formula(vocab: Vocab) -> None:
    cfg = GspConfig(groups=3, prompts_per_group=5, system_tokens=64, question_tokens=16, output_tokens=1)
    total = 3 * 5 * 80
    unique = 3 * 64 + 15 * 16
    # a question may start with the same random token as a sibling's: allow that much slack
    assert ideal_hit_rate(gsp(cfg, vocab)) == pytest.approx(1 - unique / total, abs=3 / total)
    assert ideal_hit_rate(gsp(cfg, vocab), page_size=16) == pytest.approx(1 - unique / total)


def test_chat_turns_and_conversations(vocab: Vocab) -> None:
    cfg = ChatConfig(conversations=3, turns=2, chat_system_tokens=10, user_tokens=6, reply_tokens=4)
    w = multi_turn_chat(cfg, vocab, seed=5)
    assert len(w) == 6 and w.requests == multi_turn_chat(cfg, vocab, seed=5).requests
    first = [s for s in w if s.turn == 0]
    later = [s for s in w if s.turn == 1]
    assert [m["role"] for m in first[0].messages] == ["system", "user"]
    assert [m["role"] for m in later[0].messages] == ["user"]  # history is added by the driver
    assert {s.conversation for s in first} == {"c0", "c1", "c2"}
    assert all(s.endpoint == "chat" and s.max_tokens == 4 for s in w)
    assert len(first[0].messages[1]["content"].split()) == 6


def test_long_mix(vocab: Vocab) -> None:
    cfg = LongMixConfig(long_prompts=2, long_repeats=2, long_min_tokens=8192, long_max_tokens=9000,
                        short_prompts=10, short_min_tokens=20, short_max_tokens=30)
    w = long_context_mix(cfg, vocab, seed=6)
    lengths = sorted(len(s.prompt_token_ids or ()) for s in w)
    assert len(w) == 14
    assert all(20 <= n <= 30 for n in lengths[:10])
    assert all(8192 + 32 <= n <= 9000 + 32 for n in lengths[10:])
    assert 0.3 < ideal_hit_rate(w) < 0.5  # the second question about each document hits


def test_trace_round_trip(vocab: Vocab, tmp_path) -> None:
    timed = with_poisson_arrivals(gsp(SMALL, vocab, seed=7), rate=50.0, seed=7)
    times = [s.arrival_s for s in timed]
    assert times == sorted(times) and all(t is not None and t > 0 for t in times)
    chat = multi_turn_chat(ChatConfig(conversations=2, turns=2, chat_system_tokens=3, user_tokens=3,
                                      reply_tokens=2), vocab)
    chat = Workload("chat", tuple(dataclasses.replace(s, arrival_s=1.5) for s in chat))
    text = RequestSpec(endpoint="completions", max_tokens=3, prompt="hello there", arrival_s=2.0,
                       ignore_eos=False)
    mixed = Workload("mixed", (*timed.requests, *chat.requests, text))
    path = write_trace(mixed, tmp_path / "mixed.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == len(mixed)
    assert set(json.loads(lines[0])) >= {"t", "endpoint", "prompt_token_ids", "max_tokens"}
    back = load_trace(path)
    assert back.requests == mixed.requests and back.name == "mixed"
    assert all(s.arrival_s is None for s in load_trace(path, use_times=False))


def test_trace_rejects_bad_lines(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"t": 0, "endpoint": "completions", "max_tokens": 3}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_trace(bad)
    bad.write_text('{"t": 0, "prompt": "x", "max_tokens": 3, "colour": 1}\n')
    with pytest.raises(ValueError, match="unknown trace fields"):
        load_trace(bad)


def test_head_bounds_the_workload(vocab: Vocab) -> None:
    w = gsp(SMALL, vocab)
    assert w.head(5).requests == w.requests[:5]


def test_rendered_chat_prompts_extend_each_other(vocab: Vocab) -> None:
    from gateway_lab.bench.workloads import render_chat_prompts

    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    second = [*first, {"role": "assistant", "content": "hi friend"}, {"role": "user", "content": "again"}]
    (a, b), (a_done, b_done) = render_chat_prompts([first, second], replies=["hi friend", "ok"])
    assert len(b) > len(a) and b[: len(a)] == a  # the second turn resends the first
    assert a_done[: len(a)] == a and b[: len(a_done)] == a_done  # ...and its reply
    assert ideal_hit_rate([a, b]) == pytest.approx(len(a) / (len(a) + len(b)))
    with_replies = ideal_hit_rate([a, b], cached_after=[a_done, b_done])
    assert with_replies > ideal_hit_rate([a, b])


def test_chat_prompts_as_sent_with_reply_token_reuse(vocab: Vocab) -> None:
    """With each reply's completion length, a resent reply stands for the ids that generated
    it (what --reply-token-reuse sends), so the next prompt starts with the previous turn's
    whole cached output, not with a re-encoding of its text."""
    from gateway_lab.bench.workloads import render_chat_prompts

    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    second = [*first, {"role": "assistant", "content": "hi friend"}, {"role": "user", "content": "again"}]
    (a, b), (a_done, b_done) = render_chat_prompts(
        [first, second], replies=["hi friend", "ok"], reply_tokens=[5, 2]
    )
    assert len(a_done) == len(a) + 5 and a_done[: len(a)] == a
    assert b[: len(a_done)] == a_done  # the second turn resends the first prompt and its 5 generated ids
    assert len(b_done) == len(b) + 2
    (_, b_text), _ = render_chat_prompts([first, second], replies=["hi friend", "ok"])
    assert b_text[: len(a_done)] != a_done  # re-encoded, the reply is not the generated ids
    ideal = ideal_hit_rate([a, b], cached_after=[a_done, b_done])
    assert ideal == pytest.approx(len(a_done) / (len(a) + len(b)))


def test_ideal_with_outputs_cached() -> None:
    # the first request's output [7, 8] is cached with it, and the second prompt resends it
    prompts = [[1, 2, 3], [1, 2, 3, 7, 8, 4]]
    assert ideal_hit_rate(prompts) == pytest.approx(3 / 9)
    assert ideal_hit_rate(prompts, cached_after=[[1, 2, 3, 7, 8], [1, 2, 3, 7, 8, 4, 9]]) == pytest.approx(5 / 9)


def test_output_length_distributions_keep_the_mean_and_are_seeded() -> None:
    for spread in OUTPUT_SPREADS:
        draws = [output_length(128, spread, random.Random(i)) for i in range(4000)]
        assert draws == [output_length(128, spread, random.Random(i)) for i in range(4000)]
        assert min(draws) >= 1 and max(draws) <= LOGNORMAL_CAP * 128
        assert statistics.mean(draws) == pytest.approx(128, rel=0.06)
    assert {output_length(128, "fixed", random.Random(i)) for i in range(50)} == {128}
    uniform = [output_length(128, "uniform", random.Random(i)) for i in range(4000)]
    assert min(uniform) >= 1 and max(uniform) <= 255 and len(set(uniform)) > 200
    lognormal = sorted(output_length(128, "lognormal", random.Random(i)) for i in range(4000))
    assert lognormal[len(lognormal) // 2] < 100  # most answers short, a long tail
    assert lognormal[-40] > 400
    assert output_length(1, "lognormal", random.Random(0)) == 1
    with pytest.raises(ValueError, match="output spread"):
        output_length(128, "pareto", random.Random(0))


def test_gsp_and_zipf_spread_outputs_without_changing_prompts(vocab: Vocab) -> None:
    spread = dataclasses.replace(SMALL, output_tokens=32, output_spread="uniform")
    fixed, varied = gsp(dataclasses.replace(SMALL, output_tokens=32), vocab, seed=3), gsp(spread, vocab, seed=3)
    assert [s.prompt_token_ids for s in fixed] == [s.prompt_token_ids for s in varied]
    assert {s.max_tokens for s in fixed} == {32}
    assert len({s.max_tokens for s in varied}) > 3
    assert varied.requests == gsp(spread, vocab, seed=3).requests
    zcfg = ZipfGspConfig(zipf_groups=4, zipf_requests=40)
    z_fixed = zipf_gsp(zcfg, dataclasses.replace(SMALL, output_tokens=32), vocab, seed=1)
    z_varied = zipf_gsp(zcfg, spread, vocab, seed=1)
    assert [s.prompt_token_ids for s in z_fixed] == [s.prompt_token_ids for s in z_varied]
    assert len({s.max_tokens for s in z_varied}) > 5 and z_varied.params["output_spread"] == "uniform"


def test_gsp_without_ignore_eos_makes_max_tokens_a_cap(vocab: Vocab) -> None:
    cfg = dataclasses.replace(SMALL, output_tokens=64, ignore_eos=False)
    assert all(not s.ignore_eos and s.max_tokens == 64 for s in gsp(cfg, vocab, seed=1))
    assert all(s.ignore_eos for s in gsp(SMALL, vocab, seed=1))
    z = zipf_gsp(ZipfGspConfig(zipf_groups=3, zipf_requests=10), cfg, vocab, seed=1)
    assert all(not s.ignore_eos for s in z) and z.params["ignore_eos"] is False
