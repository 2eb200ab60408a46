"""Request-level evidence of an in-process cell: decisions beside the workers' truth, joined per request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
import pytest

from gateway.policies import close_policy, make_policy
from gateway.policies.base import RouteRequest, WorkerView
from gateway_lab.bench.driver import RequestResult
from gateway_lab.bench.route_trace import (
    BEHIND_TOKENS,
    RouteTracer,
    ahead,
    misjudged,
    request_id,
    summary,
    write_rows,
)
from gateway_lab.sim.timeline import Timeline


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeScheduler:
    """What the tracer reads of a simulated worker's scheduler."""

    num_waiting: int = 0
    num_running: int = 0
    uncached: int = 0
    timeline: Timeline | None = None

    def queued_uncached_tokens(self) -> int:
        return self.uncached


@dataclass
class FakeWorker:
    url: str
    scheduler: FakeScheduler = field(default_factory=FakeScheduler)


def views(queued: tuple[int, int]) -> list[WorkerView]:
    return [
        WorkerView("w0", "grpc://127.0.0.1:1", in_flight=1, queued_prefill_tokens=queued[0], page_size=16),
        WorkerView("w1", "grpc://127.0.0.1:2", in_flight=0, queued_prefill_tokens=queued[1], page_size=16),
    ]


def test_decisions_are_recorded_with_what_was_seen_and_what_was_true() -> None:
    clock = Clock()
    tracer = RouteTracer(clock=clock)
    fleet = [FakeWorker("grpc://127.0.0.1:1"), FakeWorker("grpc://127.0.0.1:2")]
    tracer.attach(fleet)
    assert all(w.scheduler.timeline is tracer.timelines[f"127.0.0.1:{i + 1}"] for i, w in enumerate(fleet))
    fleet[0].scheduler.num_waiting, fleet[0].scheduler.uncached = 2, 3000
    policy = tracer.policy_maker(lambda role: make_policy(policy="cache_aware", use_polled_loads=False))("regular")
    try:
        ws = views((3000, 0))
        policy.on_workers_changed(ws)
        route = RouteRequest(list(range(1, 65)), request_id=request_id(0))
        decision = policy.select(route, ws)
        assert decision.worker_id == "w1"  # the idle worker: the tracer changes nothing
        record = tracer.decisions["rt-0"]
        assert record["worker"] == "w1" and record["at"] == 100.0 and record["prompt"] == 64
        assert record["url"] == "127.0.0.1:2"
        assert record["seen"]["w0"] == [1, 3000, 3000.0] and record["seen"]["w1"] == [0, 0, 0.0]
        assert record["true"] == {"w0": [2, 3000], "w1": [0, 0]}
        # a retry (a request with workers excluded) keeps the first decision's record
        policy.select(RouteRequest(route.token_ids, request_id="rt-0", exclude=frozenset({"w1"})), ws)
        assert tracer.decisions["rt-0"]["worker"] == "w1"
    finally:
        close_policy(policy)


def test_rows_split_the_ttft_by_the_worker_timeline() -> None:
    clock = Clock()
    tracer = RouteTracer(clock=clock)
    fleet = [FakeWorker("grpc://127.0.0.1:1"), FakeWorker("grpc://127.0.0.1:2")]
    tracer.attach(fleet)
    policy = tracer.policy_maker(lambda role: make_policy(policy="round_robin"))("regular")
    ws = views((0, 0))
    clock.t = 10.002  # decided 2 ms after the run's start (t0 = 10) plus the request's start (0)
    chosen = policy.select(RouteRequest([1, 2, 3], request_id="rt-0"), ws).worker_id
    timeline = tracer.timelines["127.0.0.1:1" if chosen == "w0" else "127.0.0.1:2"]
    clock.t = 10.003
    timeline.received("rt-0", 3, 1, 500, 0.004)
    clock.t = 10.010
    timeline.admitted("rt-0", 0)
    clock.t = 10.030
    timeline.prefilled("rt-0")
    results = [
        RequestResult(0, "g", True, start_s=0.0, ttft_s=0.035, prompt_tokens=3, worker_id=chosen),
        RequestResult(1, "g", False, error="boom", start_s=0.1),  # no decision, no time
    ]
    rows = tracer.rows(results, t0=10.0)
    row = rows[0]
    assert row["id"] == "rt-0" and row["reason"] == "round_robin" and row["chosen"] == chosen
    assert (row["routed_ms"], row["to_worker_ms"], row["wait_ms"], row["prefill_ms"], row["back_ms"]) == (
        2.0, 1.0, 7.0, 20.0, 5.0
    )
    assert row["worker_queue"] == {"requests": 1, "uncached": 500, "step_left_ms": 4.0}
    assert rows[1]["ttft_ms"] is None and "reason" not in rows[1]


