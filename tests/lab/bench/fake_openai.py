"""A tiny OpenAI-shaped streaming server: the test double the driver is tested against.

It is not the gateway: it plays two "workers" alternately, keeps a per-worker record
of prompts to report a plausible ``cached_tokens`` (longest shared prefix), and streams
``max_tokens`` one-word chunks with the usage chunk and ``[DONE]`` at the end. Prompts
containing "fail-http" get a 500; "fail-stream" gets an SSE error after one token.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


@dataclass
class FakeState:
    token_delay_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    request_ids: list[str | None] = field(default_factory=list)  # each request's X-Request-Id
    seen: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {"w0": [], "w1": []})
    in_flight: int = 0
    max_in_flight: int = 0
    served: int = 0


def _prompt_units(body: dict[str, Any]) -> tuple[Any, ...]:
    if "messages" in body:
        return tuple(w for m in body["messages"] for w in (f"<{m['role']}>", *m["content"].split()))
    prompt = body["prompt"]
    return tuple(prompt) if isinstance(prompt, list) else tuple(prompt.split())


def _shared_prefix(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def make_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    async def generate(request: Request, chat: bool) -> Response:
        body = orjson.loads(await request.body())
        state.bodies.append(body)
        state.request_ids.append(request.headers.get("x-request-id"))
        units = _prompt_units(body)
        if any(u == "fail-http" for u in units):
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        worker = f"w{state.served % 2}"
        state.served += 1
        cached = max((_shared_prefix(units, p) for p in state.seen[worker]), default=0)
        state.seen[worker].append(units)
        n = int(body["max_tokens"])

        def chunk(text: str, finish: str | None) -> bytes:
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            return b"data: " + orjson.dumps({"object": "chunk", "choices": [choice]}) + b"\n\n"

        async def stream() -> AsyncIterator[bytes]:
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                if chat:
                    yield chunk("", None)  # the role-only first delta real servers send
                for i in range(n):
                    await asyncio.sleep(state.token_delay_s)
                    if i == 1 and "fail-stream" in units:
                        yield b'data: {"error": {"message": "worker died"}}\n\n'
                        return
                    yield chunk(f" {worker}t{i}", "length" if i == n - 1 else None)
                usage = {
                    "prompt_tokens": len(units),
                    "completion_tokens": n,
                    "total_tokens": len(units) + n,
                    "prompt_tokens_details": {"cached_tokens": cached},
                }
                yield b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                state.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-worker-id": worker})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    return app


@contextlib.asynccontextmanager
async def serve_fake(state: FakeState) -> AsyncIterator[str]:
    """Serve the fake on 127.0.0.1 (ephemeral port) in this event loop; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(make_app(state), host="127.0.0.1", port=0,
                                           log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        assert server.started, "fake server did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@contextlib.contextmanager
def fake_in_thread(state: FakeState) -> Iterator[str]:
    """The fake served from its own thread and event loop (for code that runs asyncio.run)."""
    import threading

    ready: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    async def main() -> None:
        async with serve_fake(state) as url:
            ready.put(url)
            await asyncio.to_thread(stop.wait, 30)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    try:
        yield ready.get(timeout=10)
    finally:
        stop.set()
        thread.join(10)
