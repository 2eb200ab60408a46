"""The SGLang pass-through relays a worker's messages as they come, but never more tokens
than were asked for, and never an id outside the vocabulary."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc import aio

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway.server.grpc.server import start_grpc_server
from gateway_lab.sim.hostile import HostilePlan, hostile_worker
from tests.e2e.live_gateway import gateway


def _request(rid: str, max_new: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, tokenized=pb.TokenizedInput(input_ids=[9707, 11, 1879]), stream=True,
        sampling_params=pb.SamplingParams(temperature=1.0, n=1, max_new_tokens=max_new),
    )


@pytest.mark.parametrize("plan", [HostilePlan(endless=True), HostilePlan(flood_tokens=50_000)], ids=["endless", "flood"])
async def test_output_past_max_new_tokens_is_cut_with_length(tmp_path: Path, plan: HostilePlan) -> None:
    async with hostile_worker(plan) as url, gateway([url], tmp_path / "tok") as gw:
        server = await start_grpc_server(gw.state, "127.0.0.1", 0)
        try:
            async with aio.insecure_channel(server.target) as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                replies = await asyncio.wait_for(_collect(stub.Generate(_request("r1", 16))), 10)
        finally:
            await server.stop(0)
    tokens = [t for m in replies if m.HasField("chunk") for t in m.chunk.token_ids]
    assert len(tokens) == 16
    assert replies[-1].HasField("complete") and replies[-1].complete.finish_reason == "length"


async def test_an_id_outside_the_vocabulary_fails_the_call(tmp_path: Path) -> None:
    async with hostile_worker(HostilePlan(flood_tokens=3, token_id=151_700)) as url, gateway([url], tmp_path / "tok") as gw:
        server = await start_grpc_server(gw.state, "127.0.0.1", 0)
        try:
            async with aio.insecure_channel(server.target) as channel:
                stub = pb_grpc.SglangSchedulerStub(channel)
                with pytest.raises(aio.AioRpcError) as err:
                    await _collect(stub.Generate(_request("r2", 8)))
        finally:
            await server.stop(0)
    assert err.value.code() != grpc.StatusCode.OK and "vocabulary" in (err.value.details() or "")


async def _collect(call: aio.UnaryStreamCall) -> list[pb.GenerateResponse]:  # type: ignore[type-arg]
    return [m async for m in call]
