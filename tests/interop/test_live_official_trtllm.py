"""Live calls: the gateway's TensorRT-LLM gRPC client against a TrtllmService servicer
written on the OFFICIAL smg-grpc-proto classes (official_side.py `serve-trtllm`, a
subprocess).

The official side logs every request as its classes parsed it: none may carry a field
they do not know, and each must say what the gateway meant in TensorRT-LLM's terms. The
replies, shaped as TensorRT-LLM's servicer sends them, must read as the seam's (SGLang's)
messages."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.transport import END_OF_STREAM
from gateway.workers.trtllm_grpc import TrtllmGrpcClient

from . import scenario as peer
from .official import official_server, read_log


@pytest.fixture(scope="module")
def official_trtllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("official-trtllm") / "requests.jsonl"
    with official_server(log, command="serve-trtllm") as port:
        yield f"grpc://127.0.0.1:{port}", log


@pytest.fixture(params=["h2", "grpcio"])
async def client(request: pytest.FixtureRequest, official_trtllm: tuple[str, Path]) -> AsyncIterator[TrtllmGrpcClient]:
    c = TrtllmGrpcClient(official_trtllm[0], stream_transport=request.param)
    try:
        yield c
    finally:
        await c.close()


def _received(log: Path, method: str) -> list[dict]:
    entries = [e for e in read_log(log) if e["method"] == method]
    assert all(e["unknown"] == [] for e in entries), f"the official side saw unknown fields in {method}"
    return [e["canonical"] for e in entries]


async def _replies(c: TrtllmGrpcClient, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = c.generate(request, timeout=10)
    out = []
    while (got := await call.read()) is not END_OF_STREAM:
        assert isinstance(got, pb.GenerateResponse)
        out.append(got)
    return out


def _request(rid: str, stream: bool, max_new: int | None = 12) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=rid, stream=stream, return_logprob=True, top_logprobs_num=3, logprob_start_len=-1)
    req.tokenized.input_ids.extend([7, 8, 9])
    sp = req.sampling_params
    sp.temperature, sp.top_k, sp.top_p, sp.n = 0.0, -1, 0.9, 2
    if max_new is not None:
        sp.max_new_tokens = max_new
    sp.stop_token_ids.append(2)
    sp.json_schema = '{"type": "object"}'
    sp.logit_bias["5"] = 1.5
    return req


async def test_generate_both_ways_reads_as_the_seams_messages(
    client: TrtllmGrpcClient, official_trtllm: tuple[str, Path]
) -> None:
    await client.model_info()  # the probe's: the sequence length and vocabulary
    rid = f"live-s-{id(client)}"
    streamed = await _replies(client, _request(rid, True))
    every = [t for ids in peer.TRT_STREAM for t in ids]
    for index in (0, 1):
        mine = [r for r in streamed if (r.chunk.index if r.HasField("chunk") else r.complete.index) == index]
        chunks = [r.chunk for r in mine if r.HasField("chunk")]
        (done,) = [r.complete for r in mine if r.HasField("complete")]
        assert [list(c.token_ids) for c in chunks] == [list(ids) for ids in peer.TRT_STREAM]  # the empty one dropped
        assert [c.completion_tokens for c in chunks] == [2, 3]
        assert list(done.output_ids) == list(peer.TRT_STREAM[-1]) and done.completion_tokens == len(every)
        assert done.finish_reason == "stop" and done.matched_token_id == every[-1] and done.cached_tokens == peer.TRT_CACHED
    assert {r.request_id for r in streamed} == {rid}
    whole = await _replies(client, _request(f"live-u-{id(client)}", False, max_new=None))
    assert sorted(r.complete.index for r in whole) == [0, 1]
    assert all(list(r.complete.output_ids) == every for r in whole)

    (sent,) = [g for g in _received(official_trtllm[1], "Generate") if g["request_id"] == rid]
    sc = sent["sampling_config"]
    assert sent["tokenized"]["input_token_ids"] == [7, 8, 9] and sent["streaming"] is True and sent["max_tokens"] == 12
    assert sc["temperature"] == 0.0 and "top_k" not in sc and sc["num_return_sequences"] == 2  # greedy is sent
    assert sent["stop_token_ids"] == [2] and sent["output_config"]["logprobs"] == 3
    assert sent["guided_decoding"] == {"guide_type": 2, "guide": '{"type": "object"}'}  # GUIDE_TYPE_JSON_SCHEMA
    assert len(sent["embedding_bias"]) == peer.TRT_VOCAB and sent["embedding_bias"][5] == 1.5
    (unary,) = [g for g in _received(official_trtllm[1], "Generate") if g["request_id"] == f"live-u-{id(client)}"]
    assert unary["max_tokens"] == peer.TRT_CONTEXT - 3  # no limit asked: what the sequence length leaves


async def test_unary_calls_read_as_sglangs(client: TrtllmGrpcClient, official_trtllm: tuple[str, Path]) -> None:
    info = await client.server_info()
    assert info.server_args["context_length"] == peer.TRT_CONTEXT and info.server_args["max_running_requests"] == 8
    model = await client.model_info()
    assert model.model_path == "org/m" and model.vocab_size == peer.TRT_VOCAB
    assert (await client.health_check()).healthy
    assert not await client.abort(f"gone-{id(client)}")
    assert {"request_id": f"gone-{id(client)}"} in _received(official_trtllm[1], "Abort")
