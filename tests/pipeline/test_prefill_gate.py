"""The prefill gate in dispatch, against fake workers: a request sharing a prefix with one
still in prefill on its worker waits for that one's first message, and every ending of the
blocker (first token, failure, cancellation) and of the waiter (cancellation, timeout)
lets go."""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.dispatch import DispatchConfig, open_generate
from gateway.pipeline.prefill_gate import PrefillGateConfig, hold_timeout_s
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.transport import CallCode
from gateway_lab.sim.virtual_clock import run_virtual
from tests.fake_transport import (
    HANG,
    MODEL,
    FakeTransport,
    Fleet,
    Later,
    chunk,
    complete,
    fleet,
    rpc_error,
)

RETRY = RetryConfig(max_attempts=1, backoff_base_s=0.0, backoff_max_s=0.0)
CONFIG = DispatchConfig(first_token_timeout_s=5.0, stall_timeout_s=5.0)
SYSTEM = list(range(1000, 1000 + 1024))


def route(n: int, system: list[int] = SYSTEM) -> RouteRequest:
    return RouteRequest(token_ids=[*system, *range(20_000 + 100 * n, 20_000 + 100 * n + 32)], model=MODEL,
                        request_id=f"r{n}", max_new_tokens=4)


async def start(f: Fleet, r: RouteRequest, config: DispatchConfig = CONFIG) -> asyncio.Task:  # type: ignore[type-arg]
    async def run():  # type: ignore[no-untyped-def]
        return await open_generate(
            f.router, r, lambda s: pb.GenerateRequest(request_id=r.request_id), prompt_tokens=len(r.token_ids),
            max_new_tokens=4, retry=RETRY, config=config,
        )

    task = asyncio.ensure_future(run())
    for _ in range(5):
        await asyncio.sleep(0)
    return task


def stats(f: Fleet):  # type: ignore[no-untyped-def]
    return f.router.holds.pool_stats(MODEL, "regular")


async def test_a_follower_waits_for_the_first_token_of_its_prefix_then_goes_to_the_same_worker() -> None:
    t = FakeTransport("grpc://w1:1").script(Later(0.05, chunk([1])), HANG).script(chunk([2]), HANG)
    f = await fleet(t, policy="cache_aware")
    first = await start(f, route(1))
    follower = await start(f, route(2))
    w = f.worker("w1:1")
    assert len(t.requests) == 1  # the follower is held at the gateway...
    assert stats(f).waiting == 1 and stats(f).held == 1
    assert w.load.in_flight == 2  # ...but counted on its worker (it holds its lease)
    a = await first
    b = await follower
    assert len(t.requests) == 2 and b.worker.id == "w1:1"
    st = stats(f)
    assert (st.released, st.timed_out, st.waiting, st.gained_tokens) == (1, 0, 0, 1024)
    assert len(f.router.holds.rule) == 0  # both got their first message: nobody is in prefill
    await a.aclose()
    await b.aclose()
    assert w.load.in_flight == 0


async def test_unrelated_requests_are_not_held() -> None:
    t = FakeTransport("grpc://w1:1").script(HANG).script(chunk([2]), HANG)
    f = await fleet(t, policy="cache_aware")
    first = await start(f, route(1))
    other = await start(f, route(2, system=list(range(5000, 6024))))
    stream = await other
    assert len(t.requests) == 2 and stats(f).held == 0
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await stream.aclose()


async def test_the_gate_can_be_turned_off() -> None:
    t = FakeTransport("grpc://w1:1").script(HANG).script(chunk([2]), HANG)
    f = await fleet(t, policy="cache_aware")
    off = DispatchConfig(first_token_timeout_s=5.0, stall_timeout_s=5.0, prefill_gate=False)
    first = await start(f, route(1), off)
    stream = await (await start(f, route(2), off))
    assert len(t.requests) == 2 and stats(f).held == 0 and len(f.router.holds.rule) == 0
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await stream.aclose()


