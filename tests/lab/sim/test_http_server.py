"""The simulated SGLang HTTP server, read with a plain HTTP client the way SGLang's own
server is: ``/generate`` whole and streamed, errors, and the self-description routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway_lab.sim.http_server import SimHttpWorker, http_fleet
from tests.lab.sim.conftest import cfg


@pytest.fixture
async def sim() -> AsyncIterator[tuple[SimHttpWorker, httpx.AsyncClient]]:
    async with http_fleet(1, cfg()) as (worker,):
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            yield worker, http


def events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


BODY = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 4, "temperature": 0}}


async def test_a_whole_generate_and_its_cache_hit(sim: tuple[SimHttpWorker, httpx.AsyncClient]) -> None:
    worker, http = sim
    first = (await http.post("/generate", json=BODY)).json()
    assert len(first["output_ids"]) == 4 and first["meta_info"]["finish_reason"]["type"] == "length"
    assert first["meta_info"]["prompt_tokens"] == 40 and first["meta_info"]["completion_tokens"] == 4
    second = (await http.post("/generate", json=BODY)).json()
    assert second["meta_info"]["cached_tokens"] == 32  # whole pages of 16
    assert second["output_ids"] == first["output_ids"]  # same prompt, same seed, greedy
    assert worker.worker.counters.requests == 2


async def test_a_streamed_generate_is_cumulative_and_ends_with_done(sim: tuple[SimHttpWorker, httpx.AsyncClient]) -> None:
    _, http = sim
    got = events((await http.post("/generate", json={**BODY, "stream": True})).text)
    assert got[-1] == "[DONE]"
    answers = got[:-1]
    assert [len(a["output_ids"]) for a in answers] == [1, 2, 3, 4]
    assert [a["meta_info"]["finish_reason"] for a in answers[:-1]] == [None, None, None]
    assert answers[-1]["meta_info"]["finish_reason"]["type"] == "length"


async def test_n_samples_come_back_as_a_list(sim: tuple[SimHttpWorker, httpx.AsyncClient]) -> None:
    _, http = sim
    body = {**BODY, "sampling_params": {**BODY["sampling_params"], "n": 2, "temperature": 1.0}}
    got = (await http.post("/generate", json=body)).json()
    assert isinstance(got, list) and len(got) == 2


async def test_refusals_are_400_whole_and_an_error_event_streamed(sim: tuple[SimHttpWorker, httpx.AsyncClient]) -> None:
    _, http = sim
    bad = {"input_ids": [], "sampling_params": {}}
    whole = await http.post("/generate", json=bad)
    assert whole.status_code == 400 and "must not be empty" in whole.json()["error"]["message"]
    streamed = await http.post("/generate", json={**bad, "stream": True})
    assert streamed.status_code == 200
    got = events(streamed.text)
    assert "must not be empty" in got[0]["error"]["message"] and got[-1] == "[DONE]"
    assert (await http.post("/generate", content=b"{not json")).status_code == 400
    assert (await http.post("/generate", json={"text": "hi"})).status_code == 400


async def test_a_failing_worker_reports_an_error_event_after_its_tokens(sim: tuple[SimHttpWorker, httpx.AsyncClient]) -> None:
    worker, http = sim
    worker.worker.faults.fail_after_tokens = 2
    body = {**BODY, "stream": True, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    got = events((await http.post("/generate", json=body)).text)
    assert [len(a["output_ids"]) for a in got[:-2]] == [1, 2]
    assert "error" in got[-2] and got[-1] == "[DONE]"


async def test_self_description_routes(sim: tuple[SimHttpWorker, httpx.AsyncClient]) -> None:
    worker, http = sim
    assert (await http.get("/health")).status_code == 200
    info = (await http.get("/get_model_info")).json()
    assert info["model_path"] == worker.worker.config.model and info["is_generation"]
    server = (await http.get("/get_server_info")).json()
    assert server["max_total_num_tokens"] == worker.worker.cache.capacity and server["page_size"] == 16
    assert isinstance(server["internal_states"], list) and server["version"]
    (load,) = (await http.get("/get_load")).json()
    assert load["dp_rank"] == 0 and load["num_reqs"] == 0
    # SGLang 0.5.23's only loads route: per rank, a field at 0 left out (an idle rank 0: nothing).
    assert (await http.get("/v1/loads", params={"include": "core"})).json()["loads"] == [{}]
    assert (await http.post("/abort_request", json={"rid": "nothing"})).status_code == 200
    assert (await http.post("/flush_cache")).status_code == 200


async def test_abort_request_ends_a_running_stream() -> None:
    async with http_fleet(1, cfg(step_base_s=0.01, time_scale=1.0)) as (worker,):
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            body = {**BODY, "rid": "long-1", "stream": True,
                    "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}

            async def abort_soon() -> None:
                await asyncio.sleep(0.2)
                await http.post("/abort_request", json={"rid": "long-1"})

            aborter = asyncio.create_task(abort_soon())
            got = events((await http.post("/generate", json=body)).text)
            await aborter
    assert got[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(got[-2]["output_ids"]) < 100


async def test_kill_drops_open_streams() -> None:
    async with http_fleet(1, cfg(step_base_s=0.01, time_scale=1.0)) as (worker,):
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            body = {**BODY, "stream": True, "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
            with pytest.raises(httpx.TransportError):
                async with http.stream("POST", "/generate", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            await worker.kill()


async def test_the_vllm_api_answers_completions_models_and_metrics() -> None:
    async with http_fleet(1, cfg(), api="vllm") as (worker,):
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            models = (await http.get("/v1/models")).json()
            assert models["data"][0]["id"] == worker.worker.config.served_name
            body = {"model": "m", "prompt": list(range(100, 140)), "max_tokens": 4, "temperature": 0,
                    "return_token_ids": True}
            whole = (await http.post("/v1/completions", json=body)).json()
            assert len(whole["choices"][0]["token_ids"]) == 4 and whole["usage"]["completion_tokens"] == 4
            streamed = events((await http.post("/v1/completions", json={
                **body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            })).text)
            assert streamed[-1] == "[DONE]" and streamed[-2]["choices"] == []
            ids = [t for e in streamed[:-2] for c in e["choices"] for t in c["token_ids"]]
            assert ids == whole["choices"][0]["token_ids"]
            assert streamed[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
            refused = await http.post("/v1/completions", json={**body, "prompt": [], "stream": True})
            assert refused.status_code == 400
            many = (await http.post("/v1/completions", json={**body, "n": 2, "temperature": 1.0, "ignore_eos": True})).json()
            assert [c["index"] for c in many["choices"]] == [0, 1]  # numbered, as vLLM numbers them
            assert all(len(c["token_ids"]) == 4 for c in many["choices"])
            metrics = (await http.get("/metrics")).text
            assert "vllm:num_requests_running" in metrics and "vllm:num_requests_waiting" in metrics
            assert metrics.count("\n") > 200 and "vllm:time_to_first_token_seconds_bucket" in metrics  # a real page's size
            assert (await http.get("/get_model_info")).status_code == 404  # not SGLang's API
    with pytest.raises(ValueError, match="api must be one of"):
        SimHttpWorker(cfg(), api="tgi")


async def test_dp_ranks_over_http_honour_the_rank_field_and_load_per_rank() -> None:
    async with http_fleet(1, cfg(dp_size=2)) as (worker,):
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            first = (await http.post("/generate", json={**BODY, "data_parallel_rank": 1})).json()
            again = (await http.post("/generate", json={**BODY, "data_parallel_rank": 1})).json()
            other = (await http.post("/generate", json={**BODY, "data_parallel_rank": 0})).json()
            assert [r["meta_info"]["cached_tokens"] for r in (first, again, other)] == [0, 32, 0]
            loads = (await http.get("/get_load")).json()
            assert [row["dp_rank"] for row in loads] == [0, 1] and all(row["num_tokens"] > 0 for row in loads)
            info = (await http.get("/get_server_info")).json()
            assert info["dp_size"] == 2 and len(info["internal_states"]) == 2
            bad = await http.post("/generate", json={**BODY, "data_parallel_rank": 2})
            assert bad.status_code == 400 and "out of range" in bad.text


async def test_the_vllm_api_pins_a_rank_by_header_and_reports_each_engine() -> None:
    async with http_fleet(1, cfg(dp_size=2), api="vllm") as (worker,):
        async with httpx.AsyncClient(base_url=worker.url, timeout=10) as http:
            body = {"model": "m", "prompt": list(range(100, 140)), "max_tokens": 2, "return_token_ids": True}
            pinned = {"x-data-parallel-rank": "1"}
            first = (await http.post("/v1/completions", json=body, headers=pinned)).json()
            again = (await http.post("/v1/completions", json=body, headers=pinned)).json()
            other = (await http.post("/v1/completions", json=body, headers={"x-data-parallel-rank": "0"})).json()
            cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (first, again, other)]
            assert cached == [0, 32, 0]
            metrics = (await http.get("/metrics")).text
            assert 'vllm:num_requests_running{engine="1"' in metrics and 'engine="1",num_gpu_blocks=' in metrics
            bad = await http.post("/v1/completions", json=body, headers={"x-data-parallel-rank": "2"})
            assert bad.status_code == 400 and "out of range" in bad.text


async def test_the_sglang_api_takes_text_completions_and_caches_their_tokens(
    sim: tuple[SimHttpWorker, httpx.AsyncClient],
) -> None:
    worker, http = sim
    prompt = "The same long system prompt for everyone. " * 8
    body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    await http.post("/v1/completions", json=body)
    got = events((await http.post("/v1/completions", json=body)).text)
    assert got[-1] == "[DONE]"
    text = "".join(c["text"] for e in got[:-1] for c in e["choices"])
    usage = got[-2]["usage"]
    assert text and usage["completion_tokens"] == 3
    ids = worker.worker.vocab.encode(prompt)
    assert usage["prompt_tokens"] == len(ids) and usage["prompt_tokens_details"]["cached_tokens"] == len(ids) // 16 * 16
    assert (await http.get("/v1/models")).json()["data"][0]["id"] == worker.config.served_name


async def test_the_sglang_api_answers_chat_with_the_model_template_as_the_openai_client_reads_it(
    sim: tuple[SimHttpWorker, httpx.AsyncClient],
) -> None:
    worker, http = sim
    question = "Which worker holds my prefix? " * 6
    # Qwen3's template for one user turn, spelled out: the worker must render exactly this.
    rendered = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    expected = worker.worker.vocab.encode(rendered)
    client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="none", max_retries=0)
    messages: Any = [{"role": "user", "content": question}]
    whole = await client.chat.completions.create(model="m", messages=messages, max_tokens=3)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(expected), 3)
    stream = await client.chat.completions.create(
        model="m", messages=messages, max_completion_tokens=3, stream=True, stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and all(d.role is None for d in deltas[1:])
    assert "".join(d.content or "" for d in deltas)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == len(expected)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == len(expected) // 16 * 16
    await client.close()
    for bad in ({"model": "m", "messages": []}, {"model": "m", "messages": "hi"}, {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": 3}):
        refused = await http.post("/v1/chat/completions", json=bad)
        assert refused.status_code == 400 and refused.json()["error"]["message"]
