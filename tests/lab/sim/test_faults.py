"""Fault knobs: fail after k tokens, stall, reject, die (flipped on live workers)."""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.worker import SimWorker

from .conftest import PROMPT, address, by_index, cfg, collect, request


def released(w: SimWorker) -> bool:
    return (
        w.scheduler.num_running == 0
        and w.cache.protected_tokens == 0
        and w.cache.private_tokens == 0
        and w.scheduler.reserved == 0
    )


async def test_fail_after_tokens_streaming(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    worker.faults.fail_after_tokens = 3
    got: list[pb.GenerateResponse] = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for r in stub.Generate(request(PROMPT, stream=True, max_new=10)):
            got.append(r)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "after 3" in err.value.details()
    assert [len(r.chunk.token_ids) for r in got] == [1, 1, 1]
    assert all(r.WhichOneof("response") == "chunk" for r in got)
    assert worker.counters.failed == 1 and released(worker)


async def test_fail_after_tokens_non_streaming_with_status(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    worker.faults.fail_after_tokens = 0
    worker.faults.fail_status = "INTERNAL"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(stub, request(PROMPT, stream=False, n=2, max_new=10))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert released(worker)
    worker.faults.fail_after_tokens = -1  # off again: the worker is fine
    assert (
        by_index(await collect(stub, request(PROMPT, max_new=4)))[0].complete.completion_tokens == 4
    )


async def test_stall_before_first_token(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    worker.faults.stall_s = 0.3
    t0 = time.monotonic()
    call = stub.Generate(request(PROMPT, stream=True, max_new=3))
    await call.read()
    assert time.monotonic() - t0 >= 0.29
    call.cancel()


async def test_stall_mid_stream(stub: pb_grpc.SglangSchedulerStub, worker: SimWorker) -> None:
    worker.faults.stall_s = 0.3
    worker.faults.stall_after_tokens = 2
    stamps = []
    async for r in stub.Generate(request(PROMPT, stream=True, max_new=4)):
        stamps.append((time.monotonic(), r.WhichOneof("response")))
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(stamps)]
    assert gaps[1] >= 0.29  # between token 2 and token 3
    assert max(gaps) == gaps[1]  # the stall happened there, once


async def test_health_check_waits_out_a_stall_as_a_real_probe_generation_would(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    """SGLang's HealthCheck is a one-token generation through the scheduler: while a request
    of this worker stalls, the probe waits too (a client's deadline ends it); otherwise it
    answers at once."""
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=1.0)).healthy
    worker.faults.stall_s = 0.5
    call = stub.Generate(request(PROMPT, stream=False, max_new=2))
    for _ in range(200):  # until the request reaches its stall (bounded)
        if worker.stalling:
            break
        await asyncio.sleep(0.01)
    assert worker.stalling == 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.HealthCheck(pb.HealthCheckRequest(), timeout=0.1)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    t0 = time.monotonic()
    assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2.0)).healthy  # once the stall ends
    assert time.monotonic() - t0 >= 0.05 and worker.stalling == 0
    assert [r.WhichOneof("response") async for r in call] == ["complete"]


async def test_reject_every_generate(stub: pb_grpc.SglangSchedulerStub, worker: SimWorker) -> None:
    worker.faults.reject_status = "RESOURCE_EXHAUSTED"
    for _ in range(2):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub, request(PROMPT))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert worker.counters.rejected == 2 and worker.counters.samples == 0
    assert (await stub.HealthCheck(pb.HealthCheckRequest())).healthy


async def test_exit_after_requests_in_process() -> None:
    async with SimFleet.start(2, cfg(fault_exit_after_requests=1)) as fleet:
        w = fleet.workers[0]
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            assert (
                by_index(await collect(stub, request(PROMPT, max_new=2)))[
                    0
                ].complete.completion_tokens
                == 2
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await collect(stub, request(PROMPT, max_new=2))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert w.died
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.HealthCheck(pb.HealthCheckRequest(), timeout=2)
            assert err.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
        # The other worker of the fleet lives on.
        async with grpc.aio.insecure_channel(address(fleet.urls[1])) as ch:
            assert (
                await pb_grpc.SglangSchedulerStub(ch).HealthCheck(pb.HealthCheckRequest())
            ).healthy
