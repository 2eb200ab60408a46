"""The simulated worker's other RPCs: health, info, loads, abort, tokenizer, flush, embed."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import math
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.servicer import TOKENIZER_CHUNK_BYTES
from gateway_lab.sim.worker import SimWorker

from .conftest import PROMPT, address, by_index, cfg, collect, request

# Slow enough that requests are still running when the test looks (5 ms a step).
SLOW = cfg(step_base_s=0.005)


@pytest.fixture
async def slow() -> AsyncIterator[tuple[SimWorker, pb_grpc.SglangSchedulerStub]]:
    async with SimFleet.start(1, SLOW) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            yield fleet.workers[0], pb_grpc.SglangSchedulerStub(ch)


async def wait_until(predicate, timeout: float = 5.0) -> None:
    """Poll a condition (bounded) while the event loop runs the worker."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.005)


async def read_rest(call) -> list[pb.GenerateResponse]:
    """The remaining messages of a call already read with ``read()``."""
    out = []
    for _ in range(100_000):
        msg = await call.read()
        if msg is grpc.aio.EOF:
            return out
        out.append(msg)
    raise AssertionError("stream did not end")


def assert_released(w: SimWorker) -> None:
    assert w.scheduler.num_running == 0 and w.scheduler.num_waiting == 0
    assert w.cache.protected_tokens == 0 and w.cache.private_tokens == 0
    assert w.scheduler.reserved == 0
    w.cache.check_invariants()


async def test_health_check(stub: pb_grpc.SglangSchedulerStub, worker: SimWorker) -> None:
    r = await stub.HealthCheck(pb.HealthCheckRequest())
    assert r.healthy and worker.counters.health_checks == 1


async def test_model_info_answers_like_sglangs_servicer(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    """The fields SGLang's servicer fills with placeholders carry the same placeholders
    (clients must not trust them); the true values are in the model folder it reports."""
    r = await stub.GetModelInfo(pb.GetModelInfoRequest())
    assert r.model_path == r.served_model_name == "qwen3-sim" and r.is_generation
    assert list(r.eos_token_ids) == [] and r.vocab_size == 128256
    assert r.pad_token_id == 0 and r.bos_token_id == 1
    assert r.max_context_length == worker.cache.capacity == 65536  # the KV pool, not the context
    assert r.max_req_input_len == 32768 - 1 - 5
    assert json.loads(r.default_sampling_params_json) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    folder = Path(r.tokenizer_path)
    assert folder == worker.model_path and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] == 32768 and config["model_type"] == "qwen3"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643] and generation["top_k"] == 20


async def test_server_info_leaves_unset_arguments_null(
    stub: pb_grpc.SglangSchedulerStub, worker: SimWorker
) -> None:
    r = await stub.GetServerInfo(pb.GetServerInfoRequest())
    args = dict(r.server_args)
    assert args["page_size"] == 16 and args["model_path"] == "qwen3-sim"
    assert args["context_length"] is None and args["sampling_defaults"] == "model"
    assert args["disaggregation_mode"] == "null" and args["max_running_requests"] == 64
    assert args["chunked_prefill_size"] == 8192 and "disaggregation_bootstrap_port" in args
    assert dict(r.scheduler_info) == {
        "status": "ready", "max_total_num_tokens": 65536, "max_req_input_len": 32762,
    }
    assert r.max_total_num_tokens == worker.cache.capacity == 65536
    assert r.server_type == "grpc" and r.active_requests == 0 and r.uptime_seconds >= 0


