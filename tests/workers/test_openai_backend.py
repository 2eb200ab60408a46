"""The OpenAI backend client against a real OpenAI-compatible HTTP server on loopback
(Starlette on uvicorn): bodies forwarded byte for byte with the worker's own key, its
model list, its health, and what it cannot do said by name."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.openai_backend import OpenAiBackendClient
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import CallCode, WorkerCallError

SEEN: list[tuple[bytes, str | None]] = []


async def _models(request: Request) -> Response:
    if request.headers.get("authorization") != "Bearer k":
        return JSONResponse({"error": {"message": "bad key", "type": "auth"}}, status_code=401)
    return JSONResponse({"object": "list", "data": [{"id": "m1"}, {"id": "m2"}]})


async def _completions(request: Request) -> Response:
    body = await request.body()
    SEEN.append((body, request.headers.get("authorization")))
    if b'"stream": true' in body:
        async def events() -> AsyncIterator[bytes]:
            yield b"data: {}\n\n"
            if b'"break"' in body:
                raise RuntimeError("dropped")
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")
    if b'"huge"' in body:  # 5,000 bytes, with its length or (chunked) without it
        if b'"chunked"' in body:
            async def pieces() -> AsyncIterator[bytes]:
                for _ in range(5):
                    yield b" " * 1000
            return StreamingResponse(pieces(), media_type="application/json")
        return Response(b" " * 5000, media_type="application/json")
    return Response(b'{"id": "x"}', media_type="application/json")


@contextlib.asynccontextmanager
async def endpoint() -> AsyncIterator[str]:
    app = Starlette(routes=[Route("/v1/models", _models), Route("/v1/completions", _completions, methods=["POST"])])
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


async def test_bodies_go_as_they_are_with_the_workers_key_and_come_back_as_sent() -> None:
    async with endpoint() as url:
        client = OpenAiBackendClient(url, api_key="k")
        try:
            info = await client.model_info()
            assert info.served_model_name == "m1" and client.models == ("m1", "m2")
            assert (await client.health_check()).healthy
            body = b'{"model": "m1", "prompt": "hi", "weird_field": [1, 2]}'
            whole = await client.forward("/v1/completions", body)
            assert whole.status == 200 and not whole.streaming and await whole.read() == b'{"id": "x"}'
            whole.close()
            assert SEEN[-1] == (body, "Bearer k")
            stream = await client.forward("/v1/completions", b'{"model": "m1", "stream": true}')
            assert stream.streaming and b"".join([c async for c in stream.chunks()]) == b"data: {}\n\ndata: [DONE]\n\n"
            stream.close()
            broken = await client.forward("/v1/completions", b'{"model": "m1", "stream": true, "x": "break"}')
            with pytest.raises(WorkerCallError) as caught:
                async for _ in broken.chunks():
                    pass
            assert caught.value.code is CallCode.UNAVAILABLE and broken.failed
            broken.close()
        finally:
            await client.close()


@pytest.mark.parametrize("shape", ['"huge"', '"huge", "chunked"'])
async def test_a_whole_answer_past_its_bound_is_the_endpoints_fault(shape: str) -> None:
    async with endpoint() as url:
        client = OpenAiBackendClient(url, api_key="k")
        try:
            whole = await client.forward("/v1/completions", b'{"model": "m1", "x": [%s]}' % shape.encode())
            whole.limit = 4096
            with pytest.raises(ReplyTooLarge) as caught:
                await whole.read()
            assert caught.value.bound == 4096 and whole.failed
            whole.close()
            within = await client.forward("/v1/completions", b'{"model": "m1", "x": [%s]}' % shape.encode())
            assert len(await within.read()) == 5000 and not within.failed  # the default bound takes it
            within.close()
        finally:
            await client.close()


async def test_what_it_cannot_do_is_said_by_name() -> None:
    async with endpoint() as url:
        client = OpenAiBackendClient(url, api_key="wrong")
        try:
            assert not (await client.health_check()).healthy  # its /v1/models refuses the key
            with pytest.raises(WorkerCallError) as caught:
                await client.generate(pb.GenerateRequest(request_id="r")).read()
            assert caught.value.code is CallCode.UNIMPLEMENTED and "text" in caught.value.message
            with pytest.raises(WorkerCallError):
                await client.forward("/generate", b"{}")
            with pytest.raises(WorkerCallError):
                await client.loads()
            assert not (await client.flush_cache()).success and not await client.abort("r")
            assert {"token_ids", "cache_aware", "loads"} <= client.lacks
        finally:
            await client.close()
    gone = OpenAiBackendClient("http://127.0.0.1:9")
    with pytest.raises(WorkerCallError) as down:
        await gone.forward("/v1/completions", b"{}")
    assert down.value.code is CallCode.UNAVAILABLE
    await gone.close()
