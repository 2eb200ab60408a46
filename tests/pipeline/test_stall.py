"""Stall handling of a started stream: one timer per stream, no false alarms."""

from __future__ import annotations

import pytest

from gateway.pipeline.dispatch import DispatchConfig, open_on
from gateway.pipeline.lease import Outcome
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import GatewayTimeoutError
from tests.fake_transport import HANG, MODEL, FakeTransport, Later, chunk, complete, fleet, settle

ROUTE = RouteRequest(token_ids=[1, 2, 3], model=MODEL, request_id="s1")


async def open_with(t: FakeTransport, stall_s: float):  # type: ignore[no-untyped-def]
    f = await fleet(t)
    stream = await open_on(
        f.router, f.router.select(ROUTE), ROUTE, pb.GenerateRequest(request_id="s1"), prompt_tokens=3, max_new_tokens=4,
        retry=RetryConfig(), config=DispatchConfig(stall_timeout_s=stall_s, first_token_timeout_s=1.0),
    )
    return f, stream


async def test_silent_worker_is_cut_off_and_aborted() -> None:
    t = FakeTransport("grpc://w1:1").script(chunk([1]), HANG)
    f, stream = await open_with(t, 0.02)
    await stream.read()
    with pytest.raises(GatewayTimeoutError, match="sent nothing"):
        await stream.read()
    await settle()
    assert t.calls[0].cancelled and t.aborts == [("s1", "stalled")]
    assert stream.lease.outcome is Outcome.WORKER_FAILED
    w = f.worker("w1:1")
    assert w.load.in_flight == 0 and w.breaker.consecutive_failures == 1


async def test_steady_messages_never_trip_the_timer() -> None:
    # Each gap is under the limit, their sum is well over it: the timer follows the pending read.
    gaps = [Later(0.01, chunk([i])) for i in range(6)]
    t = FakeTransport("grpc://w1:1").script(chunk([0]), *gaps, Later(0.01, complete([1])))
    f, stream = await open_with(t, 0.025)
    got = 0
    while await stream.read() is not None:
        got += 1
    assert got == 8 and stream.lease.outcome is Outcome.OK
    assert t.aborts == [] and f.worker("w1:1").load.in_flight == 0


async def test_a_message_racing_the_verdict_still_ends_the_stream_as_stalled() -> None:
    t = FakeTransport("grpc://w1:1").script(chunk([1]), Later(0.005, chunk([2])))
    f, stream = await open_with(t, 0.02)
    await stream.read()
    stream._stalled = True  # the timer fired between the message's arrival and read()'s return
    with pytest.raises(GatewayTimeoutError):
        await stream.read()
    assert stream.lease.outcome is Outcome.WORKER_FAILED and f.worker("w1:1").load.in_flight == 0


async def test_cancel_of_the_reader_is_not_a_stall() -> None:
    import asyncio

    t = FakeTransport("grpc://w1:1").script(chunk([1]), HANG)
    f, stream = await open_with(t, 5.0)
    await stream.read()
    reader = asyncio.ensure_future(stream.read())
    await settle()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert not stream.closed  # the owner (Generation / the door) decides: here it aborts
    await stream.abort("client gone")
    assert stream.lease.outcome is Outcome.OK and f.worker("w1:1").load.in_flight == 0


async def test_watchdog_kill_turns_a_first_token_wait_into_a_retry_elsewhere() -> None:
    import asyncio

    from gateway.pipeline.dispatch import DispatchConfig, open_generate
    from gateway.pipeline.retry import RetryConfig
    from gateway.policies.base import RouteRequest
    from gateway.proto import sglang_scheduler_pb2 as pb
    from tests.fake_transport import HANG, MODEL, FakeTransport, RecordingObserver, chunk, fleet

    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(chunk([7]))
    f = await fleet(a, b)
    obs = RecordingObserver()
    task = asyncio.ensure_future(open_generate(
        f.router, RouteRequest(token_ids=[1, 2, 3], model=MODEL, request_id="q1"),
        lambda s: pb.GenerateRequest(request_id="q1"), prompt_tokens=3, max_new_tokens=4,
        retry=RetryConfig(max_attempts=3, backoff_base_s=0.0), config=DispatchConfig(), observer=obs,
    ))
    sick = f.worker("a:1")
    for _ in range(100):
        if sick.progress.live:
            break
        await asyncio.sleep(0)
    assert sick.progress.live == 1
    sick.trip("watchdog")
    assert sick.progress.kill_all() == 1
    stream = await task
    assert stream.worker.id == "b:1"
    assert obs.retries == [("a:1", "WATCHDOG")]
    assert sick.load.in_flight == 0
    await stream.abort()