async def test_page_size_is_null_unless_reported() -> None:
    async with SimFleet.start(1, cfg(report_page_size=False)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            r = await pb_grpc.SglangSchedulerStub(ch).GetServerInfo(pb.GetServerInfoRequest())
    assert dict(r.server_args)["page_size"] is None


async def test_standard_health_service(worker: SimWorker) -> None:
    async with grpc.aio.insecure_channel(address(worker.url)) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
    assert r.status == health_pb2.HealthCheckResponse.SERVING


async def test_loads_follow_the_real_queues() -> None:
    async with SimFleet.start(1, cfg(step_base_s=0.005, max_running_requests=2)) as fleet:
        w = fleet.workers[0]
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            calls = [
                stub.Generate(request([i, *PROMPT], rid=f"r{i}", stream=True, max_new=400))
                for i in range(2)
            ]
            for c in calls:
                await c.read()
            calls.append(stub.Generate(request([2, *PROMPT], rid="r2", stream=True, max_new=400)))
            await wait_until(lambda: w.scheduler.num_waiting == 1)
            r = await stub.GetLoads(pb.GetLoadsRequest())
            (load,) = r.loads
            assert (
                load.num_running_reqs == 2
                and load.num_waiting_reqs == 1
                and load.num_total_reqs == 3
            )
            assert load.num_waiting_uncached_tokens == len(PROMPT) + 1
            assert load.max_total_num_tokens == 65536 and load.max_running_requests == 2
            # The two running requests keep decoding (one step per 5 ms), so the cache can
            # only have grown since the reply was built.
            assert 0 < load.num_used_tokens <= w.cache.used_tokens
            assert load.token_usage == pytest.approx(load.num_used_tokens / 65536)
            assert load.utilization == pytest.approx(1.0)
            assert r.aggregate.total_running_reqs == 2 and r.aggregate.total_waiting_reqs == 1
            info = await stub.GetServerInfo(pb.GetServerInfoRequest())
            assert info.active_requests == 3
            record = w.engine_load(True)  # what KV-event batches carry
            assert (record.running_requests, record.waiting_requests) == (2, 1)
            assert (
                record.waiting_uncached_tokens == record.prefill_pending_tokens == len(PROMPT) + 1
            )
            assert record.HasField("engine_silence_ms") and record.max_total_num_tokens == 65536
            for c in calls:
                c.cancel()
            await wait_until(lambda: w.scheduler.num_running + w.scheduler.num_waiting == 0)
            assert_released(w)


async def test_abort_stops_the_work_and_leaves_the_stream_open(slow) -> None:
    """As on SGLang's server: after Abort the Generate stream sends nothing more and does
    not end (no message, no status) until the client cancels it."""
    w, stub = slow
    call = stub.Generate(request(PROMPT, rid="victim", stream=True, n=2, max_new=1000))
    first = await call.read()
    assert first.chunk.token_ids
    r = await stub.Abort(pb.AbortRequest(request_id="victim", reason="test"))
    assert r.success
    await wait_until(lambda: w.counters.aborted == 2)
    assert_released(w)
    rest: list[pb.GenerateResponse] = []
    with pytest.raises(TimeoutError):
        while True:
            msg = await asyncio.wait_for(call.read(), 0.5)
            assert msg is not grpc.aio.EOF, "the aborted stream ended"
            rest.append(msg)
    assert all(m.WhichOneof("response") == "chunk" for m in rest)  # sent before the abort landed
    call.cancel()
    missing = await stub.Abort(pb.AbortRequest(request_id="nobody"))
    assert not missing.success and "not found" in missing.message


async def test_abort_of_a_waiting_request(slow) -> None:
    w, stub = slow
    w.config.max_running_requests = 1
    blocker = stub.Generate(request(PROMPT, rid="blocker", stream=True, max_new=1000))
    await blocker.read()
    waiting = stub.Generate(request(PROMPT, rid="queued", stream=True, max_new=5))
    await wait_until(lambda: w.scheduler.num_waiting == 1)
    assert (await stub.Abort(pb.AbortRequest(request_id="queued"))).success
    await wait_until(lambda: w.scheduler.num_waiting == 0)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(waiting.read(), 0.3)
    waiting.cancel()
    blocker.cancel()
    await wait_until(lambda: w.scheduler.num_running == 0)
    assert_released(w)


async def test_client_cancel_releases_the_request(slow) -> None:
    w, stub = slow
    call = stub.Generate(request(PROMPT, rid="gone", stream=True, max_new=1000))
    await call.read()
    assert w.scheduler.num_running == 1 and w.cache.protected_tokens > 0
    call.cancel()
    await wait_until(lambda: w.scheduler.num_running == 0)
    assert w.counters.aborted == 1
    assert_released(w)


async def test_get_tokenizer_zip(stub: pb_grpc.SglangSchedulerStub) -> None:
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    assert len(chunks) > 1 and all(len(c.data) <= TOKENIZER_CHUNK_BYTES for c in chunks)
    assert all(not c.sha256 for c in chunks[:-1])
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
        assert {"tokenizer.json", "tokenizer_config.json"} <= names
        assert "<|im_end|>" in json.loads(zf.read("tokenizer_config.json"))["eos_token"]


async def test_flush_cache(slow) -> None:
    w, stub = slow
    await collect(stub, request(PROMPT, max_new=2))
    assert w.cache.tree_tokens > 0
    call = stub.Generate(request(PROMPT, rid="busy", stream=True, max_new=200))
    await call.read()
    r = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=0))
    assert not r.success and "in flight" in r.message
    r = await stub.FlushCache(common_pb2.FlushCacheRequest(timeout_s=5))  # waits for idle
    assert r.success
    assert w.cache.tree_tokens == 0 and w.scheduler.num_running == 0
    rest = await read_rest(call)
    assert rest[-1].complete.finish_reason == "length"
    again = by_index(await collect(stub, request(PROMPT, max_new=2)))[0].complete
    assert again.cached_tokens == 0