async def test_a_failed_blocker_releases_its_waiters() -> None:
    # the blocker fails late enough that the follower is surely held first, on a loaded host too
    t = FakeTransport("grpc://w1:1").script(Later(0.2, rpc_error(CallCode.UNAVAILABLE))).script(chunk([2]), HANG)
    f = await fleet(t, policy="cache_aware")
    first = await start(f, route(1))
    follower = await start(f, route(2))
    assert stats(f).waiting == 1
    with pytest.raises(Exception, match=r"fake failure|unavailable"):
        await first
    stream = await follower
    assert stats(f).released == 1 and len(t.requests) == 2
    await stream.aclose()


async def test_a_cancelled_blocker_releases_its_waiters() -> None:
    t = FakeTransport("grpc://w1:1").script(HANG).script(chunk([2]), HANG)
    f = await fleet(t, policy="cache_aware")
    first = await start(f, route(1))
    follower = await start(f, route(2))
    assert stats(f).waiting == 1
    first.cancel()  # its client went away
    with pytest.raises(asyncio.CancelledError):
        await first
    stream = await follower
    assert stats(f).released == 1 and stream.worker.id == "w1:1"
    await stream.aclose()
    assert f.worker("w1:1").load.in_flight == 0


async def test_a_cancelled_waiter_gives_its_lease_back_and_sends_nothing() -> None:
    t = FakeTransport("grpc://w1:1").script(Later(0.05, chunk([1])), HANG)
    f = await fleet(t, policy="cache_aware")
    first = await start(f, route(1))
    follower = await start(f, route(2))
    w = f.worker("w1:1")
    assert w.load.in_flight == 2
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    assert w.load.in_flight == 1 and stats(f).cancelled == 1 and stats(f).waiting == 0
    assert len(t.requests) == 1
    stream = await first
    await stream.aclose()
    assert w.load.in_flight == 0


async def test_a_hold_ends_at_its_timeout() -> None:
    t = FakeTransport("grpc://w1:1").script(HANG).script(chunk([2]), HANG)
    f = await fleet(t, policy="cache_aware")
    quick = DispatchConfig(first_token_timeout_s=5.0, stall_timeout_s=5.0, prefill_gate_min_s=0.02, prefill_gate_max_s=0.02)
    first = await start(f, route(1), quick)
    stream = await (await start(f, route(2), quick))
    assert stats(f).timed_out == 1 and stats(f).released == 0 and len(t.requests) == 2
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await stream.aclose()


async def test_a_worker_gone_during_the_hold_sends_the_request_elsewhere() -> None:
    t1 = FakeTransport("grpc://w1:1").script(HANG)
    t2 = FakeTransport("grpc://w2:1").script(HANG).script(chunk([2]), HANG)
    f = await fleet(t1, t2, policy="cache_aware")
    r1 = route(1)
    first = await start(f, RouteRequest(r1.token_ids, model=MODEL, request_id="r1", max_new_tokens=4,
                                        target_worker="w1:1"))
    busy = await start(f, RouteRequest(list(range(30_000, 33_000)), model=MODEL, request_id="busy",
                                       max_new_tokens=4, target_worker="w2:1"))  # w2 looks loaded: r2 picks w1
    retry = RetryConfig(max_attempts=2, backoff_base_s=0.0, backoff_max_s=0.0)
    r2 = route(2)

    async def run():  # type: ignore[no-untyped-def]
        return await open_generate(f.router, r2, lambda s: pb.GenerateRequest(request_id="r2"),
                                   prompt_tokens=len(r2.token_ids), max_new_tokens=4, retry=retry, config=CONFIG)

    follower = asyncio.ensure_future(run())
    for _ in range(5):
        await asyncio.sleep(0)
    assert stats(f).waiting == 1 and len(t2.requests) == 1
    f.worker("w1:1").trip("test: taken out of rotation")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    stream = await follower
    assert stream.worker.id == "w2:1" and len(t1.requests) == 1
    await stream.aclose()
    busy.cancel()
    with pytest.raises(asyncio.CancelledError):
        await busy


