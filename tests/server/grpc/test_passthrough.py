"""The SGLang scheduler API served by the gateway (server/grpc/passthrough.py): a client
of one SGLang worker gets the fleet, its Generate routed and relayed message for message,
held to /generate's rules; Abort reaches the serving worker; the fleet described."""

from __future__ import annotations

import grpc
import pytest
from grpc import aio

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from tests.fake_transport import HANG, chunk, complete, settle
from tests.server.grpc.grpc_gateway import grpc_gateway


def _generate(rid: str, ids: list[int], **sampling: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(request_id=rid, tokenized=pb.TokenizedInput(input_ids=ids),
                              sampling_params=pb.SamplingParams(**sampling), stream=True)  # type: ignore[arg-type]


async def test_generate_is_routed_and_relayed_message_for_message() -> None:
    async with grpc_gateway() as (state, server), aio.insecure_channel(server.target) as channel:
        worker = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        worker.script(chunk([7]), chunk([8]), complete([7, 8], finish="length"))
        stub = pb_grpc.SglangSchedulerStub(channel)
        replies = [r async for r in stub.Generate(_generate("p1", [1, 2, 3], max_new_tokens=2), timeout=10)]
        assert [r.WhichOneof("response") for r in replies] == ["chunk", "chunk", "complete"]
        assert [list(r.chunk.token_ids) for r in replies[:2]] == [[7], [8]] and replies[2].complete.finish_reason == "length"
        sent = worker.requests[-1]
        assert sent.request_id == "p1" and list(sent.tokenized.input_ids) == [1, 2, 3] and sent.sampling_params.max_new_tokens == 2


async def test_the_rules_of_generate_hold() -> None:
    async with grpc_gateway() as (_, server), aio.insecure_channel(server.target) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        bad = _generate("p2", [1], max_new_tokens=2)
        bad.custom_logit_processor = "serialized"
        with pytest.raises(aio.AioRpcError) as err:
            [r async for r in stub.Generate(bad, timeout=10)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "custom_logit_processor" in (err.value.details() or "")


async def test_abort_reaches_the_worker_serving_the_request() -> None:
    async with grpc_gateway() as (state, server), aio.insecure_channel(server.target) as channel:
        worker = state.transports["grpc://w1:1"]  # type: ignore[attr-defined]
        worker.script(chunk([7]), HANG)
        stub = pb_grpc.SglangSchedulerStub(channel)
        call = stub.Generate(_generate("long-1", [1, 2], max_new_tokens=50), timeout=10)
        first = await call.read()
        assert first.chunk.token_ids == [7]
        reply = await stub.Abort(pb.AbortRequest(request_id="long-1", reason="user"), timeout=5)
        assert reply.success
        for _ in range(100):  # bounded: the abort and the cancel land within a few loop turns
            if any(rid == "long-1" for rid, _ in worker.aborts):
                break
            await settle()
        assert any(rid == "long-1" for rid, _ in worker.aborts)
        call.cancel()


async def test_the_fleet_is_described() -> None:
    async with grpc_gateway(workers=2) as (_, server), aio.insecure_channel(server.target) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        assert (await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)).healthy
        info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
        assert info.served_model_name == "fake-model"
        loads = await stub.GetLoads(pb.GetLoadsRequest(), timeout=5)
        assert isinstance(loads, pb.GetLoadsResponse)
        with pytest.raises(aio.AioRpcError) as err:
            [b async for b in stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=5)]
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED  # per worker by nature
