"""The hot routes' thin ASGI path: ``POST /v1/chat/completions``, ``/v1/completions``, ``/generate``.

FastAPI's routing and dependency layer and Starlette's middleware stack (the error,
exception and exit-stack middlewares, each wrapping ``send``) and ``StreamingResponse``
cost more per request than the rest of the HTTP side together (py-spy, short load;
see docs/BENCHMARKS.md, issue 18). These three routes are the traffic, so they get
their own path: the app matches their exact path and method before FastAPI's stack
and runs them here, under the same observability middleware (request id, metrics,
access log, tracing). The routes stay registered with FastAPI for the OpenAPI schema
and for every other method (405) or path.

Behaviour is the FastAPI path's: auth before the body is read, the body limit, the
OpenAI error shape for every bad input, one admission slot (or one per prompt) held
until the answer is complete, the worker stream cancelled the moment the client
leaves. One watcher task per request (not two per phase) waits for the disconnect
and cancels the request's own task; a stream is one loop from the endpoint's typed
events to ``send``, without an async-generator layer or a response object between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel
from starlette.routing import BaseRoute
from starlette.types import Message, Receive, Scope, Send

from gateway.endpoints import chat as chat_route
from gateway.endpoints import completions as completions_route
from gateway.endpoints import native as native_route
from gateway.observability.request_log import current_record
from gateway.pipeline.engine import Engine
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import GatewayError, PayloadTooLargeError
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.headers import RETRY_AFTER
from gateway.server.admission import Ticket
from gateway.server.http.door import CLIENT_CLOSED, HttpDoor
from gateway.server.http.sse import DONE, SSE_FRAME, StreamEvent, sse_error
from gateway.server.http.util import parse_json, parse_model

log = logging.getLogger(__name__)

# A route returns a JSON-able answer, or the stream of typed events of a started generation.
Run = Callable[[Engine, Any, RequestContext], Awaitable[Any]]

_JSON = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
]


class Streamed:
    """A route's answer that is a stream of typed events (not a JSON body)."""

    __slots__ = ("events",)

    def __init__(self, events: AsyncIterator[StreamEvent | bytes]) -> None:
        self.events = events


async def _chat(engine: Engine, req: ChatCompletionRequest, ctx: RequestContext) -> Any:
    if req.stream:
        return Streamed(await chat_route.stream_chat_json(engine, req, ctx, SSE_FRAME))
    return await chat_route.complete_chat(engine, req, ctx)


async def _completions(engine: Engine, req: CompletionRequest, ctx: RequestContext) -> Any:
    if req.stream:
        return Streamed(await completions_route.stream_completions_json(engine, req, ctx, SSE_FRAME))
    return await completions_route.complete(engine, req, ctx)


async def _generate(engine: Engine, req: GenerateRequest, ctx: RequestContext) -> Any:
    if req.stream:
        return Streamed(await native_route.stream_generate(engine, req, ctx))
    return await native_route.generate(engine, req, ctx)


@dataclass(frozen=True, slots=True)
class HotRoute:
    path: str
    model: type[BaseModel]
    run: Run
    admit: bool | Literal["batch"]


HOT_ROUTES = (
    HotRoute("/v1/chat/completions", ChatCompletionRequest, _chat, "batch"),  # one slot per sample (n)
    HotRoute("/v1/completions", CompletionRequest, _completions, "batch"),
    HotRoute("/generate", GenerateRequest, _generate, "batch"),
)


class _Gone(Exception):
    """The client left while its body was being read."""


def _head(status: int, headers: dict[str, str], extra: list[tuple[bytes, bytes]]) -> Message:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": raw + extra}


async def _send_json(send: Send, status: int, content: Any, headers: dict[str, str]) -> None:
    body = orjson.dumps(content)
    await send(_head(status, headers, [(b"content-length", str(len(body)).encode()), _JSON]))
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, exc: GatewayError, headers: dict[str, str]) -> None:
    extra = dict(headers)
    if exc.retry_after is not None:
        extra[RETRY_AFTER] = str(max(1, round(exc.retry_after)))
    await _send_json(send, exc.status, exc.to_dict(), extra)


class HotPath:
    """Runs the hot routes as plain ASGI (see the module doc); ``match`` says which."""

    def __init__(self, door: HttpDoor, routes: dict[str, BaseRoute]) -> None:
        self.door = door
        self.state = door.state
        self.max_body = door.max_body
        # The FastAPI route of the same path: scope["route"] gives metrics their endpoint label.
        missing = [r.path for r in HOT_ROUTES if r.path not in routes]
        if missing:
            raise RuntimeError(f"hot routes not registered with the app: {missing}")
        self._routes = {r.path: (r, routes[r.path]) for r in HOT_ROUTES}

    def match(self, scope: Scope) -> bool:
        return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self._routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route, api_route = self._routes[scope["path"]]
        scope["route"] = api_route
        await _Request(self, route, scope, receive, send).run()

