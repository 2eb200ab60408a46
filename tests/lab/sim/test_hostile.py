"""The hostile worker (gateway_lab/sim/hostile.py), seen from a plain gRPC client: each lie
of its plan as it goes on the wire, and the simulator's answers where the plan says nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.hostile import HostilePlan, hostile_worker
from tests.lab.sim.conftest import PROMPT, address, collect, request


@contextlib.asynccontextmanager
async def _stub(plan: HostilePlan, **sim: object) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with hostile_worker(plan, **sim) as url, grpc.aio.insecure_channel(
        address(url), options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


async def test_an_empty_plan_answers_as_the_simulator() -> None:
    async with _stub(HostilePlan(), served_model_name="honest", eos_probability=0.0) as stub:
        replies = await collect(stub, request(PROMPT, max_new=4))
        assert replies[-1].complete.completion_tokens == 4
        assert (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)).served_model_name == "honest"


async def test_a_flood_sends_its_tokens_whatever_was_asked_whole_or_in_chunks() -> None:
    plan = HostilePlan(flood_tokens=2500, chunk_tokens=1000, token_id=7)
    async with _stub(plan) as stub:
        whole = await collect(stub, request(PROMPT, max_new=4))
        streamed = await collect(stub, request(PROMPT, max_new=4, stream=True))
    assert [len(r.complete.output_ids) for r in whole] == [2500] and set(whole[0].complete.output_ids) == {7}
    chunks = [r.chunk for r in streamed if r.WhichOneof("response") == "chunk"]
    assert [len(c.token_ids) for c in chunks] == [1000, 1000, 500]
    assert streamed[-1].complete.finish_reason == "length" and plan.sent == [2500, 2500]


async def test_padding_makes_one_large_message() -> None:
    async with _stub(HostilePlan(flood_tokens=10, chunk_tokens=10, padding=5 << 20)) as stub:
        (reply,) = await collect(stub, request(PROMPT))
    assert len(reply.complete.matched_stop_str) == 5 << 20 and len(reply.complete.output_ids) == 10


async def test_an_endless_stream_runs_until_the_client_leaves() -> None:
    plan = HostilePlan(endless=True, gap_s=0.0)
    async with _stub(plan) as stub:
        call = stub.Generate(request(PROMPT, max_new=2, stream=True))
        seen = 0
        async for reply in call:
            seen += len(reply.chunk.token_ids)
            if seen == 50:  # 25 times what was asked, and still going
                break
        call.cancel()
        await asyncio.sleep(0.05)
        stopped = plan.sent[-1]
        await asyncio.sleep(0.05)
    assert seen == 50 and plan.sent[-1] == stopped  # cancelled: it sends no more


async def test_a_tokenizer_download_of_the_plans_making() -> None:
    def chunks() -> Iterator[common_pb2.GetTokenizerChunk]:
        yield common_pb2.GetTokenizerChunk(data=b"not a zip")

    async with _stub(HostilePlan(tokenizer_chunks=chunks)) as stub:
        got = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=5)]
    assert [c.data for c in got] == [b"not a zip"]


async def test_unknown_simulator_settings_are_refused() -> None:
    with pytest.raises(TypeError, match="no_such_knob"):
        async with hostile_worker(HostilePlan(), no_such_knob=1):
            pass
