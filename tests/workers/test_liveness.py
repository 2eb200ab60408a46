"""The liveness probe (workers/liveness.py): one health probe per worker at a time, shared by
every answer that asks; an answered probe is recorded, anything else is no answer."""

from __future__ import annotations

import asyncio

import pytest

from gateway.workers.liveness import answers_probe
from gateway.workers.transport import CallCode, WorkerCallError
from tests.fake_transport import HANG, FakeTransport, fleet


async def _worker(t: FakeTransport):  # type: ignore[no-untyped-def]
    f = await fleet(t)
    t.health_checks = 0  # registration probed it once
    return f.registry.all()[0]


async def test_an_answered_probe_is_recorded_as_evidence() -> None:
    t = FakeTransport("grpc://a:1")
    w = await _worker(t)
    assert w.progress.last_alive_at == 0.0
    assert await answers_probe(w, 1.0)
    assert t.health_checks == 1 and w.progress.last_alive_at > 0.0
    assert w.progress.last_heard_at == w.progress.last_alive_at


@pytest.mark.parametrize("reply", [False, WorkerCallError(CallCode.UNAVAILABLE, "gone"), RuntimeError("channel closed"), HANG])
async def test_anything_but_a_healthy_answer_in_time_is_no_answer(reply: object) -> None:
    t = FakeTransport("grpc://a:1")
    w = await _worker(t)
    t.healthy = reply  # type: ignore[assignment]
    assert not await asyncio.wait_for(answers_probe(w, 0.05), 2.0)
    assert w.progress.last_alive_at == 0.0


async def test_callers_asking_at_once_share_one_probe_and_a_cancelled_one_leaves_it_running() -> None:
    t = FakeTransport("grpc://a:1")
    w = await _worker(t)
    t.healthy = HANG
    first = asyncio.ensure_future(answers_probe(w, 0.1))
    others = [asyncio.ensure_future(answers_probe(w, 0.1)) for _ in range(4)]
    await asyncio.sleep(0)
    first.cancel()
    assert await asyncio.gather(*others) == [False] * 4
    assert t.health_checks == 1
    t.healthy = True  # a later question gets a probe of its own
    assert await answers_probe(w, 0.1) and t.health_checks == 2
