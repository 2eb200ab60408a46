"""The official openai client -> gateway -> an external OpenAI-compatible endpoint
(``--backend openai``): requests forwarded unchanged with the worker's own API key,
streams passed through, the endpoint's models listed, its errors in the OpenAI shape, and
a stream the endpoint breaks ended cleanly with the worker's slot free.

The endpoint is a real OpenAI-compatible HTTP server: another gateway (over simulated
workers, with its own API keys), or, for the broken stream, a small Starlette app."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.state import GatewayState
from tests.e2e.http.conftest import StackOptions, _serve, start_stack

UPSTREAM_KEY = "upstream-secret"


@contextlib.asynccontextmanager
async def front(tmp_path: Any, urls: list[str], key: str = UPSTREAM_KEY) -> AsyncIterator[tuple[GatewayState, str]]:
    """A gateway whose workers are OpenAI backends at ``urls``, sending them ``key``."""
    config = GatewayConfig(server=ServerConfig(
        worker_urls=urls, backend="openai", worker_api_key=key or None, tokenizer_cache_dir=str(tmp_path / "front-tok"),
    ))
    config.history.history_path = str(tmp_path / "front.sqlite3")
    state = GatewayState(config)
    await state.start()
    server, task, url = await _serve(state)
    try:
        yield state, url
    finally:
        server.should_exit = True
        await task
        await state.stop()


@pytest.fixture
async def upstream(tmp_path: Any) -> AsyncIterator[Any]:
    opts = StackOptions(workers=1, server={"api_keys": [UPSTREAM_KEY]}, sim={"eos_probability": 0.0})
    async with start_stack(opts, tmp_path) as stack:
        yield stack


async def test_requests_go_unchanged_with_the_workers_key_and_answers_come_back(upstream: Any, tmp_path: Any) -> None:
    async with front(tmp_path, [upstream.url]) as (state, url):
        (worker,) = state.registry.all()
        row = worker.describe()
        assert row["kind"] == "openai/http" and row["token_ids"] is False and "cache_aware" in row["lacks"]
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            ready = await http.get("/readiness")  # a gateway of OpenAI backends alone is ready
        assert ready.status_code == 200 and ready.json()["models"] == [upstream.model]
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="front-key-unused", max_retries=0, timeout=30)
        try:
            models = [m.id async for m in client.models.list()]
            assert models == [upstream.model]  # as the endpoint lists them
            whole = await client.chat.completions.create(
                model=upstream.model, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            assert whole.choices[0].finish_reason == "length" and whole.usage is not None
            assert whole.usage.completion_tokens == 6
            stream = await client.completions.create(
                model=upstream.model, prompt="tell me", max_tokens=7, stream=True, stream_options={"include_usage": True},
            )
            text, usage = "", None
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].text or ""
                usage = chunk.usage or usage
            assert text and usage is not None and usage.completion_tokens == 7

            # The endpoint's own error, in its OpenAI shape, comes back as it is.
            with pytest.raises(openai.BadRequestError) as caught:
                await client.completions.create(model=upstream.model, prompt="x", max_tokens=-3)
            assert caught.value.status_code == 400 and caught.value.body
        finally:
            await client.close()
        assert worker.load.in_flight == 0 and worker.load.total_requests == 3


async def test_each_backend_takes_its_own_key_through_the_admin_api(upstream: Any, tmp_path: Any) -> None:
    async with front(tmp_path, [], key="") as (state, url), httpx.AsyncClient(base_url=url, timeout=30) as http:
        wrong = await http.post("/workers", json={"url": upstream.url, "engine": "openai", "api_key": "wrong"})
        assert wrong.status_code == 502 and "UNAUTHENTICATED" in wrong.json()["error"]["message"]
        added = await http.post("/workers", json={"url": upstream.url, "engine": "openai", "api_key": UPSTREAM_KEY})
        assert added.status_code == 201 and added.json()["kind"] == "openai/http"
        got = await http.post("/v1/completions", json={"model": upstream.model, "prompt": "x", "max_tokens": 2})
        assert got.status_code == 200 and got.json()["usage"]["completion_tokens"] == 2
        (worker,) = state.registry.all()
        assert worker.load.in_flight == 0


def _breaking_endpoint() -> Starlette:
    """An OpenAI-compatible endpoint whose streams break after two events, and whose
    errors are plain text (not OpenAI's shape)."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def completions(request: Request) -> Response:
        body = await request.json()
        if body.get("max_tokens") == 0:
            return Response("upstream says no", status_code=422, media_type="text/plain")
        if not body.get("stream"):
            return JSONResponse({"id": "c", "object": "text_completion", "model": "tiny", "created": 0,
                                 "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]})

        async def events() -> AsyncIterator[bytes]:
            for i in range(2):
                yield (b'data: {"id": "c", "object": "text_completion", "model": "tiny", "created": 0, '
                       b'"choices": [{"index": 0, "text": "t%d", "finish_reason": null}]}\n\n' % i)
                await asyncio.sleep(0.01)
            raise RuntimeError("the endpoint fell over")  # uvicorn drops the connection mid-body

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):  # bounded: 5 s to start
        if server.started:
            break
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


async def test_a_broken_stream_ends_cleanly_and_a_plain_error_gets_the_openai_shape(tmp_path: Any) -> None:
    async with serving(_breaking_endpoint()) as endpoint, front(tmp_path, [endpoint]) as (state, url):
        (worker,) = state.registry.all()
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
        try:
            stream = await client.completions.create(model="tiny", prompt="p", max_tokens=5, stream=True)
            texts = []
            with pytest.raises(openai.APIError) as caught:
                async for chunk in stream:
                    texts.append(chunk.choices[0].text)
            assert texts == ["t0", "t1"] and "upstream answer broke" in str(caught.value)
            with pytest.raises(openai.UnprocessableEntityError) as refused:
                await client.completions.create(model="tiny", prompt="p", max_tokens=0)
            error = refused.value.body
            assert isinstance(error, dict) and error["type"] == "upstream_error" and "upstream says no" in error["message"]
            whole = await client.completions.create(model="tiny", prompt="p", max_tokens=2)
            assert whole.choices[0].text == "ok"
            with pytest.raises(openai.NotFoundError):  # no worker lists it, and no token worker serves it
                await client.completions.create(model="other", prompt="p", max_tokens=2)
        finally:
            await client.close()
        assert worker.load.in_flight == 0 and worker.load.total_requests == 3
