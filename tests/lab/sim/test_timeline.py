"""A simulated worker's per-request timeline: arrival, slot, prefill, and the queue met."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.timeline import Timeline

from .conftest import PROMPT, address, cfg, collect, request


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_entries_record_each_moment_once_and_stay_bounded() -> None:
    tl = Timeline(limit=2, clock=Clock())
    tl.received("a", 100, 2, 300, 0.004)
    tl.admitted("a", 32)
    tl.admitted("a", 64)  # a second admission (another sample) changes nothing
    tl.prefilled("a")
    tl.prefilled("a")
    a = tl.get("a")
    assert a is not None and (a.received, a.admitted, a.prefilled, a.cached) == (1.0, 2.0, 3.0, 32)
    assert (a.prompt, a.ahead_requests, a.ahead_uncached, a.step_left_s) == (100, 2, 300, 0.004)
    tl.received("b", 10, 0, 0, -0.5)  # a step deadline in the past: none running
    b = tl.get("b")
    assert b is not None and b.step_left_s == 0.0 and b.admitted == -1.0
    tl.admitted("nobody", 1)  # unknown ids are ignored
    tl.received("c", 10, 0, 0, 0.0)
    assert len(tl) == 2 and tl.get("a") is None  # the oldest went
    assert tl.get("c") is not None and b.as_dict()["prompt"] == 10


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Timeline(limit=0)


async def test_a_worker_records_its_requests_and_the_queue_they_met() -> None:
    """Two prompts at once on one slot: the second meets the first's uncached prefill,
    waits for its slot, and is admitted after the first's prefill."""
    config = cfg(max_running_requests=1, step_base_s=0.005, prefill_token_s=0.0001, time_scale=1.0)
    async with SimFleet.start(1, config) as fleet:
        w = fleet.workers[0]
        tl = Timeline()
        w.scheduler.timeline = tl
        other = [t + 100 for t in PROMPT]
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            first = asyncio.create_task(collect(stub, request(PROMPT, rid="one", max_new=20)))  # ~0.1 s
            for _ in range(2000):  # until the worker has it
                if tl.get("one") is not None:
                    break
                await asyncio.sleep(0.001)
            await collect(stub, request(other, rid="two", max_new=3))
            await first
        one, two = tl.get("one"), tl.get("two")
        assert one is not None and two is not None
        assert one.ahead_requests == 0 and one.ahead_uncached == 0 and one.prompt == 40
        assert two.ahead_requests == 1 and two.ahead_uncached in (0, 40)  # mid-prefill or already decoding
        assert one.received <= one.admitted <= one.prefilled <= two.admitted <= two.prefilled
        assert two.received <= two.admitted and one.cached == 0
        assert w.scheduler.queued_uncached_tokens() == 0