def test_hold_timeout_follows_the_learned_prefill_rate_within_bounds() -> None:
    cfg = PrefillGateConfig(prefill_gate_factor=2.0, prefill_gate_min_s=0.5, prefill_gate_max_s=30.0,
                            prefill_gate_default_tps=4000.0)
    assert hold_timeout_s(8000, 2000.0, cfg) == 8.0  # 2 x 8000 tokens at 2000 tokens/s
    assert hold_timeout_s(8000, None, cfg) == 4.0  # default rate until learned
    assert hold_timeout_s(10, 2000.0, cfg) == 0.5
    assert hold_timeout_s(10**9, 2000.0, cfg) == 30.0
    with pytest.raises(ValueError):
        PrefillGateConfig(prefill_gate_min_s=5.0, prefill_gate_max_s=1.0)


def test_a_set_members_hold_timeout_counts_its_siblings_prompts_in_prefill_on_the_worker() -> None:
    """A sibling's blocker waits behind the sibling's requests too: one process's own queue
    alone gave a hold half the time one process would have allowed it."""
    from types import SimpleNamespace

    from gateway.pipeline.prefill_gate import PrefillHolds

    cfg = PrefillGateConfig(prefill_gate_factor=2.0, prefill_gate_min_s=0.5, prefill_gate_max_s=30.0)
    worker = SimpleNamespace(load=SimpleNamespace(queued_prefill_tokens=4000), sibling_queued_prompt_tokens=4000,
                             progress=SimpleNamespace(prefill_tps=2000.0))  # fmt: skip
    assert PrefillHolds().timeout_s(SimpleNamespace(worker=worker), cfg) == 8.0  # type: ignore[arg-type]


def test_pd_prefill_halves_are_gated_and_released_by_the_first_prefill() -> None:
    """On the virtual clock (time moves only when nothing is ready to run): the first
    prefill's 50 ms and the follower's hold timeout (0.5 s at least) are measured on it, so
    a host that stops the process for a second cannot time the hold out first."""
    from gateway.pipeline.pd import PdOpener

    async def scenario() -> None:
        p = FakeTransport("grpc://p:1", role="prefill", bootstrap_port=9000)
        d = FakeTransport("grpc://d:1", role="decode")
        p.script(Later(0.05, complete([], cached=0))).script(complete([], cached=1024))
        d.script(chunk([7]), HANG).script(chunk([8]), HANG)
        f = await fleet(p, d, policy="cache_aware")
        opener = PdOpener(f.router, retry=RETRY, config=CONFIG)

        async def run(r: RouteRequest):  # type: ignore[no-untyped-def]
            return await opener.open(r, pb.GenerateRequest(request_id=r.request_id, stream=True), samples=1,
                                     wants_output_logprobs=False, prompt_tokens=len(r.token_ids), max_new_tokens=4)

        loop = asyncio.get_running_loop()
        began = loop.time()
        first = asyncio.ensure_future(run(route(1)))
        for _ in range(5):
            await asyncio.sleep(0)
        follower = asyncio.ensure_future(run(route(2)))
        for _ in range(5):
            await asyncio.sleep(0)
        pool = f.router.holds.pool_stats(MODEL, "prefill")
        assert pool.waiting == 1 and len(p.requests) == 1  # the follower's prefill half waits
        assert len(d.requests) == 2  # its decode half was sent: it waits for the KV like any decode
        a, b = await first, await follower
        assert pool.released == 1 and pool.timed_out == 0
        assert len(p.requests) == 2 and len(f.router.holds.rule) == 0
        assert loop.time() - began == pytest.approx(0.05)  # released by the first prefill's end, not a timeout
        await a.aclose()
        await b.aclose()
        assert all(w.load.in_flight == 0 for w in f.registry.all())

    run_virtual(scenario())


