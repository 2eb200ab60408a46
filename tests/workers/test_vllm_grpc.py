"""The vLLM gRPC client behind the worker seam, against a simulated worker serving
vLLM's engine service over real gRPC on loopback (both Generate transports): the
pipeline's view is SGLang's (cumulative counts, request ids, server arguments), the
engine is detected by asking the worker, and what vLLM lacks is refused by name."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.client import WorkerClient
from gateway.workers.registry import WorkerRegistrationError, WorkerRegistry, with_engine
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from gateway.workers.vllm_grpc import VllmGrpcClient
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.worker import SimWorker
from tests.fake_transport import ArrivedCall

ZERO = dataclasses.replace(SimConfig().zero_cost(), eos_probability=0.0, page_size=16)


@pytest.fixture
async def vllm_worker() -> AsyncIterator[SimWorker]:
    worker = SimWorker(ZERO, engine="vllm")
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop(grace=0)


@pytest.fixture(params=["h2", "grpcio"])
async def client(request: pytest.FixtureRequest, vllm_worker: SimWorker) -> AsyncIterator[VllmGrpcClient]:
    c = VllmGrpcClient(vllm_worker.url, stream_transport=request.param)
    try:
        yield c
    finally:
        await c.close()


def _request(rid: str, *, stream: bool, n: int = 1, max_new: int = 6) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=rid, stream=stream)
    req.tokenized.input_ids.extend(range(100, 140))
    req.sampling_params.temperature = 0.0
    req.sampling_params.n = n
    req.sampling_params.max_new_tokens = max_new
    return req


async def _all(c: VllmGrpcClient, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = c.generate(req, timeout=10)
    out = []
    while (got := await call.read()) is not END_OF_STREAM:
        assert isinstance(got, pb.GenerateResponse)
        out.append(got)
    return out


async def test_a_streamed_generation_reads_as_sglang_cumulative_counts(client: VllmGrpcClient) -> None:
    replies = await _all(client, _request("s1", stream=True, max_new=6))
    chunks = [r.chunk for r in replies if r.HasField("chunk")]
    (done,) = [r.complete for r in replies if r.HasField("complete")]
    assert all(r.request_id == "s1" for r in replies)  # vLLM's replies carry none: filled in
    ids = [t for c in chunks for t in c.token_ids]
    assert len(ids) == 6
    assert [c.completion_tokens for c in chunks] == list(range(1, 7))  # running totals, not per chunk
    assert done.completion_tokens == 6 and done.finish_reason == "length"
    assert list(done.output_ids) == list(chunks[-1].token_ids)  # the complete repeats the last chunk
    assert done.prompt_tokens == 40


async def test_unstreamed_samples_keep_their_own_index(client: VllmGrpcClient) -> None:
    replies = await _all(client, _request("u1", stream=False, n=3, max_new=4))
    completes = [r.complete for r in replies]
    assert sorted(c.index for c in completes) == [0, 1, 2]
    assert all(c.completion_tokens == len(c.output_ids) == 4 for c in completes)


async def test_prefix_reuse_is_reported_as_cached_tokens(client: VllmGrpcClient) -> None:
    await _all(client, _request("c1", stream=True))
    replies = await _all(client, _request("c2", stream=True))
    assert replies[-1].complete.cached_tokens >= 32  # two whole 16-token pages of the prompt


async def test_logprobs_come_back_with_input_logprobs_from_the_start_asked(client: VllmGrpcClient) -> None:
    req = _request("lp", stream=True, max_new=3)
    req.return_logprob = True
    req.top_logprobs_num = 2
    req.logprob_start_len = 38
    replies = await _all(client, req)
    first = replies[0].chunk
    assert len(first.output_logprobs.token_ids) == len(first.token_ids)
    assert all(len(row.token_ids) == 2 for row in first.output_logprobs.top_logprobs)
    assert list(first.input_logprobs.token_ids) == [138, 139]  # positions 38.. of the prompt


@pytest.mark.parametrize(
    ("feature", "change"),
    [
        ("token_ids_logprob", lambda r: r.token_ids_logprob.append(5)),
        ("lora", lambda r: setattr(r, "lora_id", "adapter-1")),
        ("hidden_states", lambda r: setattr(r, "return_hidden_states", True)),
    ],
)
async def test_a_request_needing_a_lacking_feature_is_refused_by_name(
    client: VllmGrpcClient, vllm_worker: SimWorker, feature: str, change: object
) -> None:
    req = _request("no", stream=True)
    change(req)  # type: ignore[operator]
    before = vllm_worker.counters.requests
    with pytest.raises(WorkerCallError) as caught:
        await client.generate(req).read()
    assert caught.value.code is CallCode.INVALID_ARGUMENT and caught.value.rejected
    assert "vllm/grpc" in caught.value.message and feature in client.lacks
    assert vllm_worker.counters.requests == before  # refused before the wire


async def test_server_info_reads_as_sglang_server_arguments(client: VllmGrpcClient, vllm_worker: SimWorker) -> None:
    info = await client.server_info()
    assert info.max_total_num_tokens == vllm_worker.cache.capacity  # learned from GetLoads
    assert info.server_args["page_size"] == 16
    assert info.server_args["context_length"] == vllm_worker.config.context_length
    assert info.server_args["max_running_requests"] == vllm_worker.config.max_running_requests
    model = await client.model_info()
    assert model.served_model_name == vllm_worker.config.served_name
    assert list(model.eos_token_ids) == list(vllm_worker.vocab.eos_ids)
    loads = await client.loads()
    assert loads.dp_rank_count == 1 and loads.loads[0].max_total_num_tokens == vllm_worker.cache.capacity
    assert (await client.health_check()).healthy
    again = await client.server_info()
    assert again.start_time == info.start_time and info.start_time.seconds > 0  # no restart seen between polls


async def test_abort_ends_the_stream_without_a_complete(vllm_worker: SimWorker) -> None:
    vllm_worker.config.step_base_s = 0.05  # slow enough to abort mid-way
    client = VllmGrpcClient(vllm_worker.url)
    try:
        call = client.generate(_request("ab", stream=True, max_new=500), timeout=10)
        first = await call.read()
        assert isinstance(first, pb.GenerateResponse) and first.HasField("chunk")
        assert await client.abort("ab")
        rest = []
        while (got := await call.read()) is not END_OF_STREAM:
            rest.append(got)
        assert not any(isinstance(r, pb.GenerateResponse) and r.HasField("complete") for r in rest)
    finally:
        await client.close()


async def test_the_engine_is_detected_by_asking_the_worker(vllm_worker: SimWorker) -> None:
    sglang = SimWorker(ZERO)
    await sglang.start()
    try:
        found = await with_engine(WorkerClient(vllm_worker.url), None, 5.0)
        assert isinstance(found, VllmGrpcClient) and found.kind == "vllm/grpc"
        await found.close()
        kept = await with_engine(WorkerClient(sglang.url), "auto", 5.0)
        assert type(kept) is WorkerClient
        await kept.close()
        named = await with_engine(WorkerClient(vllm_worker.url), "vllm", 5.0)
        assert isinstance(named, VllmGrpcClient)
        await named.close()
    finally:
        await sglang.stop(grace=0)


async def test_registration_shows_what_the_engine_lacks_and_refuses_pd_roles(vllm_worker: SimWorker) -> None:
    registry = WorkerRegistry()
    try:
        worker = await registry.add(vllm_worker.url)
        row = worker.describe()
        assert row["kind"] == "vllm/grpc"
        assert "token_ids_logprob" in row["lacks"] and "pd_bootstrap" in row["lacks"]  # type: ignore[operator]
        assert worker.info.kv_capacity_tokens == vllm_worker.cache.capacity and worker.info.page_size == 16
        other = SimWorker(ZERO, engine="vllm")
        await other.start()
        try:
            with pytest.raises(WorkerRegistrationError, match="prefill role"):
                await registry.add(other.url, role="prefill", bootstrap_port=9)
        finally:
            await other.stop(grace=0)
    finally:
        await registry.close()


async def test_ready_is_the_inner_calls_so_the_relay_batches_what_arrived_together() -> None:
    from gateway.proto import vllm_engine_pb2 as vpb
    from gateway.workers import vllm_grpc_wire as wire
    from gateway.workers.vllm_grpc import _TranslatedCall

    def reply(ids: list[int]) -> vpb.GenerateResponse:
        return vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(token_ids=ids, completion_tokens=len(ids)))

    inner = ArrivedCall(reply([1]), reply([2]))
    call = _TranslatedCall(inner, wire.ReplyReader(_request("b1", stream=True)))
    assert call.ready()
    got = await call.read()
    assert not isinstance(got, type(END_OF_STREAM)) and list(got.chunk.token_ids) == [1]
    assert call.ready()  # the second reply has arrived too: read would not wait
    await call.read()
    assert not call.ready()  # nothing more has arrived: the relay hands its batch over now


@pytest.mark.parametrize("transport", ["h2", "grpcio"])
async def test_a_stream_read_to_its_end_is_ready_over_h2_and_cannot_tell_over_grpcio(
    vllm_worker: SimWorker, transport: str
) -> None:
    c = VllmGrpcClient(vllm_worker.url, stream_transport=transport)
    try:
        call = c.generate(_request("e1", stream=True, max_new=3), timeout=10)
        while await call.read() is not END_OF_STREAM:
            pass
        assert call.ready() is (transport == "h2")  # the ended h2 call answers at once; grpc.aio cannot tell
    finally:
        await c.close()