class _Request:
    """One hot-route request: its response state, its disconnect watcher, its slots."""

    __slots__ = (
        "complete", "ctx", "gone", "path", "receive", "route", "scope", "send_raw", "started", "task", "tickets", "watcher",
    )  # fmt: skip

    def __init__(self, path: HotPath, route: HotRoute, scope: Scope, receive: Receive, send: Send) -> None:
        self.path = path
        self.route = route
        self.scope = scope
        self.receive = receive
        self.send_raw = send
        record = current_record()  # the observability middleware's: the id of this request
        self.ctx = RequestContext(request_id=record.request_id) if record else RequestContext()
        self.tickets: list[Ticket] = []
        self.started = False  # the response head went out
        self.complete = False  # the response's last byte went out
        self.gone = False  # the client disconnected before that
        self.watcher: asyncio.Task[None] | None = None
        task = asyncio.current_task()
        assert task is not None
        self.task = task

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif not message.get("more_body", False):
            self.complete = True
        await self.send_raw(message)

    def _start_watch(self) -> None:
        self.watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Wait for the client to leave; then cancel the request's task (its worker stream
        with it). After the response is complete uvicorn reports a disconnect too: ignored."""
        receive = self.receive
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.complete:
            self.gone = True
            self.task.cancel()

    async def _take(self, weight: int) -> None:
        self.tickets.append(await self.path.state.admission.acquire(self.ctx.api_key_id, weight))

    async def run(self) -> None:
        try:
            await self._handle()
        except Exception as exc:  # a bug: one log line (the traceback at debug level), a 500 in the API's shape
            log.error("request %s on %s failed: %s: %s", self.ctx.request_id, self.scope["path"], type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            if not self.started:
                await _send_error(self.send, GatewayError("internal server error"), {})

    async def _closed(self) -> None:
        """The client left: nothing to say (nginx's 499 for the metrics and the access log)."""
        if self.started:
            return
        with contextlib.suppress(Exception):
            await self.send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
            await self.send({"type": "http.response.body", "body": b""})

    async def _handle(self) -> None:
        hot, route = self.path, self.route
        state, door = hot.state, hot.door
        watch: asyncio.Handle | None = None
        try:
            try:
                headers = _headers(self.scope)
                self.ctx = ctx = door.context_from(headers, state.auth.inference)
                body = await self._read_body(headers)
                # The watcher is created one loop turn later, and its first step runs one
                # more turn later: after the request's own turn, which ends once its worker
                # call is started, and after grpc.aio's send of that call. Created here, its
                # first step would run before that send, on every request's critical path; a
                # client that leaves meanwhile is seen a turn later, which changes nothing.
                watch = asyncio.get_running_loop().call_soon(self._start_watch)
                if route.admit == "batch":
                    ctx.admit = self._take  # the route reserves one slot per prompt once it knows the count
                elif route.admit:
                    await self._take(1)
                req = parse_model(route.model, parse_json(body))
                result = await route.run(state.engine, req, ctx)
                if isinstance(result, Streamed):
                    await self._stream(result.events, ctx)
                else:
                    await _send_json(self.send, 200, result, door.headers_for(ctx))
            except asyncio.CancelledError:
                if not self.gone:
                    raise
                self.task.uncancel()
                await self._closed()
            except _Gone:
                await self._closed()
            except GatewayError as exc:
                if self.started:
                    raise
                await _send_error(self.send, exc, door.headers_for(self.ctx))
        finally:
            if watch is not None:
                watch.cancel()  # not started yet: never will be
            if self.watcher is not None and not self.watcher.done():
                self.watcher.cancel()
            for ticket in self.tickets:
                ticket.release()

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        """The whole body within ``--max-body-bytes`` (before the disconnect watcher shares
        ``receive``: two readers would race for the body's chunks)."""
        limit = self.path.max_body
        receive = self.receive
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
        first = await receive()
        if first["type"] != "http.request":
            raise _Gone()
        body: bytes = first.get("body", b"")
        if len(body) > limit:
            raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
        if not first.get("more_body", False):
            return body
        parts = bytearray(body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _Gone()
            parts += message.get("body", b"")
            if len(parts) > limit:
                raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
            if not message.get("more_body", False):
                return bytes(parts)

    async def _stream(self, events: AsyncIterator[StreamEvent | bytes], ctx: RequestContext) -> None:
        """One loop from typed events (or an SSE event already written: the common
        completion or chat token, ``stream_completions_json`` / ``stream_chat_json``) to SSE
        bytes on the socket; a mid-stream error becomes an error event, then ``[DONE]``."""
        send = self.send
        await send(_head(200, self.path.door.headers_for(ctx), _SSE_HEADERS))
        body = self.send_raw  # a more_body message changes none of self.send's flags: skip its layer
        try:
            try:
                async for event in events:
                    data = event if type(event) is bytes else b"".join((b"data: ", event.to_json(), b"\n\n"))  # type: ignore[union-attr]
                    await body({"type": "http.response.body", "body": data, "more_body": True})
            except GatewayError as exc:
                log.warning("request %s failed mid-stream: %s", ctx.request_id, exc.message)
                await send({"type": "http.response.body", "body": sse_error(exc.status, exc.message, exc.type, exc.code), "more_body": True})
            await send({"type": "http.response.body", "body": DONE, "more_body": False})
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()  # a client gone mid-stream: the generation ends (and aborts) now



def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name, the first of repeated ones (as Starlette's
    ``Headers.get``), built once instead of a scan of the raw list per lookup."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"])}
