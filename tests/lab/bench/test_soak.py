"""The soak's parts (gateway_lab/bench/soak.py): the request mix it draws (valid requests
of every kind), how it classifies answers (ok, clean error, unclean), and its heap diff."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import httpx

from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.generate import GenerateRequest
from gateway_lab.bench.soak import KINDS, _heap_diff, _is_error_body, _send, _short, _Spec, _spec

MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest, "/generate": GenerateRequest}


def test_the_mix_covers_every_kind_with_valid_requests() -> None:
    rng = random.Random(0)
    specs = [_spec(rng, "m", disconnect_rate=0.5) for _ in range(200)]
    assert {s.kind for s in specs} == set(KINDS)
    for s in specs:
        MODELS[s.path].model_validate(s.body)  # every request is one the gateway must accept
        assert s.stream == s.kind.endswith("_stream") == bool(s.body["stream"])
    assert any(s.disconnect_after_s is not None for s in specs) and any(s.disconnect_after_s is None for s in specs)


def test_error_bodies_and_frame_names() -> None:
    assert _is_error_body({"error": {"message": "x", "type": "invalid_request_error"}})
    assert not _is_error_body({"error": {"message": ""}}) and not _is_error_body([1]) and not _is_error_body(None)
    assert _short("/usr/lib/python3.11/site-packages/httpx/_client.py") == "httpx/_client.py"
    assert _short("/repo/src/gateway/pipeline/engine.py") == "gateway/pipeline/engine.py"
    assert _short("<frozen importlib>") == "<frozen importlib>"


async def test_answers_are_classified() -> None:
    """ok, a clean error (OpenAI's error JSON, or an error event then [DONE]), or unclean."""
    answers = {
        "/json-ok": httpx.Response(200, json={"choices": []}),
        "/json-error": httpx.Response(400, json={"error": {"message": "bad", "type": "invalid_request_error"}}),
        "/html-error": httpx.Response(502, text="<html>bad gateway</html>"),
        "/sse-ok": httpx.Response(200, text='data: {"choices": []}\n\ndata: [DONE]\n\n'),
        "/sse-error": httpx.Response(200, text='data: {"error": {"message": "x", "type": "worker_error"}}\n\ndata: [DONE]\n\n'),
        "/sse-cut": httpx.Response(200, text='data: {"choices": []}\n\n'),
        "/sse-empty": httpx.Response(200, text="data: [DONE]\n\n"),
    }
    transport = httpx.MockTransport(lambda request: answers[request.url.path])
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        async def send(path: str, stream: bool) -> tuple[str, str]:
            return await _send(client, _Spec("chat", path, {}, stream, None))

        assert await send("/json-ok", False) == ("ok", "200")
        assert await send("/json-error", False) == ("clean_error", "400")
        # a body that is not JSON (a proxy's page, the HTTP guard's plain-text 431) is unclean, not a crash
        assert await send("/html-error", True) == ("unclean", "502")
        assert await send("/html-error", False) == ("unclean", "502")
        assert await send("/sse-ok", True) == ("ok", "200")
        assert await send("/sse-error", True) == ("clean_error", "stream error event")
        assert await send("/sse-cut", True) == ("unclean", "stream ended without [DONE]")
        assert await send("/sse-empty", True) == ("unclean", "200")  # no event at all is not an answer


def test_the_heap_diff_names_what_grew(tmp_path: Path) -> None:
    tracemalloc.start(4)
    try:
        first = tmp_path / "heap-1.snapshot"
        tracemalloc.take_snapshot().dump(str(first))
        kept = [bytearray(1024) for _ in range(200)]
        last = tmp_path / "heap-2.snapshot"
        tracemalloc.take_snapshot().dump(str(last))
    finally:
        tracemalloc.stop()
    lines = _heap_diff(first, last, top=3)
    assert lines[0].startswith("traced heap ") and "(heap-1 -> heap-2)" in lines[0]
    assert any("test_soak.py" in line for line in lines[1:]) and len(kept) == 200
