"""The zero-cost workers' vLLM face: its refusals, its shapes (vLLM's, not the gateway's),
and its answers as the gateway's vLLM HTTP client reads them (a gateway in front of it:
tests/lab/bench/scenarios/test_transports.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.registry import with_engine
from gateway.workers.sglang_http import SglangHttpClient
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from gateway.workers.vllm_http import VllmHttpClient
from gateway_lab.bench import zero_vllm
from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.bench.zero_fleet import PAGE_SIZE, ZeroWorker

from .zero_faces import served


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([1], "JSON object"),
        ({"prompt": []}, "prompt must be"),
        ({"prompt": [1, True]}, "prompt must be"),
        ({"prompt": [1], "n": 0}, "n at least 1"),
        ({"prompt": [1], "stream_options": [1]}, "stream_options"),
        ({"prompt": [1] * 100, "max_tokens": 50}, "maximum context length is 128"),
    ],
)
def test_bodies_vllm_refuses_are_refused(body: Any, why: str, tok: Tokenizer) -> None:
    with pytest.raises(zero_vllm.BadRequest, match=why):
        zero_vllm.parse_completion(body, tok, context_length=128)


def test_a_body_reads_with_vllms_defaults(tok: Tokenizer) -> None:
    asked = zero_vllm.parse_completion({"prompt": [3, 4]}, tok, 4096)
    assert (asked["ids"], asked["max_tokens"], asked["n"], asked["stream"], asked["return_token_ids"]) == ([3, 4], 16, 1, False, False)
    assert zero_vllm.parse_completion({"prompt": "hi"}, tok, 4096)["ids"] == tok.encode("hi", add_special_tokens=False).ids


def test_the_metrics_page_is_prometheus_text_with_what_a_gateway_reads() -> None:
    page = zero_vllm.metrics_page(running=3, capacity_tokens=8192, page_size=16, model="zero")
    samples = {s.name: s for f in text_string_to_metric_families(page) for s in f.samples}
    assert samples["vllm:num_requests_running"].value == 3 and samples["vllm:num_requests_waiting"].value == 0
    info = samples["vllm:cache_config_info"].labels
    assert (info["num_gpu_blocks"], info["block_size"], info["engine"]) == ("512", "16", "0")
    assert page.count("\n") > 200  # the size of a real server's page, histograms and all


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[tuple[ZeroWorker, str]]:
    async with served(tmp_path, zero_vllm.start) as w:
        yield w


async def test_streams_are_vllms_shape(worker: tuple[ZeroWorker, str]) -> None:
    """Prompt ids on the first chunk, token counts (no cached count) per chunk, the cached
    count in the closing usage chunk only."""
    w, url = worker
    body = {"model": "zero", "prompt": list(range(1, 40)), "max_tokens": 2, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as client:
        reply = await client.post("/v1/completions", json=body)
        assert reply.text.endswith("data: [DONE]\n\n")
        events = [orjson.loads(x[6:]) for x in reply.text.split("\n\n") if x.startswith("data: {")]
        first, last, closing = events
        assert first["choices"][0]["prompt_token_ids"] == body["prompt"] and "prompt_token_ids" not in last["choices"][0]
        assert [e["choices"][0]["token_ids"] for e in (first, last)] == [[t] for t in w.tokens(2)]
        assert first["usage"] == {"prompt_tokens": 39, "total_tokens": 40, "completion_tokens": 1}
        assert last["choices"][0]["finish_reason"] == "length" and closing["choices"] == []
        assert closing["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        pinned = await client.post("/v1/completions", json=body, headers={"X-data-parallel-rank": "1"})
        assert pinned.status_code == 400 and "out of range" in pinned.json()["message"]


async def _read_all(client: VllmHttpClient, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = client.generate(request, timeout=10)
    out = []
    while (message := await call.read()) is not END_OF_STREAM:
        assert isinstance(message, pb.GenerateResponse)
        out.append(message)
    return out


def _request(rid: str, ids: list[int], max_new: int, stream: bool) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, tokenized=pb.TokenizedInput(input_ids=ids), stream=stream,
        sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=max_new, n=1),
    )  # fmt: skip


async def test_the_gateways_client_detects_it_and_reads_it(worker: tuple[ZeroWorker, str]) -> None:
    w, url = worker
    client = await with_engine(SglangHttpClient(url), None, 5.0)  # no SGLang route answers: vLLM
    assert isinstance(client, VllmHttpClient)
    try:
        prompt = list(range(1, 50))
        stream = await _read_all(client, _request("s", prompt, 3, True))
        assert [m.WhichOneof("response") for m in stream] == ["chunk"] * 3 + ["complete"]
        assert [list(m.chunk.token_ids) for m in stream[:3]] == [[t] for t in w.tokens(3)]
        assert stream[0].chunk.prompt_tokens == len(prompt)  # from the first chunk's prompt ids
        again = await _read_all(client, _request("s2", prompt, 2, True))
        assert again[-1].complete.cached_tokens == 3 * PAGE_SIZE  # from the closing usage chunk
        [whole] = await _read_all(client, _request("w", prompt, 3, False))
        assert list(whole.complete.output_ids) == w.tokens(3) and whole.complete.cached_tokens == 3 * PAGE_SIZE
        with pytest.raises(WorkerCallError) as err:
            await _read_all(client, _request("long", [1] * 4000, 200, True))
        assert err.value.code is CallCode.INVALID_ARGUMENT and "maximum context length" in err.value.message
        server = await client.server_info(timeout=5)
        assert server.max_total_num_tokens == 8192 and server.server_args["page_size"] == PAGE_SIZE
        assert (await client.loads(timeout=5)).loads[0].num_running_reqs == 0
        assert (await client.health_check(timeout=5)).healthy
        assert (await client.flush_cache()).success
        [cold] = await _read_all(client, _request("w", prompt, 1, False))
        assert cold.complete.cached_tokens == 0
    finally:
        await client.close()
