"""bench fairness: its settings and figures (the runs themselves: ``token-gateway bench fairness``)."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from gateway_lab.bench.driver import RequestResult
from gateway_lab.bench.fairness import (
    Cell,
    FairnessConfig,
    append_rows,
    fresh_requests_out,
    parse_queue,
    queue_flags,
    request_rows,
    row,
    shares,
    tenant_workload,
    ttft_percentile,
    worker_index,
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


def test_seeds_are_checked() -> None:
    assert FairnessConfig().seeds == [1]
    with pytest.raises(ValueError, match="--seeds"):
        FairnessConfig(seeds=[])


def test_a_worker_is_its_place_in_the_fleet() -> None:
    urls = ["grpc://127.0.0.1:44001", "grpc://127.0.0.1:44002/"]
    assert worker_index("127.0.0.1:44002", urls) == 1
    assert worker_index("grpc://127.0.0.1:44001", urls) == 0
    assert worker_index("w3", ["w0", "w1", "w2", "w3"]) == 3
    assert worker_index("127.0.0.1:4400", urls) == "127.0.0.1:4400"  # not a prefix match: as it came
    assert worker_index(None, urls) is None


def test_request_rows_one_per_request_with_what_each_result_has(tmp_path: Any) -> None:
    cell = Cell("sim-alt", "1:3:512", seed=11)
    served = result(ttft=0.25, start=1.5)
    served.worker_id, served.cached_tokens, served.prompt_tokens = "127.0.0.1:44002", 512, 576

    @dataclasses.dataclass
    class Replayed:  # the replay's outcome: its waits and the policy's reason too
        start_s: float = 2.0
        ok: bool = False
        ttft_s: float | None = None
        latency_s: float | None = None
        prompt_tokens: int = 576
        cached_tokens: int = 0
        worker_id: str | None = "w0"
        admission_s: float | None = 0.125
        gate_s: float | None = None
        reason: str | None = "cache_hit+moved"

    rows = request_rows(cell, "together", {"light": [served], "heavy": [Replayed()]}, ["grpc://127.0.0.1:44001", "grpc://127.0.0.1:44002", "w0"])
    assert [(r["key"], r["index"], r["worker"]) for r in rows] == [("light", 0, 1), ("heavy", 0, 2)]
    assert rows[0] == {
        "fleet": "sim-alt", "queue": "1:3:512", "seed": 11, "run": "together", "key": "light", "index": 0,
        "start_s": 1.5, "ok": True, "ttft_s": 0.25, "latency_s": 1.0, "worker": 1, "prompt_tokens": 576,
        "cached_tokens": 512,
    }  # fmt: skip
    assert rows[1]["ttft_s"] is None and rows[1]["admission_s"] == 0.125 and rows[1]["reason"] == "cache_hit+moved"
    assert "gate_s" not in rows[1]
    path = tmp_path / "requests.jsonl"
    config = FairnessConfig(requests_out=str(path))
    path.write_text("stale\n")
    fresh_requests_out(config)
    append_rows(config.requests_out, rows)
    append_rows(config.requests_out, rows[:1])
    append_rows("", rows)  # no file asked for: nothing
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [*rows, rows[0]]


def test_a_cell_of_another_seed_says_so() -> None:
    assert row(Cell("sim", "1"))[1] == "1"
    assert row(Cell("sim", "1", seed=21))[1] == "1 (seed 21)"
