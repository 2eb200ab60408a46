"""The zero-cost workers' SGLang HTTP face: its refusals, and its answers as the gateway's
HTTP worker client reads them (a gateway in front of it: tests/lab/bench/scenarios/test_transports.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.sglang_http import SglangHttpClient
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from gateway_lab.bench import zero_http
from gateway_lab.bench.workloads import default_tokenizer_dir
from gateway_lab.bench.zero_fleet import PAGE_SIZE, ZeroWorker

from .zero_faces import served


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ([1, 2], "JSON object"),
        ({"input_ids": []}, "non-empty"),
        ({"input_ids": [1, "2"]}, "token ids"),
        ({"input_ids": [1], "sampling_params": []}, "sampling_params"),
        ({"input_ids": [1], "sampling_params": {"n": 0}}, "n at least 1"),
        ({"input_ids": [1] * 100, "sampling_params": {"max_new_tokens": 50}}, "exceeds the context"),
    ],
)
def test_bodies_sglang_refuses_are_refused(body: Any, why: str) -> None:
    with pytest.raises(zero_http.BadRequest, match=why):
        zero_http.parse_generate(body, context_length=128)


def test_a_body_reads_with_sglangs_defaults() -> None:
    ids, max_new, n, stream, rid = zero_http.parse_generate({"input_ids": [3, 4], "rid": "r1"}, 4096)
    assert (ids, max_new, n, stream, rid) == ([3, 4], zero_http.DEFAULT_MAX_NEW_TOKENS, 1, False, "r1")


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[tuple[ZeroWorker, str]]:
    async with served(tmp_path, zero_http.start) as w:
        yield w


def _request(rid: str, ids: list[int], max_new: int, stream: bool) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, tokenized=pb.TokenizedInput(input_ids=ids), stream=stream,
        sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=max_new, n=1),
    )  # fmt: skip


async def _read_all(client: SglangHttpClient, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    call = client.generate(request, timeout=10)
    out = []
    while (message := await call.read()) is not END_OF_STREAM:
        assert isinstance(message, pb.GenerateResponse)
        out.append(message)
    return out


async def test_the_gateways_client_reads_its_streams_and_whole_answers(worker: tuple[ZeroWorker, str]) -> None:
    w, url = worker
    client = SglangHttpClient(url)
    try:
        prompt = list(range(1, 50))
        stream = await _read_all(client, _request("s", prompt, 3, True))
        assert [m.WhichOneof("response") for m in stream] == ["chunk"] * 3 + ["complete"]
        assert [list(m.chunk.token_ids) for m in stream[:3]] == [[t] for t in w.tokens(3)]
        assert stream[-1].complete.finish_reason == "length" and stream[-1].complete.cached_tokens == 0
        [whole] = await _read_all(client, _request("w", prompt, 3, False))
        assert list(whole.complete.output_ids) == w.tokens(3)
        assert whole.complete.cached_tokens == 3 * PAGE_SIZE  # the streamed call cached its whole pages
        with pytest.raises(WorkerCallError) as err:
            await _read_all(client, _request("long", [1] * 4000, 200, True))
        assert err.value.code is CallCode.INVALID_ARGUMENT
        server = await client.server_info(timeout=5)
        assert server.max_total_num_tokens == 8192 and server.server_args["page_size"] == PAGE_SIZE
        assert (await client.model_info(timeout=5)).model_path == str(w.folder)
        assert (await client.loads(timeout=5)).loads[0].num_running_reqs == 0
        assert (await client.health_check(timeout=5)).healthy
        assert (await client.flush_cache()).success
        [again] = await _read_all(client, _request("w", prompt, 1, False))
        assert again.complete.cached_tokens == 0
    finally:
        await client.close()


def test_openai_bodies_read_as_token_ids() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    ids, max_new, stream, include_usage = zero_http.parse_openai(chat, tok, 4096, chat=True)
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (max_new, stream, include_usage) == (3, True, True)
    assert zero_http.parse_openai({"prompt": [5, 6]}, tok, 4096, chat=False)[:3] == ([5, 6], 16, False)
    for body, chat_route, why in (
        ({"messages": []}, True, "non-empty list"),
        ({"messages": [{"role": "user"}]}, True, "text content"),
        ({"prompt": ""}, False, "prompt must be"),
        ({"prompt": "x", "max_tokens": -1}, False, "max_tokens"),
        ({"prompt": [1] * 4000, "max_tokens": 200}, False, "exceeds the context"),
    ):
        with pytest.raises(zero_http.BadRequest, match=why):
            zero_http.parse_openai(body, tok, 4096, chat=chat_route)


async def test_openai_routes_answer_text_with_cached_usage(worker: tuple[ZeroWorker, str]) -> None:
    import httpx
    import orjson

    w, url = worker
    body = {"model": "zero", "prompt": "a shared system prompt " * 8, "max_tokens": 3}
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as client:
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "zero"
        first = (await client.post("/v1/completions", json=body)).json()
        assert first["choices"][0]["finish_reason"] == "length" and first["usage"]["completion_tokens"] == 3
        expected = "".join(zero_http_text(w, 3))
        assert first["choices"][0]["text"] == expected
        second = (await client.post("/v1/completions", json=body)).json()
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == second["usage"]["prompt_tokens"] // PAGE_SIZE * PAGE_SIZE > 0
        chat = {"model": "zero", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        reply = await client.post("/v1/chat/completions", json=chat)
        events = [orjson.loads(line[6:]) for line in reply.text.split("\n\n") if line.startswith("data: {")]
        assert "".join(e["choices"][0]["delta"]["content"] for e in events if e["choices"]) == expected
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert events[-1]["usage"]["completion_tokens"] == 3 and reply.text.endswith("data: [DONE]\n\n")
        assert (await client.post("/v1/chat/completions", json={"messages": "x"})).status_code == 400


def zero_http_text(w: ZeroWorker, n: int) -> list[str]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(w.folder / "tokenizer.json"))
    return [tok.decode([t]) for t in w.tokens(n)]
