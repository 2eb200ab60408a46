"""The lease: every ending of a dispatched request gives back slot, breaker verdict,
policy notification, observer report, watchdog watch and the worker's side of the
call exactly once, whether ended by hand or by leaving its ``async with`` block."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.pipeline.aborts import flush_aborts
from gateway.pipeline.dispatch import AttemptFailed, DispatchConfig, open_on
from gateway.pipeline.lease import Lease, LeaseFailure, Outcome
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import GatewayTimeoutError, WorkerError
from gateway.workers.transport import CallCode, WorkerCallError
from tests.fake_transport import (
    HANG,
    MODEL,
    FakeTransport,
    Fleet,
    RecordingObserver,
    SpyPolicy,
    chunk,
    complete,
    fleet,
    rpc_error,
    settle,
)

FAST = DispatchConfig(request_timeout_s=5.0, first_token_timeout_s=0.05, stall_timeout_s=0.05)
ROUTE = RouteRequest(token_ids=[1, 2, 3, 4], model=MODEL, request_id="r1", max_new_tokens=8)


async def one_worker(predict: int = 0) -> tuple[Fleet, FakeTransport]:
    t = FakeTransport("grpc://w1:1")
    f = await fleet(t, spy=SpyPolicy(predict=predict))
    return f, t


def assert_released_once(f: Fleet, *, success: bool, cached: int = 0) -> None:
    w = f.worker("w1:1")
    assert w.load.in_flight == 0
    assert w.load.queued_prefill_tokens == 0 and w.load.running_decode_tokens == 0
    assert f.spy is not None
    assert f.spy.finished == [("r1", "w1:1", cached, success)]


async def test_lease_takes_everything_on_creation_and_gives_it_back_once() -> None:
    f, _ = await one_worker(predict=2)
    obs = RecordingObserver()
    selection = f.router.select(ROUTE)
    lease = Lease(f.router, selection, ROUTE, prompt_tokens=4, max_new_tokens=8, observer=obs)
    w = f.worker("w1:1")
    assert (w.load.in_flight, w.load.queued_prefill_tokens) == (1, 4)
    assert f.spy is not None and f.spy.dispatched == [("r1", "w1:1")]
    lease.start()
    assert (w.load.queued_prefill_tokens, w.load.running_decode_tokens) == (0, 8)
    lease.report(cached_tokens=3, prompt_tokens=4)
    lease.report(cached_tokens=1, prompt_tokens=0)  # counts are cumulative: the largest stays
    assert lease.end(Outcome.OK) is True
    assert lease.end(Outcome.WORKER_FAILED) is False  # second release does nothing
    assert lease.outcome is Outcome.OK
    assert_released_once(f, success=True, cached=3)
    assert obs.stages == ["relay"]
    assert obs.done == [{
        "model": MODEL, "worker": "w1:1", "predicted": 2, "cached": 3, "success": True,
        "sent_prompt": 4, "reported_prompt": 4,
    }]
    assert w.breaker.consecutive_failures == 0


@pytest.mark.parametrize(
    ("outcome", "breaker_failures", "success"),
    [(Outcome.OK, 0, True), (Outcome.WORKER_FAILED, 1, False), (Outcome.REJECTED, 0, False), (Outcome.CANCELLED, 0, False)],
)
async def test_each_outcome_tells_breaker_and_policy(outcome: Outcome, breaker_failures: int, success: bool) -> None:
    f, _ = await one_worker()
    w = f.worker("w1:1")
    w.breaker.consecutive_failures = 0
    obs = RecordingObserver()
    lease = Lease(f.router, f.router.select(ROUTE), ROUTE, prompt_tokens=4, max_new_tokens=8, observer=obs)
    lease.end(outcome)
    assert_released_once(f, success=success)
    assert w.breaker.consecutive_failures == breaker_failures
    assert obs.done == []  # no output, no relay figures
    assert w.suspect is (outcome is Outcome.WORKER_FAILED)


async def open_one(f: Fleet, obs: RecordingObserver | None = None, config: DispatchConfig = FAST, *, stream: bool = False):  # type: ignore[no-untyped-def]
    return await open_on(
        f.router, f.router.select(ROUTE), ROUTE, pb.GenerateRequest(request_id="r1", stream=stream),
        prompt_tokens=4, max_new_tokens=8, retry=RetryConfig(), config=config,
        observer=obs or RecordingObserver(),
    )


async def test_stream_to_its_end_releases_ok_with_reported_counts() -> None:
    f, t = await one_worker()
    t.script(chunk([5], prompt=4, cached=2), complete([5], prompt=4, cached=2))
    obs = RecordingObserver()
    stream = await open_one(f, obs)
    while await stream.read() is not None:
        pass
    assert stream.closed and stream.lease.outcome is Outcome.OK
    assert stream.lease.reported_prompt_tokens == 4
    assert_released_once(f, success=True, cached=2)
    assert [d["reported_prompt"] for d in obs.done] == [4]
    stream.finished()
    await stream.abort()
    assert len(f.spy.finished) == 1 and t.aborts == []  # type: ignore[union-attr]


async def test_worker_error_mid_stream_counts_against_the_worker() -> None:
    f, t = await one_worker()
    t.script(chunk([5]), rpc_error(CallCode.INTERNAL, "boom"))
    stream = await open_one(f)
    await stream.read()
    with pytest.raises(WorkerError):
        await stream.read()
    assert stream.lease.outcome is Outcome.WORKER_FAILED
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == 1


async def test_client_gone_after_output_aborts_the_worker_request() -> None:
    f, t = await one_worker()
    t.script(chunk([5]), HANG)
    stream = await open_one(f)
    await stream.read()
    await stream.abort("client gone")
    await stream.abort("client gone")  # idempotent
    await settle()
    assert t.calls[0].cancelled and t.aborts == [("r1", "client gone")]
    assert_released_once(f, success=True)


async def test_cancelled_while_waiting_for_the_first_message() -> None:
    f, t = await one_worker()
    t.script(HANG)
    task = asyncio.ensure_future(open_one(f, config=DispatchConfig(first_token_timeout_s=5.0)))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle()
    assert t.calls[0].cancelled and t.aborts == [("r1", "cancelled")]
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == 0  # no verdict on the worker


async def test_eof_without_output_fails_the_attempt() -> None:
    f, t = await one_worker()
    t.script()  # EOF at once
    with pytest.raises(AttemptFailed) as info:
        await open_one(f)
    assert info.value.reason == "EMPTY_STREAM" and info.value.retryable
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == 1


async def test_bad_request_is_rejected_without_blaming_the_worker() -> None:
    f, t = await one_worker()
    t.script(rpc_error(CallCode.INVALID_ARGUMENT, "bad stop"))
    with pytest.raises(AttemptFailed) as info:
        await open_one(f)
    assert not info.value.retryable
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == 0


async def test_first_token_timeout_aborts_and_counts_against_the_worker() -> None:
    f, t = await one_worker()
    t.script(HANG)
    with pytest.raises(AttemptFailed) as info:
        await open_one(f)
    assert isinstance(info.value.error, GatewayTimeoutError) and info.value.reason == "FIRST_TOKEN_TIMEOUT"
    await settle()
    assert t.aborts == [("r1", "first token timeout")]
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == 1


async def test_finished_frees_the_slot_without_an_abort() -> None:
    f, t = await one_worker()
    t.script(complete([5], cached=1), HANG)
    stream = await open_one(f)
    await stream.read()
    stream.finished()
    await settle()
    assert t.aborts == [] and t.calls[0].cancelled
    assert_released_once(f, success=True, cached=1)


async def test_a_cancelled_half_open_trial_does_not_keep_the_worker_out() -> None:
    f, _ = await one_worker()
    w = f.worker("w1:1")
    w.breaker.failure_threshold = 1
    w.breaker.cooldown_s = 0.0
    w.breaker.half_open_probes = 1  # one trial at a time: the trial in flight fills it
    w.record_outcome(False)  # open; the cool-down is over at once
    lease = Lease(f.router, f.router.select(ROUTE), ROUTE, prompt_tokens=4, max_new_tokens=8)  # the half-open trial
    assert not w.available
    lease.end(Outcome.CANCELLED)
    assert w.available


# ------------------------------------------------------------ the lease as a context manager
def lease_on(f: Fleet, obs: RecordingObserver | None = None) -> Lease:
    return Lease(f.router, f.router.select(ROUTE), ROUTE, prompt_tokens=4, max_new_tokens=8, observer=obs or RecordingObserver())


async def test_leaving_the_block_cleanly_ends_the_lease_ok() -> None:
    f, t = await one_worker()
    async with lease_on(f) as lease:
        lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
        lease.start()
        lease.report(cached_tokens=2)
        assert not lease.released
    await settle()
    assert lease.outcome is Outcome.OK and t.aborts == [] and not t.calls[0].cancelled
    assert_released_once(f, success=True, cached=2)


@pytest.mark.parametrize(
    ("code", "outcome", "failures"),
    [(CallCode.UNAVAILABLE, Outcome.WORKER_FAILED, 1), (CallCode.INVALID_ARGUMENT, Outcome.REJECTED, 0)],
)
async def test_a_worker_call_error_out_of_the_block_is_the_workers_verdict(
    code: CallCode, outcome: Outcome, failures: int
) -> None:
    f, t = await one_worker()
    with pytest.raises(WorkerCallError):
        async with lease_on(f) as lease:
            lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
            raise rpc_error(code)
    await settle()
    assert lease.outcome is outcome and t.aborts == []  # the worker ended the call itself
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == failures


async def test_a_lease_failure_carries_its_verdict_and_its_abort() -> None:
    f, t = await one_worker()
    with pytest.raises(LeaseFailure):
        async with lease_on(f) as lease:
            lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
            raise LeaseFailure("silent", abort="stalled")
    await settle()
    assert lease.outcome is Outcome.WORKER_FAILED
    assert t.calls[0].cancelled and t.aborts == [("r1", "stalled")]
    assert_released_once(f, success=False)


@pytest.mark.parametrize("sent", [True, False])
async def test_cancellation_in_the_block_gives_no_verdict_and_aborts_only_what_was_sent(sent: bool) -> None:
    f, t = await one_worker()
    started = asyncio.Event()

    async def body() -> None:
        async with lease_on(f) as lease:
            if sent:
                lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
            started.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(body())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await settle()
    assert t.aborts == ([("r1", "cancelled")] if sent else [])
    assert [c.cancelled for c in t.calls] == ([True] if sent else [])
    assert_released_once(f, success=False)
    assert f.worker("w1:1").breaker.consecutive_failures == 0


async def test_a_handed_over_lease_outlives_the_block_and_ends_once() -> None:
    f, t = await one_worker()
    async with lease_on(f) as lease:
        lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
        kept = lease.hand_over()
    assert not kept.released and f.worker("w1:1").load.in_flight == 1
    assert kept.end(Outcome.OK, abort="client gone", aborted=True) is True
    assert kept.end(Outcome.WORKER_FAILED) is False
    await settle()
    assert t.aborts == [("r1", "client gone")]
    assert_released_once(f, success=True)


async def test_the_watchdog_reaches_the_call_through_the_lease_and_the_end_unwatches() -> None:
    f, t = await one_worker()
    progress = f.worker("w1:1").progress
    with pytest.raises(LeaseFailure):
        async with lease_on(f) as lease:
            lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
            lease.watch()
            assert progress.live == 1
            assert progress.kill_all() == 1
            assert lease.stalled and t.calls[0].cancelled
            raise LeaseFailure("stalled", abort="worker stalled")
    assert progress.live == 0
    assert_released_once(f, success=False)


async def test_a_second_watch_swaps_the_kill_and_a_fired_watch_registers_anew() -> None:
    f, t = await one_worker()
    progress = f.worker("w1:1").progress
    killed: list[str] = []
    async with lease_on(f) as lease:
        lease.sent(t.generate(pb.GenerateRequest(request_id="r1")))
        lease.watch()
        lease.watch(lambda: killed.append("stream"))  # a worker stream took over
        assert progress.live == 1
        assert progress.kill_all() == 1 and killed == ["stream"] and not lease.stalled
        lease.watch(lambda: killed.append("again"))
        assert progress.live == 1
        assert progress.kill_all() == 1 and killed == ["stream", "again"]
    assert progress.live == 0
    assert_released_once(f, success=True)


async def test_the_policy_learns_an_output_through_the_lease() -> None:
    f, _ = await one_worker()
    async with lease_on(f) as lease:
        lease.start()
    lease.output([7, 8])
    assert f.spy is not None and f.spy.outputs == [("r1", "w1:1", [7, 8])]


async def test_an_empty_stream_through_open_on_unwatches_and_releases_once() -> None:
    f, t = await one_worker()
    t.script()  # the end at once
    with pytest.raises(AttemptFailed):
        await open_one(f)
    assert f.worker("w1:1").progress.live == 0
    assert_released_once(f, success=False)


async def test_a_request_past_the_workers_slots_waits_in_the_gate_and_its_lease_gives_the_slot_back() -> None:
    import dataclasses

    from gateway.pipeline.worker_gate import WorkerGate

    f, t = await one_worker()
    w = f.worker("w1:1")
    w.info = dataclasses.replace(w.info, max_running_requests=1)
    f.router.gate = gate = WorkerGate()
    blocker = await gate.enter(w.id, 1)  # the worker's one running slot is taken
    t.script(chunk([7], prompt=4), complete([7], prompt=4))
    opening = asyncio.ensure_future(open_on(
        f.router, f.router.select(ROUTE), ROUTE, pb.GenerateRequest(request_id="r1"),
        prompt_tokens=4, max_new_tokens=8, retry=RetryConfig(), config=FAST,
    ))
    await settle()
    assert not opening.done() and gate.held(w.id) == 1 and t.calls == []  # held in the gateway, not sent
    assert w.load.in_flight == 1  # the policy sees it as the worker's load meanwhile
    blocker()
    stream = await asyncio.wait_for(opening, 2)
    assert len(t.calls) == 1 and gate.through(w.id) == 1
    while await stream.read() is not None:
        pass
    assert gate.through(w.id) == 0 and w.load.in_flight == 0


async def test_a_pd_half_is_never_held_by_the_worker_gate() -> None:
    import dataclasses

    from gateway.pipeline.worker_gate import WorkerGate

    f, t = await one_worker()
    w = f.worker("w1:1")
    w.info = dataclasses.replace(w.info, max_running_requests=1)
    f.router.gate = gate = WorkerGate()
    blocker = await gate.enter(w.id, 1)
    t.script(chunk([7], prompt=4), complete([7], prompt=4))
    selection = dataclasses.replace(f.router.select(ROUTE), role="decode")
    stream = await asyncio.wait_for(open_on(
        f.router, selection, ROUTE, pb.GenerateRequest(request_id="r1"),
        prompt_tokens=4, max_new_tokens=8, retry=RetryConfig(), config=FAST,
    ), 2)
    assert len(t.calls) == 1 and gate.held() == 0 and gate.through(w.id) == 1  # sent at once, not counted
    while await stream.read() is not None:
        pass
    blocker()
    assert gate.through(w.id) == 0


async def test_a_paced_request_waits_for_the_first_token_of_the_pending_prefill_not_its_end() -> None:
    """Streamed requests only: an unstreamed one frees its budget on a timer (the next test).
    No sleeps: each step waits for the state it needs, and the first message comes only
    when the test releases it, so no wall-clock time frees the budget."""
    import dataclasses

    from gateway.pipeline.worker_gate import Pass, WorkerGate

    f, t = await one_worker()
    w = f.worker("w1:1")
    w.info = dataclasses.replace(w.info, max_running_requests=8)
    f.router.gate = gate = WorkerGate(prefill_budget=4)  # room for one uncached 4-token prompt
    first_token = asyncio.Event()
    sent = asyncio.Event()
    t.script(chunk([7], prompt=4), HANG)
    t.script(chunk([8], prompt=4), complete([8], prompt=4))
    real_generate = t.generate

    def generate(request: pb.GenerateRequest, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        call = real_generate(request, timeout=timeout)
        if len(t.calls) == 1:  # the first call's first message comes only when the test says so
            read = call.read

            async def slow_read():  # type: ignore[no-untyped-def]
                await first_token.wait()
                return await read()

            call.read = slow_read  # type: ignore[method-assign]
            sent.set()
        return call

    entered = asyncio.Event()  # the second request reached the gate
    real_enter = gate.enter

    async def enter(worker_id: str, running_slots: int, prefill_tokens: int = 0) -> Pass:
        if sent.is_set():
            entered.set()  # the real enter queues the caller before the test's task runs again
        return await real_enter(worker_id, running_slots, prefill_tokens)

    gate.enter = enter  # type: ignore[method-assign]
    t.generate = generate  # type: ignore[method-assign]
    config = dataclasses.replace(FAST, first_token_timeout_s=5.0, stall_timeout_s=5.0)
    one = asyncio.ensure_future(open_one(f, config=config, stream=True))
    await asyncio.wait_for(sent.wait(), 2)
    two = asyncio.ensure_future(open_one(f, config=config, stream=True))
    await asyncio.wait_for(entered.wait(), 2)
    await settle()  # nothing but the first message lets it through
    assert len(t.calls) == 1 and gate.held(w.id) == 1 and gate.prefill_pending(w.id) == 4  # a slot is free: the budget holds it
    assert gate.through(w.id) == 1 and not one.done() and not two.done()
    first_token.set()
    stream = await asyncio.wait_for(one, 2)  # its first message: the budget frees, its slot stays
    other = await asyncio.wait_for(two, 2)
    assert len(t.calls) == 2 and gate.through(w.id) == 2 and gate.held(w.id) == 0
    while await other.read() is not None:
        pass
    await stream.aclose()
    await flush_aborts()
    assert gate.through(w.id) == 0 and gate.prefill_pending(w.id) == 0 and w.load.in_flight == 0


async def test_an_unstreamed_request_frees_the_prefill_budget_at_its_expected_prefill_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The timer that frees the budget is caught and fired by the test: no wall clock."""
    import dataclasses

    from gateway.pipeline.worker_gate import Pass, WorkerGate

    f, t = await one_worker()
    w = f.worker("w1:1")
    w.info = dataclasses.replace(w.info, max_running_requests=8)
    f.router.gate = gate = WorkerGate(prefill_budget=4)
    t.script(HANG)  # the whole answer never comes
    loop = asyncio.get_running_loop()
    timers: list[tuple[float, Callable[..., object]]] = []
    real_call_later = loop.call_later

    def call_later(delay: float, callback: Callable[..., object], *args: object, **kwargs: Any) -> asyncio.TimerHandle:
        if isinstance(getattr(callback, "__self__", None), Pass):
            timers.append((delay, callback))
            return real_call_later(3600.0, lambda: None)
        return real_call_later(delay, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_later", call_later)
    sent = asyncio.Event()
    real_generate = t.generate

    def generate(request: pb.GenerateRequest, *, timeout: float | None = None):  # type: ignore[no-untyped-def]
        sent.set()
        return real_generate(request, timeout=timeout)

    t.generate = generate  # type: ignore[method-assign]
    config = dataclasses.replace(FAST, first_token_timeout_s=5.0, prefill_gate_default_tps=400.0)  # 4 tokens: 10 ms
    silent = asyncio.ensure_future(open_on(
        f.router, f.router.select(ROUTE), ROUTE, pb.GenerateRequest(request_id="r1", stream=False),
        prompt_tokens=4, max_new_tokens=8, retry=RetryConfig(), config=config,
    ))
    await asyncio.wait_for(sent.wait(), 2)
    await settle()
    assert gate.prefill_pending(w.id) == 4 and [delay for delay, _ in timers] == [pytest.approx(0.01)]
    timers[0][1]()  # its expected prefill time has come
    assert gate.prefill_pending(w.id) == 0 and gate.through(w.id) == 1 and not silent.done()
    silent.cancel()
    with pytest.raises(asyncio.CancelledError):
        await silent
    await flush_aborts()
    assert gate.through(w.id) == 0 and gate.prefill_pending(w.id) == 0
