"""The vLLM HTTP client against a loopback HTTP peer answering as vLLM's OpenAI server
does, and the registry telling vLLM from SGLang by what answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.workers.registry import WorkerRegistrationError, WorkerRegistry, with_engine
from gateway.workers.sglang_http import SglangHttpClient
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.vllm_http import VllmHttpClient
from tests.workers.test_sglang_http import Peer, drain, reply, request, serving

MODELS = {"object": "list", "data": [{"id": "qwen", "root": "Qwen/Qwen3-0.6B", "max_model_len": 4096}]}
METRICS = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="500",enable_prefix_caching="True"} 1.0\n'
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="qwen"} 3.0\n'
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0\n'
)


def vllm_chunk(ids: list[int], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish, "stop_reason": None}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}}}


@pytest.fixture
async def vllm() -> AsyncIterator[tuple[Peer, VllmHttpClient]]:
    async with serving() as (p, url):
        p.routes["/v1/models"] = reply(MODELS)
        p.routes["/health"] = reply({})
        client = VllmHttpClient(url)
        try:
            yield p, client
        finally:
            await client.close()


async def test_model_and_generation_over_completions(vllm: tuple[Peer, VllmHttpClient]) -> None:
    p, client = vllm
    info = await client.model_info()
    assert info.served_model_name == "qwen" and info.model_path == "Qwen/Qwen3-0.6B" and info.max_context_length == 4096
    assert (await client.server_info()).server_args["served_model_name"] == "qwen"
    p.routes["/v1/completions"] = p.sse([vllm_chunk([5]), vllm_chunk([6], "length"), {"choices": [], "usage": {}}])
    got = await drain(client.generate(request()))
    assert [m.WhichOneof("response") for m in got] == ["chunk", "chunk", "complete"]
    assert got[0].chunk.cached_tokens == 2 and got[-1].complete.completion_tokens == 2
    body = p.bodies[-1]
    assert body["model"] == "qwen" and body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    p.routes["/v1/completions"] = reply({"choices": [{"index": 0, "token_ids": [8, 9], "finish_reason": "stop",
                                                      "stop_reason": 9}], "usage": {"prompt_tokens": 3}})
    (whole,) = await drain(client.generate(request(stream=False)))
    assert list(whole.complete.output_ids) == [8, 9] and whole.complete.matched_token_id == 9


async def test_a_pooling_server_is_told_apart_by_the_routes_it_serves(vllm: tuple[Peer, VllmHttpClient]) -> None:
    """/v1/models does not name the runner; vLLM registers /v1/completions for a generation
    model only, so its GET answers 405 there (POST-only) and 404 on a pooling server."""
    p, client = vllm
    assert (await client.model_info()).is_generation is False  # no such route: a pooling runner
    p.routes["/v1/completions"] = reply({"detail": "Method Not Allowed"}, 405)
    assert (await client.model_info()).is_generation is True
    p.routes["/v1/completions"] = reply({"detail": "busy"}, 503)
    assert (await client.model_info()).is_generation is True  # says nothing: generation, as before
    assert p.bodies == []  # the probe is a GET: no request reached an engine


async def test_a_request_with_no_cap_runs_to_the_context_the_card_reports(vllm: tuple[Peer, VllmHttpClient]) -> None:
    """/v1/completions would cap it at 16 tokens; vLLM's other routes run it to the context's end."""
    p, client = vllm
    await client.model_info()
    p.routes["/v1/completions"] = reply({"choices": [{"index": 0, "token_ids": [8], "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 3}})
    uncapped = request(stream=False)
    uncapped.sampling_params.ClearField("max_new_tokens")
    await drain(client.generate(uncapped))
    assert p.bodies[-1]["max_tokens"] == 4096 - 3


async def test_a_refused_prompt_is_a_refusal(vllm: tuple[Peer, VllmHttpClient]) -> None:
    p, client = vllm
    await client.model_info()
    p.routes["/v1/completions"] = reply({"object": "error", "message": "too long", "type": "BadRequestError"}, 400)
    with pytest.raises(WorkerCallError) as err:
        await drain(client.generate(request()))
    assert err.value.rejected and err.value.message == "too long"


async def test_loads_come_from_metrics(vllm: tuple[Peer, VllmHttpClient]) -> None:
    p, client = vllm

    async def metrics(_: Any) -> Any:
        from starlette.responses import PlainTextResponse
        return PlainTextResponse(METRICS)

    p.routes["/metrics"] = metrics
    server = await client.server_info()
    assert server.max_total_num_tokens == 8000 and server.server_args["page_size"] == 16
    load = (await client.loads()).loads[0]
    assert (load.num_running_reqs, load.num_waiting_reqs, load.num_total_reqs) == (3, 2, 5)
    assert not await client.abort("r")  # no abort route: closing the request aborts it
    assert client.kind == "vllm/http"
    with pytest.raises(WorkerCallError) as err:
        await client.tokenizer_zip()
    assert err.value.code is CallCode.UNIMPLEMENTED and "vLLM" in err.value.message


DP_METRICS = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="500"} 1.0\n'
    'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="500"} 1.0\n'
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="qwen"} 3.0\n'
    'vllm:num_requests_running{engine="1",model_name="qwen"} 1.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0\n'
    'vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0\n'
)


async def test_data_parallel_engines_are_ranks_named_in_a_header(vllm: tuple[Peer, VllmHttpClient]) -> None:
    p, client = vllm

    async def metrics(_: Any) -> Any:
        from starlette.responses import PlainTextResponse
        return PlainTextResponse(DP_METRICS)

    p.routes["/metrics"] = metrics
    server = await client.server_info()
    assert server.server_args["dp_size"] == 2 and server.max_total_num_tokens == 8000  # per rank
    loads = await client.loads()
    assert [(x.dp_rank, x.num_running_reqs, x.num_waiting_reqs) for x in loads.loads] == [(0, 3, 2), (1, 1, 0)]
    assert loads.dp_rank_count == 2 and loads.aggregate.total_reqs == 6
    assert "dp_rank" not in client.lacks
    p.routes["/v1/completions"] = p.sse([vllm_chunk([6], "length")])
    await drain(client.generate(request(data_parallel_rank=1)))
    assert p.headers[-1]["x-data-parallel-rank"] == "1"
    await drain(client.generate(request()))
    assert "x-data-parallel-rank" not in p.headers[-1]  # no rank named: vLLM balances its engines itself


async def test_the_engine_is_detected_or_named() -> None:
    async with serving() as (p, url):
        p.routes["/v1/models"] = reply(MODELS)
        detected = await with_engine(SglangHttpClient(url), None, 5.0)
        assert isinstance(detected, VllmHttpClient)
        await detected.close()
        p.routes["/get_model_info"] = reply({"model_path": "m", "is_generation": True})
        kept = await with_engine(SglangHttpClient(url), "auto", 5.0)
        assert isinstance(kept, SglangHttpClient)
        await kept.close()
        named = await with_engine(SglangHttpClient(url), "vllm", 5.0)  # the override wins
        assert isinstance(named, VllmHttpClient)
        await named.model_info()
        p.routes["/v1/models"] = reply({"object": "list", "data": [{"id": "m", "owned_by": "sglang"}]})
        with pytest.raises(WorkerCallError) as err:  # but SGLang's server, which also answers /v1/models, is told apart
            await named.model_info()
        assert err.value.code is CallCode.FAILED_PRECONDITION and "SGLang's server" in err.value.message
        await named.close()
        with pytest.raises(WorkerRegistrationError, match="not served over this transport"):
            await with_engine(SglangHttpClient(url), "trtllm", 5.0)


async def test_the_registry_registers_a_vllm_worker_by_detection() -> None:
    async with serving() as (p, url):
        p.routes["/v1/models"] = reply(MODELS)
        p.routes["/health"] = reply({})
        registry = WorkerRegistry()
        try:
            worker = await registry.add(url)
            assert worker.client.kind == "vllm/http" and worker.model == "qwen"
            assert worker.info.context_length_arg == 4096  # max_model_len is the context
        finally:
            await registry.close()


async def test_a_server_of_neither_engine_is_refused() -> None:
    async with serving() as (_, url):
        registry = WorkerRegistry()
        with pytest.raises(WorkerRegistrationError, match="did not answer its probe"):
            await registry.add(url)
        await registry.close()




def test_only_the_metrics_the_client_reads_reach_the_parser() -> None:
    """A real page is mostly histograms; the pure-Python Prometheus parser gets only the
    request gauges and the cache config, and reads them as it reads the whole page."""
    from prometheus_client.parser import text_string_to_metric_families

    from gateway.workers.vllm_http import read_lines

    noise = "".join(
        f'# TYPE vllm:e2e_request_latency_seconds histogram\nvllm:e2e_request_latency_seconds_bucket{{le="{b}"}} 0.0\n'
        for b in (0.1, 1.0, "+Inf")
    ) + 'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0\n'
    page = (noise + DP_METRICS + "# HELP python_gc_objects_collected_total x\npython_gc_objects_collected_total 5.0\n").encode()
    kept = read_lines(page)
    assert "histogram" not in kept and "python_gc" not in kept and "# TYPE" not in kept

    def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
        names = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:cache_config_info"}
        return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
                if s.name in names]

    assert samples(kept) == samples(page.decode()) and len(samples(kept)) == 6
