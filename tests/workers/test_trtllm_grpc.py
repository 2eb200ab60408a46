"""The TensorRT-LLM gRPC client behind the worker seam, against a simulated worker serving
TensorRT-LLM's service over real gRPC on loopback (both Generate transports): the
pipeline's view is SGLang's (a streamed complete repeating the last chunk, server
arguments), the engine is detected by asking the worker after SGLang's and vLLM's
services, and what TensorRT-LLM lacks is refused by name or fails as UNIMPLEMENTED."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.client import WorkerClient
from gateway.workers.registry import WorkerRegistrationError, WorkerRegistry, with_engine
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from gateway.workers.trtllm_grpc import TrtllmGrpcClient
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.worker import SimWorker
from tests.fake_transport import ArrivedCall

ZERO = dataclasses.replace(SimConfig().zero_cost(), eos_probability=0.0, page_size=16)


@pytest.fixture
async def trt_worker() -> AsyncIterator[SimWorker]:
    worker = SimWorker(ZERO, engine="trtllm")
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop(grace=0)


@pytest.fixture(params=["h2", "grpcio"])
async def client(request: pytest.FixtureRequest, trt_worker: SimWorker) -> AsyncIterator[TrtllmGrpcClient]:
    c = TrtllmGrpcClient(trt_worker.url, stream_transport=request.param)
    await c.model_info()  # as the registry's probe does: the sequence length and vocabulary
    try:
        yield c
    finally:
        await c.close()


def _request(rid: str, *, stream: bool, n: int = 1, max_new: int | None = 6) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=rid, stream=stream)
    req.tokenized.input_ids.extend(range(100, 140))
    req.sampling_params.temperature = 0.0
    req.sampling_params.n = n
    if max_new is not None:
        req.sampling_params.max_new_tokens = max_new
    return req


async def _all(c: TrtllmGrpcClient, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = c.generate(req, timeout=10)
    out = []
    while (got := await call.read()) is not END_OF_STREAM:
        assert isinstance(got, pb.GenerateResponse)
        out.append(got)
    return out


async def test_a_streamed_generation_reads_as_sglangs(client: TrtllmGrpcClient) -> None:
    replies = await _all(client, _request("s1", stream=True, n=2, max_new=6))
    for index in (0, 1):
        chunks = [r.chunk for r in replies if r.HasField("chunk") and r.chunk.index == index]
        (done,) = [r.complete for r in replies if r.HasField("complete") and r.complete.index == index]
        assert len([t for c in chunks for t in c.token_ids]) == 6
        assert [c.completion_tokens for c in chunks] == list(range(1, 7))
        assert done.completion_tokens == 6 and done.finish_reason == "length"
        assert list(done.output_ids) == list(chunks[-1].token_ids)  # TensorRT-LLM sends all six: cut to SGLang's
    assert all(r.request_id == "s1" for r in replies)


async def test_unstreamed_samples_keep_their_own_index(client: TrtllmGrpcClient) -> None:
    completes = [r.complete for r in await _all(client, _request("u1", stream=False, n=3, max_new=4))]
    assert sorted(c.index for c in completes) == [0, 1, 2]
    assert all(c.completion_tokens == len(c.output_ids) == 4 for c in completes)


async def test_no_token_limit_is_what_the_sequence_length_leaves(client: TrtllmGrpcClient, trt_worker: SimWorker) -> None:
    trt_worker.config.eos_probability = 1.0  # ends at once: the limit is what is checked
    await _all(client, _request("nolimit", stream=False, max_new=None))
    sent = trt_worker.received[-1]
    assert sent.sampling_params.max_new_tokens == trt_worker.config.context_length - 40


async def test_prefix_reuse_is_reported_as_cached_tokens(client: TrtllmGrpcClient) -> None:
    await _all(client, _request("c1", stream=True))
    replies = await _all(client, _request("c2", stream=True))
    assert replies[-1].complete.cached_tokens >= 32  # two whole 16-token pages of the prompt


async def test_logprobs_with_prompt_logprobs_from_the_start_asked(client: TrtllmGrpcClient) -> None:
    req = _request("lp", stream=True, max_new=3)
    req.return_logprob, req.top_logprobs_num, req.logprob_start_len = True, 2, 38
    replies = await _all(client, req)
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    assert all(len(c.output_logprobs.token_ids) == len(c.token_ids) for c in chunks)
    assert all(len(row.token_ids) == 2 for c in chunks for row in c.output_logprobs.top_logprobs)
    done = replies[-1].complete
    assert list(done.input_logprobs.token_ids) == [138, 139]  # positions 38.. of the prompt
    assert all(e.HasField("value") for e in done.input_logprobs.token_logprobs)


async def test_a_constraint_and_a_logit_bias_reach_the_worker(client: TrtllmGrpcClient, trt_worker: SimWorker) -> None:
    req = _request("cons", stream=False, max_new=2)
    req.sampling_params.regex = "[a-z]+"
    req.sampling_params.logit_bias["7"] = -5.0
    await _all(client, req)
    assert trt_worker.received[-1].sampling_params.regex == "[a-z]+"


@pytest.mark.parametrize(
    ("feature", "change"),
    [
        ("token_ids_logprob", lambda r: r.token_ids_logprob.append(5)),
        ("lora", lambda r: setattr(r, "lora_id", "adapter-1")),
        ("dp_rank", lambda r: setattr(r, "data_parallel_rank", 1)),
        ("pd_bootstrap", lambda r: setattr(r.disaggregated_params, "bootstrap_host", "h")),
    ],
)
async def test_a_request_needing_a_lacking_feature_is_refused_by_name(
    client: TrtllmGrpcClient, trt_worker: SimWorker, feature: str, change: object
) -> None:
    req = _request("no", stream=True)
    change(req)  # type: ignore[operator]
    before = trt_worker.counters.requests
    with pytest.raises(WorkerCallError) as caught:
        await client.generate(req).read()
    assert caught.value.code is CallCode.INVALID_ARGUMENT and caught.value.rejected
    assert "trtllm/grpc" in caught.value.message and feature in client.lacks
    assert trt_worker.counters.requests == before  # refused before the wire


async def test_what_the_service_has_no_rpc_for_fails_as_unimplemented(client: TrtllmGrpcClient) -> None:
    for call in (client.loads(), client.flush_cache()):
        with pytest.raises(WorkerCallError) as caught:
            await call
        assert caught.value.code is CallCode.UNIMPLEMENTED
    embed = pb.EmbedRequest(request_id="e")
    embed.tokenized.input_ids.extend([1, 2, 3])
    with pytest.raises(WorkerCallError) as caught:
        await client.embed(embed)
    assert caught.value.code is CallCode.UNIMPLEMENTED  # as TensorRT-LLM's own servicer answers
    assert {"loads", "flush_cache", "embed"} <= client.lacks


async def test_server_and_model_info_read_as_sglangs(client: TrtllmGrpcClient, trt_worker: SimWorker) -> None:
    info = await client.server_info()
    assert info.server_args["context_length"] == trt_worker.config.context_length
    assert info.server_args["max_running_requests"] == trt_worker.config.max_running_requests
    assert info.server_args["dp_size"] == 1 and "page_size" not in info.server_args
    model = await client.model_info()
    assert model.model_path == trt_worker.config.served_name and model.vocab_size == trt_worker.vocab.vocab_size
    assert (await client.health_check()).healthy
    chunks = [c async for c in client.tokenizer_chunks()]
    assert chunks and chunks[-1].sha256


async def test_abort_ends_the_stream_as_an_abort(trt_worker: SimWorker) -> None:
    trt_worker.config.step_base_s = 0.05  # slow enough to abort mid-way
    client = TrtllmGrpcClient(trt_worker.url)
    try:
        call = client.generate(_request("ab", stream=True, max_new=500), timeout=10)
        first = await call.read()
        assert isinstance(first, pb.GenerateResponse) and first.HasField("chunk")
        assert await client.abort("ab")
        rest = []
        while (got := await call.read()) is not END_OF_STREAM:
            assert isinstance(got, pb.GenerateResponse)
            rest.append(got)
        assert rest[-1].complete.finish_reason == "abort"  # TensorRT-LLM's "cancelled"
        assert not await client.abort("ab")  # gone: not found
    finally:
        await client.close()


async def test_the_engine_is_detected_by_asking_the_worker(trt_worker: SimWorker) -> None:
    found = await with_engine(WorkerClient(trt_worker.url), None, 5.0)
    assert isinstance(found, TrtllmGrpcClient) and found.kind == "trtllm/grpc"
    await found.close()
    named = await with_engine(WorkerClient(trt_worker.url), "trtllm", 5.0)
    assert isinstance(named, TrtllmGrpcClient)
    await named.close()
    with pytest.raises(WorkerRegistrationError, match="not served over this transport"):
        await with_engine(WorkerClient(trt_worker.url), "nonesuch", 5.0)


async def test_registration_shows_what_the_engine_lacks_and_refuses_pd_roles(trt_worker: SimWorker) -> None:
    registry = WorkerRegistry()
    try:
        worker = await registry.add(trt_worker.url)
        row = worker.describe()
        assert row["kind"] == "trtllm/grpc"
        assert {"loads", "pd_bootstrap", "flush_cache"} <= set(row["lacks"])  # type: ignore[arg-type]
        assert worker.model == trt_worker.config.served_name
        assert worker.info.max_running_requests == trt_worker.config.max_running_requests
        with pytest.raises(WorkerRegistrationError, match="prefill role"):
            other = SimWorker(ZERO, engine="trtllm")
            await other.start()
            try:
                await registry.add(other.url, role="prefill", bootstrap_port=9)
            finally:
                await other.stop(grace=0)
    finally:
        await registry.close()


async def test_ready_counts_translated_messages_waiting_and_the_inner_calls_replies() -> None:
    from gateway.proto import trtllm_service_pb2 as tpb
    from gateway.workers import trtllm_grpc_wire as wire
    from gateway.workers.trtllm_grpc import _TranslatedCall

    chunk = tpb.GenerateResponse(chunk=tpb.GenerateStreamChunk(token_ids=[11], prompt_tokens=4, completion_tokens=1))
    done = tpb.GenerateResponse(complete=tpb.GenerateComplete(
        output_token_ids=[11, 12], finish_reason="length", prompt_tokens=4, completion_tokens=2,
    ))
    inner = ArrivedCall(chunk, done)
    call = _TranslatedCall(inner, wire.ReplyReader(_request("b1", stream=True)))
    assert call.ready()
    first = await call.read()
    assert isinstance(first, pb.GenerateResponse) and list(first.chunk.token_ids) == [11]
    assert call.ready()  # the complete has arrived
    tail = await call.read()  # the complete reads as the id no chunk carried, then itself
    assert isinstance(tail, pb.GenerateResponse) and list(tail.chunk.token_ids) == [12]
    assert not inner.ready() and call.ready()  # the inner call is drained; its complete waits translated
    last = await call.read()
    assert isinstance(last, pb.GenerateResponse) and last.HasField("complete")
    assert not call.ready()


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_a_stream_read_to_its_end_is_ready_over_h2_and_cannot_tell_over_grpcio(
    trt_worker: SimWorker, transport: str
) -> None:
    c = TrtllmGrpcClient(trt_worker.url, stream_transport=transport)
    await c.model_info()
    try:
        call = c.generate(_request("e1", stream=True, max_new=3), timeout=10)
        while await call.read() is not END_OF_STREAM:
            pass
        assert call.ready() is (transport == "h2")  # the ended h2 call answers at once; grpc.aio cannot tell
    finally:
        await c.close()
