"""The canned fleet: nginx answers every call the gateway makes to a worker, and a real
gateway in front of it serves chat requests (non-streaming and streaming)."""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import openai
import pytest

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.bench.canned_fleet import CannedFleet, find_nginx, grpc_frame
from tests.e2e.http.conftest import _serve

pytestmark = pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (apt-get install -y nginx-light)")


@pytest.fixture(scope="module")
def fleet() -> Iterator[CannedFleet]:
    with CannedFleet(2, output_tokens=8) as f:
        yield f


@pytest.fixture
async def stub(fleet: CannedFleet) -> AsyncIterator[pb_grpc.SglangSchedulerStub]:
    async with grpc.aio.insecure_channel(fleet.addresses[0]) as channel:
        yield pb_grpc.SglangSchedulerStub(channel)


def test_frames_are_length_prefixed_protobuf(fleet: CannedFleet) -> None:
    body = fleet.generate_reply()
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    reply = pb.GenerateResponse.FromString(body[5:])
    assert reply.WhichOneof("response") == "complete"
    assert list(reply.complete.output_ids) == fleet.output_ids and reply.complete.finish_reason == "length"
    assert grpc_frame(pb.HealthCheckRequest()) == b"\x00\x00\x00\x00\x00"


async def test_answers_every_startup_and_control_call(fleet: CannedFleet, stub: pb_grpc.SglangSchedulerStub) -> None:
    health = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=5)
    assert health.healthy
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    assert info.served_model_name == fleet.model and info.is_generation and list(info.eos_token_ids)
    server = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert server.max_total_num_tokens == fleet.kv_capacity_tokens
    assert server.server_args["page_size"] == fleet.page_size and server.server_args["port"] == fleet.ports[0]
    loads = await stub.GetLoads(pb.GetLoadsRequest(include=["all"]), timeout=5)
    assert loads.dp_rank_count == 1 and loads.loads[0].num_running_reqs == 0
    assert loads.loads[0].max_total_num_tokens == fleet.kv_capacity_tokens
    abort = await stub.Abort(pb.AbortRequest(request_id="r1"), timeout=5)
    assert not abort.success  # nothing is ever in flight
    assert (await stub.FlushCache(common_pb2.FlushCacheRequest(), timeout=5)).success
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=30)]
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    assert "tokenizer.json" in zipfile.ZipFile(io.BytesIO(data)).namelist()


@pytest.mark.parametrize("stream", [False, True])
async def test_generate_replies_with_the_canned_output(fleet: CannedFleet, stub: pb_grpc.SglangSchedulerStub, stream: bool) -> None:
    request = pb.GenerateRequest(request_id="r1", tokenized=pb.TokenizedInput(input_ids=list(range(3000))), stream=stream)
    replies = [r async for r in stub.Generate(request, timeout=5)]
    assert [r.WhichOneof("response") for r in replies] == ["complete"]
    assert list(replies[0].complete.output_ids) == fleet.output_ids
    assert replies[0].complete.completion_tokens == 8


async def test_other_methods_are_unimplemented(stub: pb_grpc.SglangSchedulerStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Embed(pb.EmbedRequest(request_id="e"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=5).read()
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_gateway_in_front_serves_chat(tmp_path: Any) -> None:
    from gateway.server.config import GatewayConfig, ServerConfig
    from gateway.server.state import GatewayState

    with CannedFleet(2, output_tokens=8) as fleet:
        # no tokenizer path: the gateway downloads it from the canned GetTokenizer
        config = GatewayConfig(server=ServerConfig(worker_urls=fleet.urls, tokenizer_cache_dir=str(tmp_path / "tok")))
        config.policy.policy = "cache_aware"
        state = GatewayState(config)
        await state.start()
        server, task, url = await _serve(state)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
        try:
            model = state.catalog.names()[0]
            assert model == fleet.model
            messages: Any = [{"role": "user", "content": "00000001 hello there"}]
            reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=8)
            assert reply.choices[0].finish_reason == "length"
            assert reply.usage is not None and reply.usage.completion_tokens == 8
            assert reply.choices[0].message.content and reply.choices[0].message.content.strip()
            sent_prompt = reply.usage.prompt_tokens
            assert sent_prompt > 0  # the canned worker reports none: the gateway's own count

            stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True,
                                                          stream_options={"include_usage": True})  # fmt: skip
            pieces, finish, usage = [], None, None
            async for chunk in stream:
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                    finish = chunk.choices[0].finish_reason or finish
                usage = chunk.usage or usage
            assert "".join(pieces) == reply.choices[0].message.content and finish == "length"
            assert usage is not None and usage.completion_tokens == 8

            # reporting the gateway's count back, as a real worker does: the fidelity guard sees agreement
            fleet.set_prompt_tokens(sent_prompt)
            for _ in range(3):
                again = await client.chat.completions.create(model=model, messages=messages, max_tokens=8)
                assert again.usage is not None and again.usage.prompt_tokens == sent_prompt
            async with httpx.AsyncClient(trust_env=False) as http:
                metrics = (await http.get(url + "/metrics")).text
            mismatches = [ln for ln in metrics.splitlines() if ln.startswith("token_gateway_tokenizer_mismatch_total")]
            assert mismatches and all(float(ln.rsplit(" ", 1)[1]) == 0 for ln in mismatches)
        finally:
            await client.close()
            server.should_exit = True
            await task
            await state.stop()
