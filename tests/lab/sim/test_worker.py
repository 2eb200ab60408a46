"""One simulated worker (gateway_lab/sim/worker.py): its lifecycle and the standard health
service, SGLang-shaped server arguments and loads, aborts by request id, a cache flush
only when idle, and the exit fault."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.worker import SimWorker
from tests.lab.sim.conftest import ZERO, address, collect, request


async def test_lifecycle_health_and_the_reports() -> None:
    worker = SimWorker(dataclasses.replace(ZERO, role="prefill"))
    await worker.start()
    try:
        assert worker.url == f"grpc://127.0.0.1:{worker.port}" and worker.bootstrap_port
        async with grpc.aio.insecure_channel(address(worker.url)) as channel:
            status = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            await collect(pb_grpc.SglangSchedulerStub(channel), request([1, 2, 3, 4], max_new=3))
        args = worker.server_args()
        assert args["disaggregation_mode"] == "prefill" and args["context_length"] is None and args["grpc_mode"]
        assert args["page_size"] is None or args["page_size"] == ZERO.page_size
        load = worker.scheduler_load()
        assert load.max_total_num_tokens == ZERO.kv_capacity_tokens and load.disaggregation.mode == "prefill"
        stats = worker.stats()
        assert stats["requests"] == 1 and stats["role"] == "prefill" and stats["generated_tokens"] == 3
        assert 0 < worker.max_req_input_len < min(ZERO.context_length, ZERO.kv_capacity_tokens)
        assert worker.engine_load(full=True).max_total_num_tokens == ZERO.kv_capacity_tokens
    finally:
        await worker.stop()
    await worker.stop()  # twice is fine
    with pytest.raises(ValueError, match="engine must be one of"):
        SimWorker(ZERO, engine="tgi")


async def test_abort_and_flush_only_when_idle() -> None:
    worker = SimWorker(dataclasses.replace(ZERO, time_scale=1.0, decode_seq_s=0.01))
    await worker.start()
    try:
        async with grpc.aio.insecure_channel(address(worker.url)) as channel:
            stub = pb_grpc.SglangSchedulerStub(channel)
            call = stub.Generate(request([5, 6, 7], rid="long", stream=True, max_new=1000), timeout=20)
            await call.read()  # running now
            ok, message = await worker.flush_cache(0)
            assert not ok and "in flight" in message
            assert worker.abort("long") == 1 and worker.abort("unknown") == 0
            call.cancel()  # an aborted stream stays open, as SGLang's does: the client ends it
            ok, message = await worker.flush_cache(1.0)
            assert ok and message == "cache flushed" and worker.cache.tree_tokens == 0
    finally:
        await worker.stop()


async def test_the_exit_fault_kills_an_in_process_worker() -> None:
    died: list[bool] = []
    hooked = SimWorker(ZERO, on_die=lambda: died.append(True))
    hooked.die()
    assert died == [True] and not hooked.died  # a process-hosted worker's hook exits the process
    worker = SimWorker(ZERO)
    await worker.start()
    worker.die()
    for _ in range(100):  # bounded: the kill runs as a task
        if worker.stopping:
            break
        await asyncio.sleep(0)
    assert worker.died and worker.stopping
    with pytest.raises(grpc.aio.AioRpcError):
        async with grpc.aio.insecure_channel(address(worker.url)) as channel:
            await pb_grpc.SglangSchedulerStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=1)
