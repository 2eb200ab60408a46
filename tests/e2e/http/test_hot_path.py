"""The hot routes' thin ASGI path answers byte for byte as FastAPI's path does (ids and
timestamps aside), streamed and whole, on the same gateway state and workers."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from gateway.server.http.app import create_app
from tests.e2e.http.conftest import Stack

_VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def _normalized(body: bytes) -> bytes:
    return _VOLATILE.sub(rb'"\1":_', body)


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {"prompt": [100, 200, 300], "max_tokens": 9, "seed": 4}),
    ("/v1/completions", {"prompt": [100, 200, 300], "max_tokens": 9, "seed": 4, "stream": True,
                         "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7, "seed": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7, "seed": 2,
                              "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 7, "seed": 2,
                              "stream": True, "separate_reasoning": False}),  # no parser: the template path
    ("/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6}}),
    ("/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6}, "stream": True}),
]


@pytest.mark.stack(workers=1)
async def test_hot_and_fastapi_paths_send_the_same_bytes(stack: Stack) -> None:
    plain = create_app(stack.state, manage_lifecycle=False, hot_path=False)
    transport = httpx.ASGITransport(app=plain)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as via_fastapi:
        for path, body in REQUESTS:
            body = {"model": stack.model, **body} if path != "/generate" else body
            hot = await stack.http.post(path, json=body)
            ref = await via_fastapi.post(path, json=body)
            assert hot.status_code == ref.status_code == 200, (path, hot.text, ref.text)
            assert _normalized(hot.content) == _normalized(ref.content), path
            if body.get("stream"):
                assert hot.content.count(b"data: ") >= 3 and hot.content.endswith(b"data: [DONE]\n\n")
            for name in ("content-type", "cache-control", "x-accel-buffering"):
                assert hot.headers.get(name) == ref.headers.get(name), (path, name)
            assert hot.headers["x-worker-id"] == ref.headers["x-worker-id"]
