"""Live calls: the gateway's vLLM gRPC client against a VllmEngine servicer written on
the OFFICIAL smg-grpc-proto classes (official_side.py `serve-vllm`, a subprocess).

The official side logs every request as its classes parsed it: none may carry a field
they do not know, and each must say what the gateway meant in vLLM's terms. The replies,
shaped as vLLM's servicer sends them, must read as the seam's (SGLang's) messages."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.transport import END_OF_STREAM
from gateway.workers.vllm_grpc import VllmGrpcClient

from . import scenario as peer
from .official import official_server, read_log


@pytest.fixture(scope="module")
def official_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("official-vllm") / "requests.jsonl"
    with official_server(log, command="serve-vllm") as port:
        yield f"grpc://127.0.0.1:{port}", log


@pytest.fixture(params=["h2", "grpcio"])
async def client(request: pytest.FixtureRequest, official_vllm: tuple[str, Path]) -> AsyncIterator[VllmGrpcClient]:
    c = VllmGrpcClient(official_vllm[0], stream_transport=request.param)
    try:
        yield c
    finally:
        await c.close()


def _received(log: Path, method: str) -> list[dict]:
    entries = [e for e in read_log(log) if e["method"] == method]
    assert all(e["unknown"] == [] for e in entries), f"the official side saw unknown fields in {method}"
    return [e["canonical"] for e in entries]


async def _replies(c: VllmGrpcClient, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = c.generate(request, timeout=10)
    out = []
    while (got := await call.read()) is not END_OF_STREAM:
        assert isinstance(got, pb.GenerateResponse)
        out.append(got)
    return out


def _request(rid: str, stream: bool) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=rid, stream=stream, data_parallel_rank=0, return_logprob=True,
                             top_logprobs_num=3, logprob_start_len=-1)
    req.tokenized.input_ids.extend([7, 8, 9])
    sp = req.sampling_params
    sp.temperature, sp.top_k, sp.top_p, sp.n, sp.max_new_tokens = 0.0, -1, 0.9, 2, 12
    sp.stop_token_ids.append(2)
    sp.json_schema = '{"type": "object"}'
    return req


async def test_generate_both_ways_reads_as_the_seams_messages(
    client: VllmGrpcClient, official_vllm: tuple[str, Path]
) -> None:
    streamed = await _replies(client, _request(f"live-s-{id(client)}", True))
    for index in (0, 1):
        mine = [r for r in streamed if (r.chunk.index if r.HasField("chunk") else r.complete.index) == index]
        chunks = [r.chunk for r in mine if r.HasField("chunk")]
        (done,) = [r.complete for r in mine if r.HasField("complete")]
        assert [list(c.token_ids) for c in chunks] == [list(ids) for ids in peer.VLLM_STREAM]
        assert [c.completion_tokens for c in chunks] == [2, 3]  # running totals from per-chunk counts
        assert done.completion_tokens == 3 and done.matched_token_id == 13 and done.cached_tokens == peer.VLLM_CACHED
    assert {r.request_id for r in streamed} == {f"live-s-{id(client)}"}
    whole = await _replies(client, _request(f"live-u-{id(client)}", False))
    assert sorted(r.complete.index for r in whole) == [0, 1]
    assert all(r.complete.completion_tokens == 3 and r.complete.finish_reason == "length" for r in whole)

    (sent,) = [g for g in _received(official_vllm[1], "Generate") if g["request_id"] == f"live-s-{id(client)}"]
    sp = sent["sampling_params"]
    assert sent["tokenized"]["input_ids"] == [7, 8, 9] and sent["stream"] is True
    assert sent["data_parallel_rank"] == 0  # a pinned rank 0 is present, not "unpinned"
    assert sp["temperature"] == 0.0 and "top_k" not in sp  # greedy sent; top-k off is vLLM's 0
    assert sp["max_tokens"] == 12 and sp["n"] == 2 and sp["stop_token_ids"] == [2]
    assert sp["logprobs"] == 3 and "prompt_logprobs" not in sp
    assert sp["json_schema"] == '{"type": "object"}'


async def test_unary_calls_read_as_sglangs(client: VllmGrpcClient, official_vllm: tuple[str, Path]) -> None:
    info = await client.server_info()
    assert info.max_total_num_tokens == peer.VLLM_KV and info.server_args["page_size"] == peer.VLLM_BLOCK
    assert info.server_args["context_length"] == peer.VLLM_CONTEXT and info.server_args["max_running_requests"] == 8
    model = await client.model_info()
    assert model.served_model_name == "m" and list(model.eos_token_ids) == [2]
    loads = await client.loads()
    assert loads.aggregate.total_waiting_reqs == 2 and loads.loads[0].max_total_num_tokens == peer.VLLM_KV
    assert (await client.health_check()).healthy
    assert await client.abort(f"gone-{id(client)}")
    embed = pb.EmbedRequest(request_id="e")
    embed.tokenized.input_ids.extend([1, 2, 3])
    got = await client.embed(embed)
    assert list(got.embedding) == [0.5, -0.5] and got.prompt_tokens == 3
    assert {"request_ids": [f"gone-{id(client)}"]} in _received(official_vllm[1], "Abort")
    assert _received(official_vllm[1], "Embed")[-1]["tokenized"]["input_ids"] == [1, 2, 3]