async def test_no_hold_once_the_workers_running_slots_are_taken_by_requests_sent_to_it() -> None:
    import dataclasses

    t = FakeTransport("grpc://w1:1").script(Later(0.05, chunk([1])), HANG).script(chunk([2]), HANG).script(chunk([3]), HANG)
    f = await fleet(t, policy="cache_aware")
    w = f.worker("w1:1")
    w.info = dataclasses.replace(w.info, max_running_requests=2)
    first = await start(f, route(1))
    other = await start(f, route(2, system=list(range(5000, 6024))))  # unrelated: sent, the second slot
    follower = await start(f, route(3))  # both slots taken: sent, it queues behind its blocker
    assert stats(f).held == 0 and len(t.requests) == 3
    for task in (first, other, follower):
        stream = await task
        await stream.aclose()
    assert w.load.in_flight == 0


async def test_held_requests_do_not_take_the_workers_running_slots() -> None:
    """Requests held at the gateway are not on the worker: a follower routed while only its
    blocker was sent would be admitted into the blocker's batch at once, so it waits too."""
    import dataclasses

    t = FakeTransport("grpc://w1:1").script(Later(0.05, chunk([1])), HANG).script(chunk([2]), HANG).script(chunk([3]), HANG)
    f = await fleet(t, policy="cache_aware")
    w = f.worker("w1:1")
    w.info = dataclasses.replace(w.info, max_running_requests=2)
    first = await start(f, route(1))
    second = await start(f, route(2))  # one slot left after the blocker: held
    third = await start(f, route(3))  # blocker + one held in flight, one sent: held as well
    assert stats(f).held == 2 and len(t.requests) == 1 and w.load.in_flight == 3
    assert f.router.holds.held_on("w1:1") == 2
    for task in (first, second, third):
        stream = await task
        await stream.aclose()
    assert stats(f).released == 2 and f.router.holds.held_on("w1:1") == 0
    assert len(t.requests) == 3 and w.load.in_flight == 0


