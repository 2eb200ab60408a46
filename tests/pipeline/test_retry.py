"""The one retry loop: before output only, another worker each time, bounded."""

from __future__ import annotations

import pytest

from gateway.pipeline.dispatch import DispatchConfig, open_generate
from gateway.pipeline.retry import RetryConfig
from gateway.policies.base import RouteRequest
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.errors import InvalidRequestError, NoWorkerError, WorkerError
from gateway.workers.transport import CallCode
from tests.fake_transport import (
    HANG,
    MODEL,
    FakeTransport,
    Fleet,
    RecordingObserver,
    chunk,
    fleet,
    rpc_error,
)

RETRY = RetryConfig(max_attempts=3, backoff_base_s=0.0, backoff_max_s=0.0)
FAST = DispatchConfig(first_token_timeout_s=0.02, stall_timeout_s=1.0)
ROUTE = RouteRequest(token_ids=[1, 2, 3], model=MODEL, request_id="q1")


async def go(f: Fleet, obs: RecordingObserver, retry: RetryConfig = RETRY):  # type: ignore[no-untyped-def]
    return await open_generate(
        f.router, ROUTE, lambda s: pb.GenerateRequest(request_id="q1"),
        prompt_tokens=3, max_new_tokens=4, retry=retry, config=FAST, observer=obs,
    )


def in_flight(f: Fleet) -> int:
    return sum(w.load.in_flight for w in f.registry.all())


async def test_a_failed_worker_is_excluded_and_another_one_tried() -> None:
    a = FakeTransport("grpc://a:1").script(rpc_error(CallCode.UNAVAILABLE))
    b = FakeTransport("grpc://b:1").script(chunk([7]))
    f = await fleet(a, b)
    obs = RecordingObserver()
    stream = await go(f, obs)
    assert stream.worker.id == "b:1" and stream.attempts == 2
    assert obs.retries == [("a:1", "UNAVAILABLE")]
    assert [s[2] for s in obs.selections] == ["a:1", "b:1"]
    assert len(a.requests) == 1 and len(b.requests) == 1
    await stream.abort()
    assert in_flight(f) == 0


async def test_first_token_timeout_retries_elsewhere() -> None:
    a = FakeTransport("grpc://a:1").script(HANG)
    b = FakeTransport("grpc://b:1").script(chunk([7]))
    f = await fleet(a, b)
    obs = RecordingObserver()
    stream = await go(f, obs)
    assert stream.worker.id == "b:1" and obs.retries == [("a:1", "FIRST_TOKEN_TIMEOUT")]
    await stream.abort()
    assert in_flight(f) == 0


async def test_a_bad_request_is_not_retried() -> None:
    a = FakeTransport("grpc://a:1").script(rpc_error(CallCode.INVALID_ARGUMENT, "no such stop"))
    b = FakeTransport("grpc://b:1")
    f = await fleet(a, b)
    with pytest.raises(InvalidRequestError, match="no such stop"):
        await go(f, RecordingObserver())
    assert b.requests == [] and in_flight(f) == 0


async def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    ts = [FakeTransport(f"grpc://w{i}:1").script(rpc_error(CallCode.INTERNAL, f"down {i}")) for i in range(4)]
    f = await fleet(*ts)
    obs = RecordingObserver()
    with pytest.raises(WorkerError) as info:
        await go(f, obs)
    tried = [s[2] for s in obs.selections]
    assert len(tried) == 3 and len(set(tried)) == 3  # a different worker each time
    assert tried[-1] in str(info.value)  # the last attempt's error reaches the client
    assert sum(len(t.requests) for t in ts) == 3 and len(obs.retries) == 2
    assert in_flight(f) == 0


async def test_running_out_of_workers_raises_the_last_worker_error() -> None:
    a = FakeTransport("grpc://a:1").script(rpc_error(CallCode.UNAVAILABLE, "gone"))
    f = await fleet(a)
    with pytest.raises(WorkerError, match="gone"):
        await go(f, RecordingObserver())


async def test_no_worker_at_all_is_503() -> None:
    f = await fleet()
    with pytest.raises(NoWorkerError):
        await go(f, RecordingObserver())


async def test_one_attempt_means_no_retry() -> None:
    a = FakeTransport("grpc://a:1").script(rpc_error(CallCode.UNAVAILABLE))
    b = FakeTransport("grpc://b:1")
    f = await fleet(a, b)
    with pytest.raises(WorkerError):
        await go(f, RecordingObserver(), RetryConfig(max_attempts=1))
    assert b.requests == []


def test_backoff_is_full_jitter_capped() -> None:
    import random

    cfg = RetryConfig(backoff_base_s=0.1, backoff_max_s=0.3)
    rng = random.Random(1)
    assert all(0 <= cfg.backoff(n, rng) <= min(0.3, 0.1 * 2 ** (n - 1)) for n in range(1, 8) for _ in range(20))
    assert cfg.retryable(CallCode.UNAVAILABLE) and not cfg.retryable(CallCode.INVALID_ARGUMENT)
