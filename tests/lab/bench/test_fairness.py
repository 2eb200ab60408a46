"""bench fairness: its settings and figures (the runs themselves: ``token-gateway bench fairness``)."""

from __future__ import annotations

import math

import pytest

from gateway_lab.bench.driver import RequestResult
from gateway_lab.bench.fairness import (
    FairnessConfig,
    parse_queue,
    queue_flags,
    shares,
    tenant_workload,
    ttft_percentile,
)
from gateway_lab.bench.workloads import Vocab


def result(ok: bool = True, ttft: float | None = 0.1, start: float = 0.0, latency: float = 1.0) -> RequestResult:
    return RequestResult(index=0, group="g", ok=ok, ttft_s=ttft, start_s=start, latency_s=latency)


def test_queue_settings() -> None:
    assert parse_queue("off") == (-1, 0, 0)
    assert parse_queue("0") == (0, 0, 0)
    assert parse_queue("2:1") == (2, 1, 0)
    assert parse_queue("1:1:1024") == (1, 1, 1024)
    for bad in ["-1", "x", "1:-1", "1:y", "1:1:-5", "1:1:1:1"]:
        with pytest.raises(ValueError, match="--queues"):
            parse_queue(bad)
    assert parse_queue("1:3:512+gate-share-first") == (1, 3, 512)
    assert queue_flags("1:3:512+gate-share-first") == ["--gate-share-first"]
    assert queue_flags("1:3") == []
    for bad in ["1+", "1+--x", "1+a b", "1+a;b"]:
        with pytest.raises(ValueError, match="serve flag"):
            queue_flags(bad)
    with pytest.raises(ValueError):
        FairnessConfig(queues=["sometimes"])
    with pytest.raises(ValueError):
        FairnessConfig(queues=["1+"])
    with pytest.raises(ValueError):
        FairnessConfig(share_weights=[1.0])


def test_a_request_without_a_first_token_counts_as_infinitely_slow() -> None:
    rs = [result(ttft=t / 10) for t in range(1, 10)] + [result(ok=False, ttft=None)]
    assert ttft_percentile(rs, 50) == pytest.approx(0.5)
    assert math.isinf(ttft_percentile(rs, 99))
    assert math.isnan(ttft_percentile([], 50))


def test_shares_over_weights_count_completions_in_the_window() -> None:
    results = {
        "a": [result(start=s, latency=1.0) for s in range(10)],  # completes at 1 .. 10
        "b": [result(start=s, latency=1.0) for s in range(0, 10, 2)] + [result(ok=False, start=3.0)],
    }
    # In [2, 10): a completes 8 (at 2..9), b 4 (at 3, 5, 7, 9): 2/3 and 1/3 of the requests.
    got = shares(results, {"a": 2.0, "b": 1.0}, 2.0, 10.0)
    assert got == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}
    even = shares(results, {"a": 1.0, "b": 1.0}, 2.0, 10.0)
    assert even["a"] == pytest.approx(4 / 3) and even["b"] == pytest.approx(2 / 3)


def test_a_keys_workload_has_its_rate_and_its_own_prefixes() -> None:
    config = FairnessConfig(duration_s=10.0, groups=4, system_tokens=32, question_tokens=8, output_tokens=4)
    vocab = Vocab.from_tokenizer_dir()
    light = tenant_workload(config, vocab, 2.0, seed=1)
    other = tenant_workload(config, vocab, 2.0, seed=2)
    assert len(light.requests) == 20
    assert all(r.arrival_s is not None for r in light.requests)
    firsts = {tuple(r.prompt_token_ids[:32]) for r in light.requests if r.prompt_token_ids}
    assert firsts.isdisjoint({tuple(r.prompt_token_ids[:32]) for r in other.requests if r.prompt_token_ids})
