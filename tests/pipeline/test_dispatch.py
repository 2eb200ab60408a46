"""Dispatch against a fake worker transport: sending, load accounting, embeddings."""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.aborts import flush_aborts
from gateway.pipeline.dispatch import DispatchConfig, call_embed, open_generate
from gateway.pipeline.lease import Outcome
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import InvalidRequestError
from gateway.workers.transport import CallCode
from tests.fake_transport import (
    HANG,
    MODEL,
    FakeTransport,
    Fleet,
    RecordingObserver,
    chunk,
    complete,
    fleet,
    rpc_error,
)

RETRY = RetryConfig(backoff_base_s=0.0, backoff_max_s=0.0)
CONFIG = DispatchConfig(first_token_timeout_s=1.0, stall_timeout_s=1.0)
ROUTE = RouteRequest(token_ids=[1, 2, 3, 4, 5], model=MODEL, request_id="d1", max_new_tokens=6)


def embed_req(rid: str = "d1") -> pb.EmbedRequest:
    return pb.EmbedRequest(request_id=rid, tokenized=pb.TokenizedInput(input_ids=[1, 2, 3, 4, 5]))


async def test_the_built_request_reaches_the_worker_and_load_moves_prefill_to_decode() -> None:
    t = FakeTransport("grpc://w1:1").script(chunk([9], prompt=5), HANG)
    f = await fleet(t)
    built: list[str] = []

    def build(selection):  # type: ignore[no-untyped-def]
        built.append(selection.worker.id)
        return pb.GenerateRequest(request_id="d1", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3, 4, 5]))

    obs = RecordingObserver()
    stream = await open_generate(
        f.router, ROUTE, build, prompt_tokens=5, max_new_tokens=6, retry=RETRY, config=CONFIG, observer=obs,
    )
    w = f.worker("w1:1")
    assert built == ["w1:1"] and list(t.requests[0].tokenized.input_ids) == [1, 2, 3, 4, 5]
    assert (w.load.in_flight, w.load.queued_prefill_tokens, w.load.running_decode_tokens) == (1, 5, 0)
    await stream.read()  # the first message: prefill is over
    assert (w.load.queued_prefill_tokens, w.load.running_decode_tokens) == (0, 6)
    await stream.aclose()
    await flush_aborts()
    assert (w.load.in_flight, w.load.running_decode_tokens) == (0, 0)
    assert t.aborts == [("d1", "finished by gateway")]
    assert obs.stages == ["select", "relay"] and obs.selections == [("spy", "spy", "w1:1")]


async def test_n_streams_share_one_lease_per_worker() -> None:
    t = FakeTransport("grpc://w1:1").script(chunk([1], index=0), chunk([2], index=1), complete([1], index=0), complete([2], index=1))
    f = await fleet(t)
    stream = await open_generate(
        f.router, ROUTE, lambda s: pb.GenerateRequest(request_id="d1"), prompt_tokens=5, max_new_tokens=12,
        retry=RETRY, config=CONFIG,
    )
    assert f.worker("w1:1").load.in_flight == 1
    while await stream.read() is not None:
        pass
    assert f.worker("w1:1").load.in_flight == 0 and f.spy is not None and len(f.spy.finished) == 1


async def test_embed_goes_through_select_lease_and_observer() -> None:
    t = FakeTransport("grpc://w1:1")
    f = await fleet(t)
    obs = RecordingObserver()
    done = await call_embed(f.router, ROUTE, embed_req(), retry=RETRY, config=CONFIG, observer=obs)
    assert done.worker_id == "w1:1" and list(done.reply.embedding) == [0.5, 0.25] and done.attempts == 1
    assert f.worker("w1:1").load.in_flight == 0
    assert f.spy is not None and f.spy.dispatched == [("d1", "w1:1")] and f.spy.finished == [("d1", "w1:1", 0, True)]
    assert obs.stages == ["select", "embed"]
    assert obs.done[0]["sent_prompt"] == 5 and obs.done[0]["reported_prompt"] == 5


async def test_embed_is_retried_on_another_worker() -> None:
    a = FakeTransport("grpc://a:1")
    a.embeds.append(rpc_error(CallCode.UNAVAILABLE))
    b = FakeTransport("grpc://b:1")
    f = await fleet(a, b)
    obs = RecordingObserver()
    done = await call_embed(f.router, ROUTE, embed_req(), retry=RETRY, config=CONFIG, observer=obs)
    assert done.worker_id == "b:1" and done.attempts == 2 and obs.retries == [("a:1", "UNAVAILABLE")]
    assert f.worker("a:1").breaker.consecutive_failures == 1
    assert all(w.load.in_flight == 0 for w in f.registry.all())


async def test_embed_refused_as_bad_is_a_400_and_not_retried() -> None:
    a = FakeTransport("grpc://a:1")
    a.embeds.append(rpc_error(CallCode.INVALID_ARGUMENT, "too long"))
    b = FakeTransport("grpc://b:1")
    f = await fleet(a, b)
    with pytest.raises(InvalidRequestError, match="too long"):
        await call_embed(f.router, ROUTE, embed_req(), retry=RETRY, config=CONFIG)
    assert b.embed_requests == [] and f.worker("a:1").breaker.consecutive_failures == 0


async def test_embed_cancelled_frees_its_slot() -> None:
    t = FakeTransport("grpc://w1:1")
    f = await fleet(t)
    gate = asyncio.Event()

    async def slow_embed(request: pb.EmbedRequest, *, timeout: float | None = None) -> pb.EmbedResponse:
        await gate.wait()
        raise AssertionError("not reached")

    t.embed = slow_embed  # type: ignore[method-assign]
    task = asyncio.ensure_future(call_embed(f.router, ROUTE, embed_req(), retry=RETRY, config=CONFIG))
    await asyncio.sleep(0)
    assert f.worker("w1:1").load.in_flight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await flush_aborts()
    assert f.worker("w1:1").load.in_flight == 0 and t.aborts == [("d1", "cancelled")]


async def test_a_target_worker_is_honoured() -> None:
    a, b = FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1").script(chunk([1]))
    f: Fleet = await fleet(a, b)
    route = RouteRequest(token_ids=[1], model=MODEL, request_id="d1", target_worker="b:1")
    stream = await open_generate(
        f.router, route, lambda s: pb.GenerateRequest(request_id="d1"), prompt_tokens=1, max_new_tokens=1,
        retry=RETRY, config=CONFIG,
    )
    assert stream.worker.id == "b:1" and a.requests == []
    stream.finished()
    assert stream.lease.outcome is Outcome.OK


async def test_the_lease_keeps_the_largest_counts_the_stream_reported() -> None:
    """Cumulative counts, read from every message: the largest of each reaches the policy
    and the observer however the messages order them (a larger one after equal ones, a
    smaller one after it, the complete's own)."""
    t = FakeTransport("grpc://w1:1").script(
        chunk([1], prompt=5, cached=0), chunk([2], prompt=5, cached=0), chunk([3], prompt=6, cached=4),
        chunk([4], prompt=5, cached=2), complete([4], prompt=6, cached=4),
    )
    f = await fleet(t)
    obs = RecordingObserver()
    stream = await open_generate(
        f.router, ROUTE, lambda s: pb.GenerateRequest(request_id="d1"), prompt_tokens=5, max_new_tokens=6,
        retry=RETRY, config=CONFIG, observer=obs,
    )
    while await stream.read() is not None:
        pass
    assert f.spy is not None and f.spy.finished == [("d1", "w1:1", 4, True)]
    assert obs.done[0]["reported_prompt"] == 6 and obs.done[0]["cached"] == 4
