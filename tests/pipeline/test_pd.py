"""PD pairs against fake workers: both halves leased, released once, failures retried as a pair."""

from __future__ import annotations

import pytest

from gateway.pipeline.aborts import flush_aborts
from gateway.pipeline.dispatch import DispatchConfig
from gateway.pipeline.pd import PdOpener
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import WorkerError
from gateway.workers.transport import CallCode
from tests.fake_transport import (
    HANG,
    MODEL,
    FakeTransport,
    Fleet,
    chunk,
    complete,
    fleet,
    rpc_error,
)

RETRY = RetryConfig(max_attempts=2, backoff_base_s=0.0, backoff_max_s=0.0)
CONFIG = DispatchConfig(first_token_timeout_s=1.0, stall_timeout_s=1.0)
ROUTE = RouteRequest(token_ids=[1, 2, 3, 4], model=MODEL, request_id="p1", max_new_tokens=3)


def prefill(name: str) -> FakeTransport:
    return FakeTransport(f"grpc://{name}:1", role="prefill", bootstrap_port=9000)


def decode(name: str) -> FakeTransport:
    return FakeTransport(f"grpc://{name}:1", role="decode")


def idle(f: Fleet) -> bool:
    return all(w.load.in_flight == 0 for w in f.registry.all())


async def open_pd(f: Fleet, samples: int = 1):  # type: ignore[no-untyped-def]
    return await PdOpener(f.router, retry=RETRY, config=CONFIG).open(
        ROUTE, pb.GenerateRequest(request_id="p1", stream=True), samples=samples, wants_output_logprobs=False,
        prompt_tokens=4, max_new_tokens=3,
    )


async def test_pair_gets_the_same_room_and_both_leases_end_once() -> None:
    p, d = prefill("p"), decode("d")
    p.script(complete([], cached=3))
    d.script(chunk([7]), complete([7]))
    f = await fleet(p, d)
    stream = await open_pd(f)
    assert f.worker("p:1").load.in_flight == 0  # the prefill half is done once its complete is read
    assert f.worker("d:1").load.in_flight == 1
    first = await stream.read()
    assert first is not None and first.chunk.cached_tokens == 3  # prefix reuse is the prefill's figure
    while await stream.read() is not None:
        pass
    assert idle(f)
    pr, dr = p.requests[0], d.requests[0]
    assert pr.disaggregated_params.bootstrap_room == dr.disaggregated_params.bootstrap_room
    assert pr.disaggregated_params.bootstrap_port == 9000 and not pr.stream
    assert f.spy is not None and sorted(w for _, w, _, ok in f.spy.finished if ok) == ["d:1", "p:1"]


async def test_decode_failure_before_output_aborts_the_prefill_and_retries_the_pair() -> None:
    p, d1, d2 = prefill("p"), decode("d1"), decode("d2")
    p.script(HANG)  # the first prefill is still running when its decode partner fails
    p.script(complete([], cached=1))
    d1.script(rpc_error(CallCode.UNAVAILABLE))
    d2.script(chunk([5]), complete([5]))
    f = await fleet(p, d1, d2)
    stream = await open_pd(f)
    assert stream.worker.id == "d2:1" and stream.attempts == 2
    while await stream.read() is not None:
        pass
    await flush_aborts()
    assert p.calls[0].cancelled and p.aborts == [("p1", "cancelled")]
    assert f.worker("d1:1").breaker.consecutive_failures == 1
    assert idle(f)


async def test_n_samples_are_pairs_of_their_own() -> None:
    p, d = prefill("p"), decode("d")
    for _ in range(2):
        p.script(complete([], cached=2))
    d.script(chunk([1]), complete([1]))
    d.script(chunk([2]), complete([2]))
    f = await fleet(p, d)
    stream = await open_pd(f, samples=2)
    seen = set()
    while (msg := await stream.read()) is not None:
        seen.add(msg.chunk.index if msg.HasField("chunk") else msg.complete.index)
    assert seen == {0, 1} and idle(f)
    assert {r.request_id for r in d.requests} == {"p1-0", "p1-1"}
    assert len({r.disaggregated_params.bootstrap_room for r in d.requests}) == 2


async def test_a_sample_that_ends_without_finishing_fails_the_request() -> None:
    p, d = prefill("p"), decode("d")
    for _ in range(2):
        p.script(complete([]))
    d.script(chunk([1]), complete([1]))
    d.script(chunk([2]))  # EOF without a complete
    f = await fleet(p, d)
    stream = await open_pd(f, samples=2)
    with pytest.raises(WorkerError, match="without finishing"):
        while await stream.read() is not None:
            pass
    await stream.abort()
    assert idle(f)
