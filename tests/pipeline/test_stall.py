"""Stall handling: a started stream (one timer per stream, no false alarms), and a whole answer
asked for unstreamed (its own deadline, checked no later than its check point; a hung or dead
worker is left, a busy one or one that answers its health probe waited for)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.pipeline.dispatch import DispatchConfig, WholeAnswer, open_generate, open_on
from gateway.pipeline.lease import Outcome
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import GatewayTimeoutError
from gateway.workers.h2.call import H2Call
from gateway.workers.transport import CallCode
from gateway.workers.watchdog import Watchdog, WatchdogConfig
from gateway_lab.sim.virtual_clock import run_virtual
from tests.fake_transport import (
    HANG,
    MODEL,
    FakeTransport,
    Later,
    RecordingObserver,
    chunk,
    complete,
    fleet,
    rpc_error,
    settle,
)

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


def test_steady_messages_never_trip_the_timer() -> None:
    """Each gap is under the limit, their sum is well over it: the timer follows the pending
    read. On the virtual clock (time moves only when nothing is ready to run), so the gaps
    are exactly what the script says however long the host stops the process."""

    async def scenario() -> None:
        gaps = [Later(0.015, chunk([i])) for i in range(6)]
        t = FakeTransport("grpc://w1:1").script(chunk([0]), *gaps, Later(0.015, complete([1])))
        loop = asyncio.get_running_loop()
        f, stream = await open_with(t, 0.02)
        began = loop.time()
        got = 0
        while await stream.read() is not None:
            got += 1
        assert got == 8 and stream.lease.outcome is Outcome.OK
        assert loop.time() - began == pytest.approx(0.105)  # over five times the limit in all
        assert t.aborts == [] and f.worker("w1:1").load.in_flight == 0

    run_virtual(scenario())


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


# ------------------------------------------------------------------ whole answers asked for unstreamed
FAST = WatchdogConfig(watchdog_floor_s=0.05, watchdog_default_token_s=0.001, watchdog_learn_alpha=1.0)


def whole_request(rid: str = "w1", max_new_tokens: int = 4) -> pb.GenerateRequest:
    """A whole answer, as a client that does not stream gets it: ``stream`` False."""
    return pb.GenerateRequest(request_id=rid, sampling_params=pb.SamplingParams(max_new_tokens=max_new_tokens))


async def open_whole(  # type: ignore[no-untyped-def]
    *transports: FakeTransport, config: DispatchConfig | None = None, whole: WholeAnswer | None = None,
    pace: WatchdogConfig = FAST, hung: tuple[FakeTransport, ...] = (),
):
    """The fleet, then one whole answer on its way (``hung``: workers whose health probes
    go unanswered from now on, as a hung worker's do)."""
    f = await fleet(*transports)
    for w in f.registry.all():
        w.progress.config = pace
    for t in transports:
        t.health_checks = 0  # registration's probe is not the one the tests count
    for t in hung:
        t.healthy = HANG
    obs = RecordingObserver()
    task = asyncio.ensure_future(open_generate(
        f.router, RouteRequest(token_ids=[1, 2, 3], model=MODEL, request_id="w1"), lambda s: whole_request(),
        prompt_tokens=3, max_new_tokens=4, retry=RetryConfig(max_attempts=3, backoff_base_s=0.0),
        config=config or DispatchConfig(first_token_timeout_s=5.0), observer=obs, whole=whole or WholeAnswer(),
    ))
    return f, obs, task


async def test_a_hung_worker_under_an_unstreamed_call_is_found_and_the_answer_comes_from_another() -> None:
    """The worker says nothing on any call past the answer's deadline and does not answer
    the health probe either: the attempt ends as stalled (Abort sent, the worker out of
    rotation, its slot back) and the request goes to the next worker from scratch; the
    client has seen nothing."""
    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(complete(list(range(7, 17))))
    f, obs, task = await open_whole(a, b, hung=(a,))
    stream = await asyncio.wait_for(task, 2.0)
    assert stream.worker.id == "b:1"
    assert obs.retries == [("a:1", "ANSWER_OVERDUE")]
    await settle()
    sick = f.worker("a:1")
    assert a.calls[0].cancelled and a.aborts == [("w1", "worker stalled")]
    assert not sick.available and sick.breaker.last_reason == "watchdog" and sick.progress.stalls == 1
    assert sick.breaker.consecutive_failures == 1 and a.health_checks == 1
    assert (sick.load.in_flight, sick.load.silent, sick.load.queued_prefill_tokens) == (0, 0, 0)
    msg = await stream.read()
    assert msg is not None and list(msg.complete.output_ids) == list(range(7, 17))
    assert await stream.read() is None
    healthy = f.worker("b:1")
    assert (healthy.load.in_flight, healthy.load.silent) == (0, 0)
    assert healthy.progress.token_s is not None  # its pace, learned from the whole answer


async def test_a_dead_worker_under_an_unstreamed_call_is_left_at_once() -> None:
    """The connection breaks (the worker process died): the call's error ends the wait
    now, not at the deadline."""
    a = FakeTransport("grpc://a:1").script(Later(0.01, rpc_error(CallCode.UNAVAILABLE, "connection lost")))
    b = FakeTransport("grpc://b:1").script(complete([7]))
    f, obs, task = await open_whole(a, b)
    f.worker("a:1").progress.config = WatchdogConfig(watchdog_floor_s=30.0)  # its deadline far away
    stream = await asyncio.wait_for(task, 5.0)  # long before that deadline
    assert stream.worker.id == "b:1" and obs.retries == [("a:1", "UNAVAILABLE")]
    assert f.worker("a:1").load.silent == 0
    await stream.abort()


async def test_a_busy_worker_is_waited_for_past_the_deadline() -> None:
    """Past the deadline, a worker that keeps answering its other calls is busy, not hung:
    the answer is waited for, and it comes."""
    a = FakeTransport("grpc://a:1").script(Later(0.3, complete([5, 6])))
    f, obs, task = await open_whole(a)
    busy = f.worker("a:1")
    while not task.done():
        busy.progress.message(time.monotonic())  # another call's message
        await asyncio.sleep(0.02)
    stream = task.result()
    assert stream.worker.id == "a:1" and obs.retries == []
    assert busy.available
    await stream.abort()


async def test_a_busy_worker_is_not_waited_for_past_the_last_resort_cap() -> None:
    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(complete([1]))
    f, obs, task = await open_whole(a, b, config=DispatchConfig(first_token_timeout_s=0.2))
    busy = f.worker("a:1")
    while not task.done():
        busy.progress.message(time.monotonic())
        await asyncio.sleep(0.02)
    stream = task.result()
    assert stream.worker.id == "b:1" and obs.retries == [("a:1", "FIRST_TOKEN_TIMEOUT")]
    assert busy.available  # busy, not hung: it stays in rotation
    await stream.abort()


async def test_the_watchdog_leaves_unstreamed_calls_out_and_its_verdict_still_moves_them() -> None:
    """A worker holding only unstreamed calls is silent by design: the watchdog does not
    call it stalled. When its streamed calls stall, the verdict moves the unstreamed ones too."""
    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(complete([1]))
    f, obs, task = await open_whole(a, b, config=DispatchConfig(first_token_timeout_s=5.0))
    sick = f.worker("a:1")
    sick.progress.config = WatchdogConfig(watchdog_floor_s=30.0)  # its own deadline far away
    for _ in range(100):
        if sick.progress.live:
            break
        await asyncio.sleep(0)
    assert sick.load_figures() == (0, 3)  # not judged: silent by design
    dog = Watchdog(f.registry.all, WatchdogConfig(watchdog_floor_s=0.01))
    assert dog.check(time.monotonic() + 60.0) == []
    sick.load.silent -= 1  # as if it were a streamed call: now it is judged, and stalled
    try:
        assert dog.check(time.monotonic() + 60.0) == ["a:1"]
    finally:
        sick.load.silent += 1
    stream = await asyncio.wait_for(task, 2.0)
    assert stream.worker.id == "b:1" and obs.retries == [("a:1", "WATCHDOG")]
    assert (sick.load.in_flight, sick.load.silent) == (0, 0)
    await stream.abort()


async def test_a_quiet_worker_that_answers_its_probe_is_waited_for() -> None:
    """Nothing else runs on the worker, so nothing is heard past the deadline; it answers
    its health probe (a real SGLang probe is a generation through the same scheduler):
    alive, so the answer is waited for, and it comes. One probe per check point."""
    a = FakeTransport("grpc://a:1").script(Later(0.4, complete([5, 6])))
    f, obs, task = await open_whole(a)
    stream = await asyncio.wait_for(task, 3.0)
    assert stream.worker.id == "a:1" and obs.retries == []
    w = f.worker("a:1")
    assert w.available and w.progress.stalls == 0
    assert 1 <= a.health_checks <= 0.4 / FAST.watchdog_floor_s + 1
    assert w.progress.last_alive_at > 0.0
    await stream.abort()


async def test_an_uncapped_answer_is_checked_at_its_check_point_not_at_its_deadline() -> None:
    """No max_tokens: its budget is what the context leaves (here 40,000 tokens, a deadline
    of hours at the default pace); a hung worker is still found once unheard for
    ``check_s`` (``--unary-whole-max-s``) and its probe unanswered."""
    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(complete([7]))
    pace = WatchdogConfig(watchdog_floor_s=0.05)  # default pace: 50 ms per token
    assert pace.watchdog_answer_factor * 40_000 * pace.watchdog_default_token_s > 3600
    started = time.monotonic()
    f, obs, task = await open_whole(a, b, whole=WholeAnswer(budget=40_000, check_s=0.1), pace=pace, hung=(a,))
    stream = await asyncio.wait_for(task, 3.0)
    assert time.monotonic() - started < 2.0
    assert stream.worker.id == "b:1" and obs.retries == [("a:1", "ANSWER_OVERDUE")]
    assert not f.worker("a:1").available and a.aborts == [("w1", "worker stalled")]
    await stream.abort()


async def test_a_long_answer_that_keeps_its_worker_alive_outlasts_the_first_token_timeout() -> None:
    """The last resort for a whole answer is its deadline when that is longer than
    --first-token-timeout-s: a long uncapped answer on a live worker is not cut there."""
    a = FakeTransport("grpc://a:1").script(Later(0.5, complete(list(range(40)))))
    _, obs, task = await open_whole(
        a, config=DispatchConfig(first_token_timeout_s=0.1), whole=WholeAnswer(budget=40_000, check_s=0.1),
    )
    stream = await asyncio.wait_for(task, 3.0)
    assert stream.worker.id == "a:1" and obs.retries == [] and a.health_checks >= 1
    await stream.abort()


async def test_a_probe_that_fails_while_other_calls_progress_is_not_a_stall() -> None:
    """The probe went unanswered but the worker's other calls sent messages meanwhile: busy
    (its probe queued behind them), not hung."""
    a = FakeTransport("grpc://a:1").script(Later(0.8, complete([5, 6])))
    pace = WatchdogConfig(watchdog_floor_s=0.5, watchdog_default_token_s=0.001, watchdog_learn_alpha=1.0)
    f, obs, task = await open_whole(a, whole=WholeAnswer(check_s=0.05), pace=pace, hung=(a,))
    busy = f.worker("a:1")
    for _ in range(300):  # until the check point asks its probe (which will go unanswered)
        if a.health_checks:
            break
        await asyncio.sleep(0.01)
    assert a.health_checks == 1 and not task.done()
    while not task.done():
        busy.progress.message(time.monotonic())  # other calls' messages, during the probe and after
        await asyncio.sleep(0.01)
    stream = task.result()
    assert stream.worker.id == "a:1" and obs.retries == [] and busy.available
    await stream.abort()


async def test_an_answer_before_the_first_check_makes_no_task_for_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common case costs no task: the read runs in the request's own task and the checks
    only start (as a task of their own) once the first check's time is up."""
    a = FakeTransport("grpc://a:1").script(complete([5, 6]))
    _, obs, task = await open_whole(a)
    loop = asyncio.get_running_loop()
    made: list[object] = []
    real = loop.create_task
    monkeypatch.setattr(loop, "create_task", lambda coro, **kw: made.append(coro) or real(coro, **kw))
    stream = await asyncio.wait_for(task, 2.0)
    assert stream.worker.id == "a:1" and obs.retries == [] and a.health_checks == 0
    assert made == []
    await stream.abort()


async def test_a_client_that_leaves_while_the_checks_run_cancels_the_request() -> None:
    """Cancelling the request while its worker is being checked is the client's cancel: the
    request ends cancelled (no retry elsewhere, no stall verdict), the call is stopped and
    its slot freed."""
    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(complete([7]))
    f, obs, task = await open_whole(a, b, whole=WholeAnswer(check_s=0.05), hung=(a,))
    await asyncio.sleep(0.08)  # past the first check point: the checks (a probe that hangs) run
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle()
    sick = f.worker("a:1")
    assert obs.retries == [] and a.calls[0].cancelled and sick.progress.stalls == 0
    assert (sick.load.in_flight, sick.load.silent) == (0, 0)


@dataclass
class H2Transport(FakeTransport):
    """A worker whose Generate calls are the gateway's own HTTP/2 calls, fed by the test."""

    h2: list[H2Call] = field(default_factory=list)
    sent: asyncio.Event = field(default_factory=asyncio.Event)

    def generate(self, request: pb.GenerateRequest, *, timeout: float | None = None) -> H2Call:  # type: ignore[override]
        self.requests.append(request)
        call = H2Call(asyncio.get_running_loop(), pb.GenerateResponse.FromString, 1 << 20)
        call.on_headers([(b":status", b"200")], end_stream=False)
        self.h2.append(call)
        self.sent.set()
        return call


def _arrive(call: H2Call, msg: pb.GenerateResponse) -> None:
    payload = msg.SerializeToString()
    call.on_data(b"\x00" + len(payload).to_bytes(4, "big") + payload, last=True)


async def _open_h2(t: H2Transport, f: Any, stall_s: float) -> tuple[Any, H2Call]:
    """A stream opened on ``t`` (its first message sent), and its call."""
    opening = asyncio.ensure_future(open_on(
        f.router, f.router.select(ROUTE), ROUTE, pb.GenerateRequest(request_id="s1"), prompt_tokens=3, max_new_tokens=64,
        retry=RetryConfig(), config=DispatchConfig(stall_timeout_s=stall_s, first_token_timeout_s=1.0),
    ))
    await t.sent.wait()
    call = t.h2[0]
    _arrive(call, chunk([1]))
    return await opening, call


class _Taker:
    """A push target that takes every chunk."""

    def __init__(self) -> None:
        self.taken: list[pb.GenerateResponse] = []
        self.flushes = 0

    def offer(self, msg: pb.GenerateResponse) -> bool:
        if msg.WhichOneof("response") != "chunk":
            return False
        self.taken.append(msg)
        return True

    def flush(self) -> None:
        self.flushes += 1


async def test_pushed_messages_keep_the_stall_watch_progress_and_lease_going_and_silence_still_stalls() -> None:
    t = H2Transport("grpc://w1:1")
    f = await fleet(t)
    stream, call = await _open_h2(t, f, 0.1)
    assert (await stream.read()).chunk.token_ids == [1]  # type: ignore[union-attr]
    target = _Taker()
    assert stream.listen(target)
    reading = asyncio.ensure_future(stream.read())
    await asyncio.sleep(0)
    progress = f.worker("w1:1").progress
    for i in range(8):  # 0.32 s of messages, each within the limit, their sum three times over it
        await asyncio.sleep(0.04)
        _arrive(call, chunk([2 + i], cached=2 + i))
        assert progress.last_heard_at >= time.monotonic() - 0.01  # each delivery is the worker heard from
    assert not reading.done() and len(target.taken) == 8 and target.flushes == 8
    assert stream.lease.cached_tokens == 9  # the counts reached the lease as read ones do
    with pytest.raises(GatewayTimeoutError, match="sent nothing"):  # then silence: a stall as ever
        await reading
    assert stream.lease.outcome is Outcome.WORKER_FAILED and call.pusher is None
    assert f.worker("w1:1").load.in_flight == 0


async def test_a_push_target_that_fails_fails_the_read() -> None:
    t = H2Transport("grpc://w1:1")
    f = await fleet(t)
    stream, call = await _open_h2(t, f, 5.0)
    await stream.read()

    class Broken(_Taker):
        def offer(self, msg: pb.GenerateResponse) -> bool:
            raise ValueError("cannot decode")

    stream.listen(Broken())
    reading = asyncio.ensure_future(stream.read())
    await asyncio.sleep(0)
    _arrive(call, chunk([2]))
    with pytest.raises(ValueError, match="cannot decode"):
        await reading
    assert call.cancelled
    await stream.abort("finished by gateway")
    assert f.worker("w1:1").load.in_flight == 0


async def test_read_arrived_takes_every_arrived_message_as_read_counts_them_and_leaves_waits_and_stalls_to_read() -> None:
    t = H2Transport("grpc://w1:1")
    f = await fleet(t)
    stream, call = await _open_h2(t, f, 0.1)
    assert [m.chunk.token_ids for m in stream.read_arrived()] == [[1]]  # the first, held
    assert stream.lease.started
    assert stream.read_arrived() == []  # nothing has arrived: read() waits
    progress = f.worker("w1:1").progress
    _arrive(call, chunk([2], cached=3))
    _arrive(call, chunk([3], cached=2))  # the lease keeps the largest, whatever the order
    heard = progress.last_heard_at
    assert [m.chunk.token_ids for m in stream.read_arrived()] == [[2], [3]]  # together, in order
    assert progress.last_heard_at >= heard and stream.lease.cached_tokens == 3  # counted as read() counts
    assert stream.read_arrived() == []
    _arrive(call, chunk([4]))
    stream._stalled = True  # a stall verdict raced the message: read() reports it
    assert stream.read_arrived() == []
    with pytest.raises(GatewayTimeoutError):
        await stream.read()
    assert stream.lease.outcome is Outcome.WORKER_FAILED and f.worker("w1:1").load.in_flight == 0