def row(ttft: float, reason: str, est: float, true_ahead: int, other_true: int, other_est: float) -> dict:
    return {
        "ttft_ms": ttft, "reason": reason, "chosen": "w0", "wait_ms": ttft / 2, "prefill_ms": ttft / 2,
        "seen": {"w0": [1, 100, est], "w1": [0, 0, other_est]},
        "true": {"w0": [1, true_ahead], "w1": [0, other_true]},
    }  # fmt: skip


def test_summary_names_the_tail_and_what_its_workers_had_queued() -> None:
    rows = [row(10.0, "cache_hit", 0.0, 0, 0, 0.0) for _ in range(98)]
    rows += [row(200.0, "cache_hit", 500.0, 4000, 0, 600.0), row(180.0, "load_balanced", 0.0, 2000, 0, 0.0)]
    rows.append({"ttft_ms": None})  # failed: not timed
    lines = summary(rows, share=0.02)
    assert lines[0].startswith("100 requests; slowest 2 (TTFT 180-200 ms)")
    assert "ttft 190.0 / 13.6" in lines[1] and "wait 95.0 / 6.8" in lines[1]
    assert lines[2] in ("  tail reasons: cache_hit 1, load_balanced 1", "  tail reasons: load_balanced 1, cache_hit 1")
    assert "estimated 250, true at decision 3000" in lines[3] and "otherwise) 2" in lines[3]
    assert f">= {BEHIND_TOKENS} uncached tokens on its worker" in lines[4] and "2 of all (2.0%), 2 of the tail" in lines[4]
    assert summary([]) == ["no timed requests"]


def test_misjudged_and_ahead() -> None:
    assert misjudged(row(1.0, "cache_hit", 500.0, 4000, 0, 600.0))  # the estimate said w0 was lighter
    assert not misjudged(row(1.0, "cache_hit", 700.0, 4000, 0, 600.0))  # the estimate saw it heavier
    assert not misjudged(row(1.0, "cache_hit", 0.0, 0, 0, 0.0))  # nothing ahead anywhere
    assert not misjudged({"ttft_ms": 1.0})
    assert ahead(row(1.0, "x", 0.0, 1234, 0, 0.0)) == 1234 and ahead({}) == 0
    # what the request met on arrival, when its worker kept a timeline, is the truth that counts
    assert ahead({**row(1.0, "x", 0.0, 1234, 0, 0.0), "worker_queue": {"uncached": 77}}) == 77


def test_rows_are_appended_as_json_lines(tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    write_rows(path, [{"index": 0}], fleet="sim", policy="p")
    write_rows(path, [{"index": 1}], fleet="sim", policy="q")
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert lines == [{"fleet": "sim", "policy": "p", "index": 0}, {"fleet": "sim", "policy": "q", "index": 1}]


def _block(seconds: float) -> None:
    """A synchronous call that holds the event loop's thread (what a stall is)."""
    import time

    time.sleep(seconds)


async def test_the_stall_watch_sees_a_blocked_loop_and_a_collection() -> None:
    import gc

    from gateway_lab.bench.route_trace import StallWatch, overlapping

    watch = StallWatch(min_s=0.02, period_s=0.002)
    watch.start()
    try:
        await asyncio.sleep(0.01)
        _block(0.06)  # the loop cannot run: its heartbeat wakes late
        await asyncio.sleep(0.01)
        watch.min_s = 0.0  # every collection counts from here
        gc.collect()
    finally:
        await watch.stop()
    kinds = {e[0] for e in watch.events}
    assert kinds == {"late", "gc"}
    late = [e for e in watch.events if e[0] == "late"]
    assert any(e[3] >= 0.04 for e in late)
    assert any(e[0] == "gc" and e[1] == 2 for e in watch.events)  # gc.collect() is a full collection
    assert watch._on_gc not in gc.callbacks  # stop() lets go of the collector
    lines = watch.lines()
    assert lines[0].startswith("gc: ") and "generations [" in lines[0] and lines[1].startswith("late: 1 of")
    assert StallWatch().lines() == ["no stall of 20 ms or more"]
    # the stall inside a request's wait for its first token
    start = late[0][2]
    row = {"start_s": start - 1.0 - 0.01, "ttft_ms": 1000.0}  # from 10 ms before the stall, 1 s long
    assert overlapping(row, 1.0, late[:1]) == pytest.approx(late[0][3])
    assert overlapping({"start_s": 0.0, "ttft_ms": None}, 1.0, late) == 0.0


def test_rows_count_the_stalls_a_request_waited_through() -> None:
    from gateway_lab.bench.route_trace import StallWatch

    tracer = RouteTracer(clock=Clock())
    tracer.watch = StallWatch(events=[("late", -1, 10.010, 0.020), ("gc", 2, 10.012, 0.015), ("late", -1, 11.0, 0.5)])
    rows = tracer.rows([RequestResult(0, "g", True, start_s=0.0, ttft_s=0.05)], t0=10.0)
    assert rows[0]["stalled_ms"] == 20.0 and rows[0]["gc_ms"] == 15.0
