"""The gateway as an SGLang scheduler: clients written for one worker, pointed at the fleet.

One client is built on the official ``smg-grpc-proto`` stubs (in a subprocess, see
tests/interop/official.py); the rest use the project's stubs.
"""

from __future__ import annotations

import asyncio
import hashlib

import grpc
import pytest
from google.protobuf import json_format
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway.server.grpc.server import GATEWAY_SERVICE, SCHEDULER_SERVICE
from tests.e2e.grpc.conftest import GrpcStack
from tests.interop.official import run_official
from tests.interop.populate import canonical

PROMPT = list(range(1000, 1040))
MAX_NEW = 8


def _request(rid: str, *, n: int = 1, stream: bool = True, **kw: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, tokenized=pb.TokenizedInput(input_ids=PROMPT), stream=stream,
        sampling_params=pb.SamplingParams(temperature=1.0, n=n, max_new_tokens=MAX_NEW, ignore_eos=True, stream_interval=3),
        **kw,  # type: ignore[arg-type]
    )


# Without load polls: a GetLoads answer taken while the streamed request waited on its
# worker still says so when the unary one is routed a moment later (the next poll is up to
# half a second away), and its 40 waiting prompt tokens, no longer queued by the gateway,
# read as another client's queue on the holder: more than the 32 cached tokens save, so
# the repeat went to the other worker. How often a poll falls in that wait depends on the
# host's load; the routing this test checks is the tree's and the gateway's own counts.
@pytest.mark.slow
@pytest.mark.stack(workers=2, policy="cache_aware", sim={"eos_probability": 0.0},
                   sections={"load_monitor": {"load_poll_interval_s": 0}})
async def test_official_client_against_the_gateway(gstack: GrpcStack) -> None:
    unary = ["HealthCheck", "GetModelInfo", "GetServerInfo", "GetLoads"]
    out = await asyncio.to_thread(
        run_official, "client",
        {"target": gstack.target, "generate": canonical(_request("official")), "unary": unary, "timeout": 20},
        timeout=60,
    )
    for entries in out["generate"].values():
        assert all(e["unknown"] == [] for e in entries)
    streamed = [json_format.ParseDict(e["canonical"], pb.GenerateResponse()) for e in out["generate"]["stream"]]
    kinds = [r.WhichOneof("response") for r in streamed]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
    assert sum(len(r.chunk.token_ids) for r in streamed[:-1]) == MAX_NEW
    assert {r.request_id for r in streamed} == {"official-stream"}
    (whole,) = [json_format.ParseDict(e["canonical"], pb.GenerateResponse()) for e in out["generate"]["unary"]]
    assert len(whole.complete.output_ids) == MAX_NEW and whole.complete.finish_reason == "length"
    assert whole.complete.cached_tokens > 0  # cache_aware sent the same prompt to the worker that holds it

    replies = {m: out["unary"][m]["canonical"] for m in unary}
    assert all(out["unary"][m]["unknown"] == [] for m in unary)
    assert replies["HealthCheck"]["healthy"] is True
    assert replies["GetModelInfo"]["served_model_name"] == gstack.model
    assert replies["GetLoads"]["dp_rank_count"] == 2
    assert [row.get("dp_rank", 0) for row in replies["GetLoads"]["loads"]] == [0, 1]
    # Every worker request went through the gateway's accounting and ended.
    assert sum(w.load.total_requests for w in gstack.http.state.registry.all()) == 2
    assert all(w.load.in_flight == 0 for w in gstack.http.state.registry.all())


@pytest.mark.stack(workers=2, sim={"eos_probability": 0.0})
async def test_n2_indices_and_logprobs_relayed(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        replies = [m async for m in stub.Generate(_request("n2", n=2, return_logprob=True, top_logprobs_num=2, logprob_start_len=0))]
        chunks = [m.chunk for m in replies if m.HasField("chunk")]
        completes = [m.complete for m in replies if m.HasField("complete")]
        assert sorted(c.index for c in completes) == [0, 1]
        for index in (0, 1):
            mine = [c for c in chunks if c.index == index]
            assert sum(len(c.token_ids) for c in mine) == MAX_NEW
            assert all(len(c.output_logprobs.token_logprobs) == len(c.token_ids) for c in mine)
            assert all(len(row.values) == 2 for c in mine for row in c.output_logprobs.top_logprobs)
        assert sum(1 for c in chunks if c.HasField("input_logprobs")) >= 1

        # Not streamed, SGLang's workers say index 0 for every sample; the relay numbers
        # them in the order they come, so no two completions share an index.
        whole = [m async for m in stub.Generate(_request("n2-whole", n=2, stream=False))]
        assert [m.complete.index for m in whole] == [0, 1]
        assert all(len(m.complete.output_ids) == MAX_NEW for m in whole)


@pytest.mark.stack(workers=2)
async def test_fleet_unary_calls(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        probes = sum(w.counters.health_checks for w in gstack.http.fleet.workers)  # registration probed each once
        health = await stub.HealthCheck(pb.HealthCheckRequest())
        assert health.healthy and "2 of 2" in health.message
        assert sum(w.counters.health_checks for w in gstack.http.fleet.workers) == probes  # no GPU probe per call
        info = await stub.GetModelInfo(pb.GetModelInfoRequest())
        assert info.served_model_name == gstack.model and info.vocab_size > 0
        server = await stub.GetServerInfo(pb.GetServerInfoRequest())
        assert server.max_total_num_tokens > 0 and server.server_args["dp_size"] == 1  # it takes no rank
        loads = await stub.GetLoads(pb.GetLoadsRequest(include=["all"]))
        assert loads.dp_rank_count == 2 and [row.dp_rank for row in loads.loads] == [0, 1]
        assert loads.aggregate.total_reqs == sum(row.num_total_reqs for row in loads.loads)
        one = await stub.GetLoads(pb.GetLoadsRequest(dp_rank=1))
        assert [row.dp_rank for row in one.loads] == [1] and one.dp_rank_count == 2

        data, sha = b"", ""
        async for chunk in stub.GetTokenizer(common_pb2.GetTokenizerRequest()):
            data += chunk.data
            sha = chunk.sha256 or sha
        assert data and hashlib.sha256(data).hexdigest() == sha

        flushed = await stub.FlushCache(common_pb2.FlushCacheRequest())
        assert flushed.success and "2 of 2" in flushed.message

        emb = await stub.Embed(pb.EmbedRequest(request_id="e1", tokenized=pb.TokenizedInput(input_ids=PROMPT)))
        assert len(emb.embedding) > 0 and emb.prompt_tokens == len(PROMPT)

        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stub.Generate(pb.GenerateRequest(request_id="empty")):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stub.Generate(pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[10**8]))):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.stack(workers=1, server={"api_keys": ["k1"]})
async def test_passthrough_checks_the_api_key(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        stub = pb_grpc.SglangSchedulerStub(channel)
        with pytest.raises(aio.AioRpcError) as err:
            await stub.GetModelInfo(pb.GetModelInfoRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(aio.AioRpcError) as err:
            async for _ in stub.Generate(_request("no-key")):
                pass
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        info = await stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=(("authorization", "Bearer k1"),))
        assert info.served_model_name == gstack.model


async def test_health_service_and_reflection(gstack: GrpcStack) -> None:
    async with aio.insecure_channel(gstack.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", GATEWAY_SERVICE, SCHEDULER_SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = reflect.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = await call.read()
        await call.done_writing()
        names = {s.name for s in reply.list_services_response.service}
        assert {GATEWAY_SERVICE, SCHEDULER_SERVICE, "grpc.health.v1.Health"} <= names
