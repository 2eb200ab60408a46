"""Traces as workloads: Mooncake blocks -> token runs, plain JSONL prompts, scaling, ideals."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from gateway_lab.bench.traces import (
    BlockTokens,
    TraceConfig,
    bounded_ideal_hit_rate,
    load_trace_workload,
    optimal_bounded_hit_rate,
    trace_ideals,
)
from gateway_lab.bench.workloads import Vocab, ideal_hit_rate

# the public traces live beside the repository (``../shared/traces``), or where the variable says
TRACE_DIR = Path(os.environ.get("TOKEN_GATEWAY_TRACE_DIR") or Path(__file__).resolve().parents[4] / "shared" / "traces")
SHARED_TRACE = TRACE_DIR / "conversation_trace.jsonl"


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.from_tokenizer_dir()


def write_lines(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


MOONCAKE = [
    {"timestamp": 1000, "input_length": 1200, "output_length": 500, "hash_ids": [0, 1, 2]},
    {"timestamp": 3000, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2, 3]},
    {"timestamp": 5000, "input_length": 600, "output_length": 20, "hash_ids": [0, 9]},
]


def test_equal_block_ids_give_equal_token_prefixes_scaled_and_capped(tmp_path, vocab) -> None:
    path = write_lines(tmp_path / "t.jsonl", MOONCAKE)
    cfg = TraceConfig(block_tokens=8, source_block_tokens=512, max_output_tokens=16, time_scale=0.5)
    wl = load_trace_workload(path, cfg, vocab)
    a, b, c = (s.prompt_token_ids for s in wl)
    assert a is not None and b is not None and c is not None
    # 1200 tokens at 8/512 -> 19 (ceil), 1500 -> 24, 600 -> 10
    assert (len(a), len(b), len(c)) == (19, 24, 10)
    assert b[:19] == a and c[:8] == a[:8] and c[8:] != a[8:10]
    assert [s.max_tokens for s in wl] == [8, 1, 1]  # 500 * 8/512 = 7.8 -> 8; 10 -> 1 (at least one)
    assert [s.arrival_s for s in wl] == [0.0, 1.0, 2.0]  # rebased to the first, x0.5
    assert all(t in vocab.texts for t in a)  # ordinary word tokens: text round-trips to the same ids
    capped = load_trace_workload(path, TraceConfig(block_tokens=8, max_prompt_tokens=12, max_output_tokens=4), vocab)
    assert max(len(s.prompt_token_ids or ()) for s in capped) == 12
    assert max(s.max_tokens for s in capped) <= 4


def test_block_runs_are_fixed_per_id_and_seed(vocab) -> None:
    one, again, other = BlockTokens(vocab, 16), BlockTokens(vocab, 16), BlockTokens(vocab, 16, seed=1)
    assert one(7) == again(7) and one(7) != one(8) and one(7) != other(7) and len(one(7)) == 16


def test_first_requests_only_and_closed_loop(tmp_path, vocab) -> None:
    path = write_lines(tmp_path / "t.jsonl", MOONCAKE)
    wl = load_trace_workload(path, TraceConfig(trace_requests=2, time_scale=0), vocab)
    assert len(wl) == 2 and all(s.arrival_s is None for s in wl)
    assert wl.params["format"] == "mooncake" and wl.params["requests"] == 2


def test_a_later_window_skips_the_first_requests_and_rebases_its_times(tmp_path, vocab) -> None:
    path = write_lines(tmp_path / "t.jsonl", MOONCAKE)
    whole = load_trace_workload(path, TraceConfig(block_tokens=4), vocab)
    later = load_trace_workload(path, TraceConfig(block_tokens=4, trace_offset=1, trace_requests=1), vocab)
    assert len(later) == 1 and later.params["trace_offset"] == 1
    assert later.requests[0].prompt_token_ids == whole.requests[1].prompt_token_ids
    assert later.requests[0].arrival_s == 0.0  # the window starts at its own first request
    with pytest.raises(ValueError):
        TraceConfig(trace_offset=-1)
    with pytest.raises(ValueError, match="no requests"):
        load_trace_workload(path, TraceConfig(trace_offset=len(MOONCAKE)), vocab)


def test_qwen_bailian_lines_have_their_times_in_seconds(tmp_path, vocab) -> None:
    """Alibaba's Qwen-Bailian traces: Mooncake's fields plus chat ids, 16-token blocks and
    seconds; a chat's next turn repeats its blocks, so its prompt extends the first."""
    qwen = [
        {"chat_id": 0, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 8,
         "type": "text", "turn": 1, "hash_ids": [10, 11, 12]},
        {"chat_id": 1, "parent_chat_id": 0, "timestamp": 2.0, "input_length": 70, "output_length": 3,
         "type": "text", "turn": 2, "hash_ids": [10, 11, 12, 13, 14]},
    ]
    path = write_lines(tmp_path / "q.jsonl", qwen)
    wl = load_trace_workload(path, TraceConfig(block_tokens=4, source_block_tokens=16), vocab)
    first, second = (s.prompt_token_ids or () for s in wl)
    assert [s.arrival_s for s in wl] == [0.0, 1.5 * 0.25]  # seconds, rebased, x0.25
    assert (len(first), len(second)) == (10, 18) and second[:10] == first  # 40 * 4/16, 70 * 4/16 (ceil)