async def test_a_siblings_request_in_prefill_holds_a_follower_until_its_first_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two processes of one set (two routers sharing a run folder through sync.host_prefill):
    the sibling sent the group's first request to w1, and this process's follower of the
    same group (routed to w1: its tree has the sibling's decision) waits for that request's
    first token, as it would for its own."""
    from gateway.policies.base import RemoteDecision
    from gateway.policies.radix_tree import pack
    from gateway.sync.host_prefill import HostPrefill

    ta = FakeTransport("grpc://w1:1").script(Later(0.1, chunk([1])), HANG)
    tb = FakeTransport("grpc://w1:1").script(chunk([2]), HANG)
    fa, fb = await fleet(ta, policy="cache_aware"), await fleet(tb, policy="cache_aware")
    boards = [
        HostPrefill(tmp_path, i, 2, on_sent=f.router.holds.remote_sent, on_done=f.router.holds.prefilled)
        for i, f in enumerate((fa, fb))
    ]
    for f, board in zip((fa, fb), boards, strict=True):
        f.router.holds.share = board
    boards[1].poll()  # (a sibling's ring is looked for on the first poll and every so often after)
    try:
        first = await start(fa, route(1))
        assert len(ta.requests) == 1
        # What the decision ring tells process b: the group's prefix went to w1.
        fb.router.policy(MODEL, "regular").on_remote(RemoteDecision("w1:1", MODEL, pack(route(1).token_ids)))
        follower = await start(fb, route(2))
        assert len(tb.requests) == 0 and stats(fb).waiting == 1  # held for the sibling's request
        a = await first
        b = await follower  # released when process a's request got its first token
        assert len(tb.requests) == 1 and b.worker.id == "w1:1"
        st = stats(fb)
        assert (st.held, st.released, st.timed_out) == (1, 1, 0)
        assert len(fb.router.holds.rule) == 0 and boards[1].stats.released == 1
        await a.aclose()
        await b.aclose()
    finally:
        for f, board in zip((fa, fb), boards, strict=True):
            f.router.holds.share = None
            board.close()


async def test_a_siblings_held_requests_do_not_make_the_worker_look_full(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two processes of one set: process a sent the group's first request to w1 (3 running
    slots); process b holds two followers of the group for it. b's bus figure counts both
    as in flight on w1, but neither is on the worker: a's own next follower must be held as
    well, not sent past its blocker into the same prefill batch because the bus made w1
    look full (what put a set's in-batch duplicates at ten times one process's)."""
    import dataclasses

    from gateway.policies.base import RemoteDecision
    from gateway.policies.radix_tree import pack
    from gateway.sync.apply import Applier
    from gateway.sync.host_prefill import HostPrefill
    from gateway.sync.outbox import Outbox

    ta = FakeTransport("grpc://w1:1").script(Later(0.1, chunk([1])), HANG).script(chunk([4]), HANG)
    tb = FakeTransport("grpc://w1:1").script(chunk([2]), HANG).script(chunk([3]), HANG)
    fa, fb = await fleet(ta, policy="cache_aware"), await fleet(tb, policy="cache_aware")
    for f in (fa, fb):
        w = f.worker("w1:1")
        w.info = dataclasses.replace(w.info, max_running_requests=3)

    def counted(f):  # type: ignore[no-untyped-def]  # server.state's on_in_flight
        return lambda wid, n: setattr(f.worker(wid), "sibling_in_flight", n)

    boards = [
        HostPrefill(tmp_path, i, 2, on_sent=f.router.holds.remote_sent, on_done=f.router.holds.prefilled,
                    on_in_flight=counted(f))
        for i, f in enumerate((fa, fb))
    ]  # fmt: skip
    for f, board in zip((fa, fb), boards, strict=True):
        f.router.holds.share = board
    boards[1].poll()
    try:
        first = await start(fa, route(1))
        fb.router.policy(MODEL, "regular").on_remote(RemoteDecision("w1:1", MODEL, pack(route(1).token_ids)))
        held = [await start(fb, route(2)), await start(fb, route(3))]
        assert stats(fb).waiting == 2 and len(tb.requests) == 0 and fb.worker("w1:1").load.in_flight == 2
        # What b's next bus batch tells a: two requests in flight on w1 (its held ones).
        outbox = Outbox("b", lambda wid: fb.worker(wid).load, lambda wid: 1, host_set="set")
        outbox.load_changed("w1:1")
        batch = outbox.take()
        assert batch is not None and batch.loads[0].in_flight == 2
        Applier("a", fa.router, fa.registry, host_set="set").apply(batch)  # type: ignore[arg-type]
        wa = fa.worker("w1:1")
        assert wa.remote_load.in_flight == 2 and wa.peer_in_flight == 0 and wa.sibling_in_flight == 0
        follower = await start(fa, route(4))
        assert stats(fa).waiting == 1 and len(ta.requests) == 1  # held: w1 has one request on it, not three
        a = await first
        streams = [await follower, *[await t for t in held]]
        assert (stats(fa).released, stats(fb).released) == (1, 2) and len(ta.requests) == 2 and len(tb.requests) == 2
        # b's two are on w1 now, a's follower too: a sees all four, and each end is heard.
        boards[0].poll()
        assert wa.sibling_in_flight == 2 and fa.router.holds.on_worker(wa) == 2 + 2 - 1
        for stream in (a, *streams):
            await stream.aclose()
        boards[0].poll()
        assert wa.sibling_in_flight == 0 and wa.load.in_flight == 0
    finally:
        for f, board in zip((fa, fb), boards, strict=True):
            f.router.holds.share = None
            board.close()
