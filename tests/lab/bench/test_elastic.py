"""`token-gateway bench elastic`: time to fair share, hit rate windows, and a toy 2 -> 4 -> 3 run."""

from __future__ import annotations

import argparse
import json

import pytest

from gateway.cli import build_parser
from gateway_lab.bench import elastic
from gateway_lab.bench.driver import RequestResult

from .test_trace_bench import mooncake


def result(start: float, worker: str, prompt: int = 100, cached: int = 0, ok: bool = True) -> RequestResult:
    return RequestResult(index=0, group="", ok=ok, start_s=start, worker_id=worker, prompt_tokens=prompt,
                         cached_tokens=cached)


def test_time_to_fair_share_counts_the_new_workers_in_a_trailing_window() -> None:
    # a, b from the start; c joins at 10 s and gets one request a second from 14 s on
    results = [result(t / 2, w) for t in range(0, 60) for w in ("a", "b")]
    results += [result(float(t), "c") for t in range(14, 30)]
    fair = elastic.time_to_fair_share(results, {"c"}, {"a", "b", "c"}, 10.0, window_s=4.0, fair_share=0.5, until=30)
    # window [14, 18) at t = 18: c has 4, a and b 8 each: mean 6.7, half of it is 3.3
    assert fair == 8.0
    assert elastic.time_to_fair_share(results, {"c"}, {"a", "b", "c"}, 10.0, window_s=4.0, fair_share=0.5,
                                      until=15) is None


def test_hit_rate_of_a_window_and_of_some_workers() -> None:
    results = [result(1.0, "a", 100, 50), result(2.0, "b", 100, 0), result(3.0, "a", 100, 100, ok=False)]
    assert elastic.hit_rate(results, 0, 5) == 0.25
    assert elastic.hit_rate(results, 0, 5, {"a"}) == 0.5
    assert elastic.hit_rate(results, 5, 9) is None


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "elastic", *argv])


@pytest.mark.slow  # two runs, each a fresh fleet and gateway, workers added and removed under load
def test_workers_join_and_leave_under_load_without_errors(tmp_path) -> None:
    trace = mooncake(tmp_path / "t.jsonl", conversations=10, turns=3)
    out = tmp_path / "e.json"
    args = _args("--trace", str(trace), "--policies", "cache_aware", "--start-workers", "2", "--peak-workers", "4",
                 "--end-workers", "3", "--add-at-s", "0.5", "--remove-at-s", "1.5", "--time-scale-sim", "0",
                 "--block-tokens", "16", "--time-scale", "1", "--json", str(out))  # 30 requests over 2.9 s
    assert elastic.run(args) == 0
    data = json.loads(out.read_text())
    runs = {r["elastic"]: r for r in data["runs"]}
    assert len(runs[True]["added"]) == 2 and len(runs[True]["removed"]) == 1
    assert runs[True]["summary"]["ok"] == runs[False]["summary"]["ok"] == 30
    assert runs[False]["added"] == [] and data["rows"][0]["errors (elastic)"] == "0"


def test_bad_fleet_sizes_are_refused(tmp_path) -> None:
    with pytest.raises(SystemExit, match="bad arguments"):
        elastic.run(_args("--trace", str(tmp_path / "t.jsonl"), "--end-workers", "9"))