def test_plain_jsonl_prompts_with_timestamps(tmp_path, vocab) -> None:
    path = write_lines(tmp_path / "p.jsonl", [
        {"timestamp": 500, "prompt": "hello there", "output_length": 100},
        {"timestamp": 1500, "input_ids": [5, 6, 7, 8], "max_tokens": 3},
        {"t": 2.0, "prompt_token_ids": [5, 6], "max_tokens": 2},
    ])  # fmt: skip
    wl = load_trace_workload(path, TraceConfig(max_output_tokens=50, max_prompt_tokens=3, time_scale=1.0), vocab)
    first, second, third = wl.requests
    assert first.prompt == "hello there" and first.max_tokens == 50
    assert second.prompt_token_ids == (5, 6, 7) and second.max_tokens == 3
    assert [s.arrival_s for s in wl] == [0.0, 1.0, 1.5]
    assert third.prompt_token_ids == (5, 6) and wl.params["format"] == "plain"


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"timestamp": 0, "input_length": 10, "hash_ids": []}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 10, "hash_ids": ["x"]}', "hash_ids"),
        ("[1, 2]", "JSON object"),
        ("{not json", "t.jsonl:1"),
        ('{"timestamp": 0, "prompt": "x", "max_tokens": 1, "colour": 3}', "unknown trace fields"),
    ],
)
def test_bad_lines_are_refused_with_their_line_number(tmp_path, vocab, line, message) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        load_trace_workload(path, TraceConfig(), vocab)
    with pytest.raises(ValueError, match="time_scale"):
        TraceConfig(time_scale=-1)


def test_bounded_ideal_is_the_unbounded_one_with_room_and_lower_without() -> None:
    a, b, c = [1] * 32 + [2] * 32, [3] * 64, [4] * 64
    prompts = [a, a[:48] + [9] * 16, b, c, a, b]
    big = bounded_ideal_hit_rate(prompts, 16, 10_000)
    assert big == pytest.approx(ideal_hit_rate(prompts, 16))
    # room for 4 pages: a's 4 pages are pushed out by b and c before a comes back
    assert bounded_ideal_hit_rate(prompts, 16, 64) < big
    # a prefix outlives its extensions: after [a, a'] the shared 3 pages are the most recent
    assert bounded_ideal_hit_rate([a, a[:48] + [9] * 16, a[:48] + [8] * 16], 16, 64) == pytest.approx(
        (48 + 48) / (64 * 3)
    )
    with pytest.raises(ValueError):
        bounded_ideal_hit_rate(prompts, 16, 8)


def test_optimal_ideal_is_the_unbounded_one_with_room_and_beats_lru_when_it_thrashes() -> None:
    a, b, c = [1] * 64, [2] * 64, [3] * 64
    cycle = [a, b, c] * 3
    assert optimal_bounded_hit_rate(cycle, 16, 10_000) == pytest.approx(ideal_hit_rate(cycle, 16))
    # room for two of the three prompts: LRU always drops the one needed next, the optimum
    # drops the one needed furthest: four of the six returns hit
    assert bounded_ideal_hit_rate(cycle, 16, 128) == 0.0
    assert optimal_bounded_hit_rate(cycle, 16, 128) == pytest.approx(4 * 64 / (9 * 64))
    with pytest.raises(ValueError):
        optimal_bounded_hit_rate(cycle, 16, 8)


def _split_lru_hits(prompts: list[list[int]], route: list[int], page: int, capacity: int) -> float:
    """Prefix hits of two separate LRU page caches of ``capacity`` each, prompt i on cache route[i]."""
    caches: list[list[tuple[int, ...]]] = [[], []]
    total = cached = 0
    for ids, w in zip(prompts, route, strict=True):
        keys = [tuple(ids[: (k + 1) * page]) for k in range(len(ids) // page)]
        total += len(ids)
        for k in keys:
            if k not in caches[w]:
                break
            cached += page
        for k in reversed(keys):
            if k in caches[w]:
                caches[w].remove(k)
            caches[w].append(k)
        del caches[w][: max(0, len(caches[w]) - capacity // page)]
    return cached / total


def test_no_routing_over_two_lru_workers_beats_the_optimal_ideal_of_their_pooled_kv() -> None:
    rng = random.Random(5)
    beaten_lru = 0
    for _ in range(40):
        stems = [[rng.randrange(1, 4) for _ in range(16 * rng.randrange(1, 4))] for _ in range(3)]
        prompts = [rng.choice(stems) + [rng.randrange(4, 6) for _ in range(16 * rng.randrange(0, 3))] for _ in range(7)]
        best = max(_split_lru_hits(prompts, [(r >> i) & 1 for i in range(7)], 16, 64) for r in range(1 << 7))
        assert best <= optimal_bounded_hit_rate(prompts, 16, 128) + 1e-12
        beaten_lru += best > bounded_ideal_hit_rate(prompts, 16, 128) + 1e-12
    assert beaten_lru > 0  # a router over split caches can beat the pooled LRU: it is no ceiling


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="the public trace is not next to the repository")
def test_the_conversation_trace_loads_and_every_request_shares_its_first_block(vocab) -> None:
    wl = load_trace_workload(SHARED_TRACE, TraceConfig(trace_requests=300), vocab)
    firsts = {s.prompt_token_ids[:32] for s in wl if s.prompt_token_ids}
    assert len(wl) == 300 and len(firsts) == 1
    ideals = trace_ideals(wl, 16, 8 * 50_000)
    assert 0.0 < ideals.fleet_kv <= ideals.fleet_kv_optimal <= ideals.unbounded < 1.0