async def test_embed(stub: pb_grpc.SglangSchedulerStub, worker: SimWorker) -> None:
    def req(ids: list[int]) -> pb.EmbedRequest:
        return pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=ids))

    a = await stub.Embed(req(PROMPT))
    assert a.embedding_dim == worker.config.embed_dim == len(a.embedding)
    assert a.prompt_tokens == len(PROMPT)
    assert math.sqrt(sum(x * x for x in a.embedding)) == pytest.approx(1.0, rel=1e-5)
    assert list((await stub.Embed(req(PROMPT))).embedding) == list(a.embedding)
    assert list((await stub.Embed(req(PROMPT[:5]))).embedding) != list(a.embedding)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Embed(req([]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_dp_ranks_keep_their_own_caches_and_loads() -> None:
    async with SimFleet.start(1, cfg(dp_size=3)) as fleet:
        w = fleet.workers[0]
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            info = await stub.GetServerInfo(pb.GetServerInfoRequest())
            assert info.server_args["dp_size"] == 3

            def on(rank: int | None, rid: str) -> pb.GenerateRequest:
                req = request(PROMPT, rid=rid)
                if rank is not None:
                    req.data_parallel_rank = rank
                return req

            first = by_index(await collect(stub, on(1, "a")))[0].complete
            again = by_index(await collect(stub, on(1, "b")))[0].complete
            elsewhere = by_index(await collect(stub, on(2, "c")))[0].complete
            assert first is not None and again is not None and elsewhere is not None
            assert (first.cached_tokens, again.cached_tokens, elsewhere.cached_tokens) == (0, 32, 0)  # a cache per rank
            assert [r.cache.tree_tokens > 0 for r in w.ranks] == [False, True, True]
            # unpinned requests take turns: ranks 0, 1, 2
            for i in range(3):
                await collect(stub, request([5000 + i, *PROMPT], rid=f"rr{i}"))
            assert [r.scheduler.counters is w.counters for r in w.ranks] == [True] * 3
            assert w.ranks[0].cache.tree_tokens > 0
            loads = await stub.GetLoads(pb.GetLoadsRequest())
            assert loads.dp_rank_count == 3 and [x.dp_rank for x in loads.loads] == [0, 1, 2]
            assert [x.num_used_tokens > 0 for x in loads.loads] == [True, True, True]
            one = await stub.GetLoads(pb.GetLoadsRequest(dp_rank=2))
            assert [x.dp_rank for x in one.loads] == [2]
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await collect(stub, on(3, "d"))
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "out of range" in (bad.value.details() or "")
            assert w.stats()["dp_size"] == 3 and w.stats()["kv_capacity_tokens"] == 3 * w.cache.capacity
            flushed = await stub.FlushCache(common_pb2.FlushCacheRequest())
            assert flushed.success and all(r.cache.tree_tokens == 0 for r in w.ranks)
