"""Every inference route answers on the one path as a real client reads it: the official
``openai`` client and its types for the OpenAI routes, the bytes of each SSE event, the
response headers (request id, worker id, stream headers) and the status codes."""

from __future__ import annotations

import gc
import itertools
from typing import Any

import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.e2e.http.conftest import Stack

REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": [100, 200, 300], "max_tokens": 9, "seed": 4}),
    ("/v1/completions", {"prompt": [100, 200, 300], "max_tokens": 9, "seed": 4, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"prompt": [[100, 200], [300, 400]], "max_tokens": 5, "stream": True}),  # two prompts
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7, "seed": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7, "seed": 2,
                              "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7, "seed": 2,
                              "stream": True, "separate_reasoning": False}),  # no parser: the template path
    ("/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6}}),
    ("/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6}, "stream": True}),
]  # fmt: skip

ANSWER_TYPES = {"/v1/completions": Completion, "/v1/chat/completions": ChatCompletion}


def _events(body: bytes) -> list[bytes]:
    """The SSE events of a stream, each checked to be framed as ``data: <payload>\\n\\n``."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    parts = body.split(b"\n\n")
    assert parts[-1] == b""
    events = parts[:-1]
    assert all(e.startswith(b"data: ") and b"\n" not in e for e in events), body[:500]
    return [e[len(b"data: "):] for e in events[:-1]]


@pytest.mark.stack(workers=2)
async def test_every_answer_has_its_shape_headers_and_framing(stack: Stack) -> None:
    workers = {w.id for w in stack.state.registry.all()}
    for i, (path, body) in enumerate(REQUESTS):
        body = {"model": stack.model, **body} if path != "/generate" else body
        rid = f"req-{i}"
        r = await stack.http.post(path, json=body, headers={"x-request-id": rid})
        assert r.status_code == 200, (path, r.text)
        assert r.headers["x-request-id"] == rid
        assert set(r.headers["x-worker-id"].split(",")) <= workers, r.headers["x-worker-id"]
        if not body.get("stream"):
            assert r.headers["content-type"] == "application/json"
            assert int(r.headers["content-length"]) == len(r.content)
            if path in ANSWER_TYPES:
                ANSWER_TYPES[path].model_validate(r.json())
            else:
                assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
            continue
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        events = [orjson.loads(e) for e in _events(r.content)]
        assert len(events) >= 3, path
        if path == "/v1/chat/completions":
            for event in events:
                ChatCompletionChunk.model_validate(event)
        elif path == "/v1/completions":  # the client's Completion type wants a finish reason in every choice
            assert {e["object"] for e in events} == {"text_completion"}
            assert all(isinstance(c["text"], str) for e in events for c in e["choices"])
        if path != "/generate":
            assert len({e["id"] for e in events}) == 1  # one response id for the whole stream
        else:  # SGLang's cumulative results
            texts = [e["text"] for e in events]
            assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
        if body.get("stream_options", {}).get("include_usage"):
            assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.stack(workers=1)
async def test_the_official_client_on_each_openai_route(stack: Stack) -> None:
    client = stack.client
    messages: Any = [{"role": "user", "content": "count to three"}]
    raw = await client.chat.completions.with_raw_response.create(model=stack.model, messages=messages, max_tokens=5)
    chat = raw.parse()
    assert raw.headers["x-worker-id"] and chat.choices[0].finish_reason == "length"
    streamed = await client.chat.completions.create(
        model=stack.model, messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True},
    )
    chunks = [c async for c in streamed]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)
    completion = await client.completions.create(model=stack.model, prompt="once upon", max_tokens=4)
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    pieces = [c async for c in await client.completions.create(model=stack.model, prompt="once upon", max_tokens=4, stream=True)]
    assert pieces[-1].choices[0].finish_reason == "length"
    embedded = await client.embeddings.with_raw_response.create(model=stack.model, input=["a b", "c"])
    vectors = embedded.parse().data  # asked for in base64 by the client, decoded by it
    assert len(vectors) == 2 and len(vectors[0].embedding) > 0 and embedded.headers["x-worker-id"]


@pytest.mark.stack(workers=1)
async def test_tokenize_detokenize_and_inspect_answer_on_the_path(stack: Stack) -> None:
    tok = await stack.http.post("/v1/tokenize", json={"model": stack.model, "prompt": "hello world"})
    assert tok.status_code == 200 and tok.headers["content-type"] == "application/json"
    ids = tok.json()["tokens"]
    assert tok.json()["count"] == len(ids) > 0
    detok = await stack.http.post("/v1/detokenize", json={"model": stack.model, "tokens": ids})
    assert detok.status_code == 200 and "hello world" in detok.json()["text"]
    inspected = await stack.http.post("/admin/inspect", json={"model": stack.model, "prompt": "hello world"})
    assert inspected.status_code == 200, inspected.text
    bad = await stack.http.post("/v1/detokenize", json={"model": stack.model, "tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def _ours(obj: object) -> bool:
    """Whether ``obj`` is the gateway's: an instance of one of its classes, or a frame of its code."""
    if type(obj).__name__ == "frame":
        return str(obj.f_globals.get("__name__", "")).startswith("gateway.")  # type: ignore[attr-defined]
    return type(obj).__module__.startswith("gateway.")


@pytest.mark.stack(workers=2, policy="cache_aware")
async def test_served_requests_leave_no_reference_cycles(stack: Stack) -> None:
    """A request's objects are freed when it ends, not by the cyclic collector: at 128 in
    flight each collection of a request's leftovers paused every request on the loop."""
    for path, body in REQUESTS:  # warm: one-off caches are not a request's leftovers
        assert (await stack.http.post(path, json=body)).status_code == 200
    gc.collect()
    gc.garbage.clear()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for path, body in REQUESTS * 3:
            assert (await stack.http.post(path, json=body)).status_code == 200
        gc.collect()
        leftovers = sorted({type(o).__qualname__ for o in gc.garbage if _ours(o)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert leftovers == []
