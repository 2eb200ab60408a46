"""The SGLang gRPC client behind the worker seam: a real grpc.aio worker on loopback
that fails its calls, read through both Generate transports (the gateway's HTTP/2
reader and grpc.aio). Whatever fails leaves the client as ``WorkerCallError`` with the
worker's code and words, never as a grpc exception, and a stream ends with
``END_OF_STREAM``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from gateway.proto import common_pb2, sglang_scheduler_pb2_grpc
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.client import WorkerClient, call_error
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError


class FailingWorker(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    """Generate by request id: "ok" streams and ends, "late" fails after one chunk, "bad"
    refuses; the other RPCs fail with their own code."""

    async def Generate(self, request: pb.GenerateRequest, context: aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        if request.request_id == "bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stop strings need a tokenizer")
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[7]))
        if request.request_id == "late":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "going down")
        yield pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[7], finish_reason="stop"))

    async def HealthCheck(self, request: Any, context: aio.ServicerContext) -> pb.HealthCheckResponse:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
        raise AssertionError("unreachable")

    async def SubscribeKvEvents(self, request: Any, context: aio.ServicerContext) -> AsyncIterator[common_pb2.KvEventBatch]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "kv events are not configured")
        yield common_pb2.KvEventBatch()


@pytest.fixture
async def worker_url() -> AsyncIterator[str]:
    server = aio.server()
    sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server(FailingWorker(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        await server.stop(0)


@pytest.fixture(params=["h2", "grpcio"])
async def client(request: pytest.FixtureRequest, worker_url: str) -> AsyncIterator[WorkerClient]:
    c = WorkerClient(worker_url, stream_transport=request.param)
    try:
        yield c
    finally:
        await c.close()


async def test_a_stream_ends_with_the_marker(client: WorkerClient) -> None:
    call = client.generate(pb.GenerateRequest(request_id="ok"), timeout=5.0)
    first = await call.read()
    assert isinstance(first, pb.GenerateResponse) and list(first.chunk.token_ids) == [7]
    last = await call.read()
    assert isinstance(last, pb.GenerateResponse) and last.complete.finish_reason == "stop"
    assert await call.read() is END_OF_STREAM


async def test_a_failure_after_output_is_the_gateways_error(client: WorkerClient) -> None:
    call = client.generate(pb.GenerateRequest(request_id="late"), timeout=5.0)
    assert isinstance(await call.read(), pb.GenerateResponse)
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert not isinstance(err.value, grpc.RpcError)
    assert (err.value.code, err.value.message) == (CallCode.UNAVAILABLE, "going down")
    assert err.value.retryable and not err.value.rejected


async def test_a_refused_request_is_rejected_not_retried(client: WorkerClient) -> None:
    call = client.generate(pb.GenerateRequest(request_id="bad"), timeout=5.0)
    with pytest.raises(WorkerCallError) as err:
        await call.read()
    assert (err.value.code, err.value.message) == (CallCode.INVALID_ARGUMENT, "stop strings need a tokenizer")
    assert err.value.rejected and not err.value.retryable


async def test_unary_and_streaming_rpcs_fail_in_the_gateways_terms(client: WorkerClient) -> None:
    with pytest.raises(WorkerCallError) as err:
        await client.health_check(timeout=5.0)
    assert (err.value.code, err.value.message) == (CallCode.RESOURCE_EXHAUSTED, "busy")
    with pytest.raises(WorkerCallError) as err:
        async for _ in client.subscribe_kv_events():
            pass
    assert err.value.code is CallCode.UNIMPLEMENTED


async def test_an_unreachable_worker_is_unavailable() -> None:
    c = WorkerClient("grpc://127.0.0.1:1", stream_transport="grpcio")
    try:
        with pytest.raises(WorkerCallError) as err:
            await c.model_info(timeout=2.0)
        assert err.value.code in (CallCode.UNAVAILABLE, CallCode.DEADLINE_EXCEEDED)
    finally:
        await c.close()


@pytest.mark.parametrize("status", list(grpc.StatusCode))
def test_every_grpc_status_has_its_code(status: grpc.StatusCode) -> None:
    err = call_error(aio.AioRpcError(status, aio.Metadata(), aio.Metadata(), details="why"))
    assert err.code.name == status.name and err.message == "why"


def test_a_message_over_the_channel_bound_is_reply_too_large() -> None:
    details = "Stream removed (CLIENT: Received message larger than max (5000123 vs. 4194304))"
    err = call_error(aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, aio.Metadata(), aio.Metadata(), details=details))
    assert isinstance(err, ReplyTooLarge) and (err.size, err.bound) == (5000123, 4194304)
    overloaded = call_error(aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, aio.Metadata(), aio.Metadata(), details="busy"))
    assert not isinstance(overloaded, ReplyTooLarge)


async def test_generate_runs_on_a_channel_sized_for_its_reply() -> None:
    client = WorkerClient("grpc://127.0.0.1:1", stream_transport="grpcio")
    try:
        assert client.bounded_channel(100) is client.tokenizer_channel()  # the control channel
        big = client.bounded_channel(10 << 20)
        assert big is client.bounded_channel(12 << 20) and big is not client.bounded_channel(100 << 20)
    finally:
        await client.close()
