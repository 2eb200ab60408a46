"""Report math on hand-built runs, the table, the JSON and the plot."""

from __future__ import annotations

import dataclasses
import json

import pytest
from rich.console import Console

from gateway_lab.bench.driver import RequestResult, RunResult
from gateway_lab.bench.plot import plot_comparison
from gateway_lab.bench.report import (
    Spread,
    comparison,
    comparison_table,
    percentile,
    summarize,
    worker_counts,
)
from gateway_lab.bench.results import rich_table


def _ok(i: int, worker: str, prompt: int, cached: int, ttft: float, latency: float) -> RequestResult:
    return RequestResult(index=i, group="g", ok=True, ttft_s=ttft, latency_s=latency,
                         prompt_tokens=prompt, completion_tokens=10, cached_tokens=cached,
                         worker_id=worker)


def _run(label: str = "p") -> RunResult:
    results = [
        _ok(0, "a", 100, 0, 0.10, 1.0),
        _ok(1, "a", 100, 80, 0.02, 0.5),
        _ok(2, "b", 200, 120, 0.04, 0.7),
        RequestResult(index=3, group="g", ok=False, error="HTTP 500: boom", prompt_tokens=999),
    ]
    return RunResult(label=label, workload="w", results=results, wall_s=2.0, planned=5)


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_summary_figures() -> None:
    s = summarize(_run(), ideal_hit_rate=0.75, worker_ids=["a", "b", "c"])
    assert (s.requests, s.ok, s.errors, s.not_sent) == (4, 3, 1, 1)
    assert s.prompt_tokens == 400 and s.cached_tokens == 200 and s.completion_tokens == 30
    assert s.hit_rate == pytest.approx(0.5)  # failed requests do not count
    assert s.ideal_hit_rate == 0.75 and s.worker_hit_rate is None
    assert s.output_tok_s == pytest.approx(15.0)
    assert s.total_tok_s == pytest.approx(215.0)
    assert s.req_s == pytest.approx(1.5)
    assert s.ttft_p50_s == pytest.approx(0.04)
    assert s.latency_p50_s == pytest.approx(0.7)
    assert s.ttft_p99_s == pytest.approx(0.04 + 0.98 * 0.06)
    assert s.ttft_quantiles_s["p50"] == s.ttft_p50_s and s.ttft_quantiles_s["p99"] == s.ttft_p99_s
    assert list(s.ttft_quantiles_s) == ["p10", "p25", "p50", "p75", "p90", "p99"]
    assert s.spread is not None and s.spread.per_worker == {"a": 2, "b": 1, "c": 0}
    assert (s.spread.min, s.spread.max) == (0, 2)
    assert s.spread.cv == pytest.approx((2 / 3) ** 0.5)  # pstdev(2,1,0)=sqrt(2/3), mean 1
    assert s.first_errors == ("HTTP 500: boom",)


def test_worker_counters_take_precedence() -> None:
    run = _run()
    run.worker_counters = {
        "a": {"requests": 3, "prompt_tokens": 300, "cached_tokens": 150},
        "b": {"requests": 1, "prompt_tokens": 100, "cached_tokens": 10},
    }
    assert worker_counts(run) == {"a": 3, "b": 1}
    assert summarize(run).worker_hit_rate == pytest.approx(160 / 400)


def test_spread_edge_cases() -> None:
    assert Spread.of({}) is None
    even = Spread.of({"a": 4, "b": 4})
    assert even is not None and even.cv == 0.0
    assert worker_counts(RunResult("x", "w", [], 1.0, 0)) == {}


def test_table_and_json() -> None:
    a, b = summarize(_run("round_robin"), ideal_hit_rate=0.8), summarize(_run("cache_aware"))
    console = Console(width=160, record=True)
    table = comparison_table([a, b], title="demo")
    console.print(rich_table(table))
    text = console.export_text()
    for needle in ("round_robin", "cache_aware", "cache hit rate", "50.0%", "80.0%", "TTFT p99"):
        assert needle in text
    assert table.header == ("figure", "round_robin", "cache_aware") and table.labels == 1
    assert table.best == frozenset()  # equal runs: nothing is best
    faster = comparison_table([a, dataclasses.replace(b, output_tok_s=2 * b.output_tok_s)])
    assert faster.best == {([r[0] for r in faster.rows].index("output tok/s"), 2)}
    result = comparison([a, b], "demo", workload={"G": 1})
    data = json.loads(json.dumps(result.to_json()))
    assert [r["label"] for r in data["runs"]] == ["round_robin", "cache_aware"]
    assert data["runs"][0]["hit_rate"] == 0.5 and "ttfts_s" not in data["runs"][0]
    assert data["workload"] == {"G": 1}


def test_plot_writes_a_png(tmp_path) -> None:
    a, b = summarize(_run("round_robin"), ideal_hit_rate=0.8), summarize(_run("prefix_hash"))
    path = plot_comparison([a, b], tmp_path / "cmp.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
