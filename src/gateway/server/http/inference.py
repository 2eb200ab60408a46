"""The one ASGI path of every inference route (``inference_routes``): body, auth,
admission, disconnect watch, errors and SSE, each written once.

FastAPI's routing and dependency layer and Starlette's middleware stack (the error,
exception and exit-stack middlewares, each wrapping ``send``) and ``StreamingResponse``
cost more per request than the rest of the HTTP side together, and these routes are
the traffic. So ``GatewayApp`` matches their exact path and method before FastAPI's
stack and runs them here, under the same observability middleware (request id,
metrics, access log, tracing). FastAPI keeps admin, health, parse and the OpenAPI
document (``openapi.describe_request_bodies`` adds these routes and bodies to it); each
path is registered with it as a plain route to this app, so any other method gets 405.

Auth before the body is read, the body limit, the OpenAI error shape for every bad
input, one admission slot (or one per prompt) held until the answer is complete, the
worker stream cancelled the moment the client leaves: the gateway's own HTTP server
(``server.http.guard``) calls the request back when its client leaves; under any other
ASGI server one watcher task per request waits for the disconnect. Either cancels the
request's own task; a stream is one loop
from the endpoint's events to ``send``, without an async-generator layer or a
response object between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl

import orjson
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from gateway.endpoints.events import Answer, Events
from gateway.endpoints.long_lists import has_long_list, needs_steps, parse_model_in_steps
from gateway.observability.request_log import current_record
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.running_loop import current_task
from gateway.protocol.errors import GatewayError
from gateway.server.admission import Ticket
from gateway.server.http.door import CLIENT_CLOSED, HttpDoor
from gateway.server.http.forward import forward
from gateway.server.http.guard import CHUNK_WRITER, DISCONNECT_HOOK, ChunkWriter, DisconnectHook
from gateway.server.http.sse import DONE, sse_error
from gateway.server.http.util import (
    ClientGone,
    JSONResponse,
    error_response,
    parse_json,
    parse_model,
    read_body,
)
from gateway.workers.openai_backend import FORWARDED_PATHS

log = logging.getLogger(__name__)

# An API's one entry point, bound to the gateway (``endpoints.events``): the parsed body
# and the request's context in, a whole answer or a started stream's events out.
Open = Callable[[Any, RequestContext], Awaitable[Answer | Events]]

_JSON = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
]


@dataclass(frozen=True, slots=True)
class InferenceRoute:
    """One inference route: its path (POST), its body's model, its API's entry point,
    its admission (one slot before ``open``; ``"batch"``: ``open`` reserves one per prompt
    through ``ctx.reserve``; ``False``: none) and who may call it (``anthropic``: an
    inference key, also taken from Anthropic's ``x-api-key`` header).

    An API with its own error shape gives ``error_body`` (the JSON of an error answer;
    mid-stream, an ``error`` event of that JSON); one whose stream does not end with
    OpenAI's ``data: [DONE]`` gives its own ``done`` (``b""``: nothing)."""

    path: str
    model: type[BaseModel] | None
    open: Open
    admit: bool | Literal["batch"]
    summary: str
    auth: Literal["inference", "inspector", "anthropic"] = "inference"
    error_body: Callable[[GatewayError], Any] | None = None
    done: bytes = DONE
    method: Literal["POST", "GET"] = "POST"
    # A check of the parsed body before its validation (``None``: none): what it refuses
    # from sizes alone would be refused after per-item work on the event loop.
    precheck: Callable[[Any], None] | None = None
    # Whether the body may hold a list long enough to be validated in steps (known once
    # here: the short request's path reads one slot).
    long: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "long", self.model is not None and has_long_list(self.model))

    def stored(self, scope: Scope) -> StoredRef | None:
        """For a ``GET`` route (``path`` ends in one ``{name}`` segment): the stored object
        this request names, if it asks for its stream (``stream=true``); else ``None`` (a
        plain read of the object is FastAPI's, like any small JSON route)."""
        prefix = self.path[: self.path.index("{")]
        path = scope["path"]
        name = path[len(prefix):]
        if not path.startswith(prefix) or not name or "/" in name:
            return None
        query = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        return StoredRef(name, query) if query.get("stream", "false").lower() == "true" else None


@dataclass(frozen=True, slots=True)
class StoredRef:
    """What a ``GET`` route's entry point gets: the stored object's id and the query."""

    id: str
    query: dict[str, str]


ANTHROPIC_KEY = "x-api-key"


def with_bearer(headers: Mapping[str, str]) -> Mapping[str, str]:
    """Anthropic's ``x-api-key`` as the bearer token the authenticator reads."""
    if "authorization" in headers or ANTHROPIC_KEY not in headers:
        return headers
    return {**headers, "authorization": f"Bearer {headers[ANTHROPIC_KEY]}"}


def _head(status: int, headers: dict[str, str], extra: list[tuple[bytes, bytes]]) -> Message:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": raw + extra}


async def _send_json(send: Send, status: int, content: Any, headers: dict[str, str]) -> None:
    body = orjson.dumps(content)
    await send(_head(status, headers, [(b"content-length", str(len(body)).encode()), _JSON]))
    await send({"type": "http.response.body", "body": body})


class InferencePath:
    """Runs the inference routes as plain ASGI (see the module doc); ``match`` says which."""

    def __init__(self, door: HttpDoor, routes: Sequence[InferenceRoute]) -> None:
        self.door = door
        self.state = door.state
        self.max_body = door.max_body
        self.routes = {r.path: r for r in routes if r.method == "POST"}
        self.gets = [r for r in routes if r.method == "GET"]  # stored streams replayed (``InferenceRoute.stored``)
        # What scope["route"] is for metrics' endpoint label: the app's route of the same path.
        self.labels: dict[str, Any] = {}

    def _route(self, scope: Scope) -> InferenceRoute | None:
        if scope["type"] != "http":
            return None
        method = scope["method"]
        if method == "POST":
            return self.routes.get(scope["path"])
        if method == "GET":
            return next((r for r in self.gets if r.stored(scope) is not None), None)
        return None

    def match(self, scope: Scope) -> bool:
        return self._route(scope) is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        assert route is not None, "called for a request match() refused"
        label = self.labels.get(route.path)
        if label is not None:
            scope["route"] = label
        await _Request(self, route, scope, receive, send).run()


class _Request:
    """One inference request: its response state, its disconnect watcher, its slots."""

    __slots__ = (
        "complete", "ctx", "gone", "path", "receive", "route", "scope", "send_raw", "started", "task", "tickets", "watcher",
    )  # fmt: skip

    def __init__(self, path: InferencePath, route: InferenceRoute, scope: Scope, receive: Receive, send: Send) -> None:
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
        task = current_task()
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

    def _client_left(self) -> None:
        """The server's ``DisconnectHook`` fired: the client left before the response's end."""
        if not self.complete:
            self.gone = True
            self.task.cancel()

    async def _watch(self) -> None:
        """Wait for the client to leave; then cancel the request's task (its worker stream
        with it). After the response is complete uvicorn reports a disconnect too: ignored."""
        receive = self.receive
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except asyncio.CancelledError:
            # The request ended first (the usual case). Returning, not raising, keeps the
            # error's traceback (this frame, and through it the request's whole object
            # graph) out of a reference cycle that only the cyclic collector could free.
            return
        if not self.complete:
            self.gone = True
            self.task.cancel()

    async def _take(self, weight: int) -> None:
        asked = time.perf_counter()
        self.tickets.append(await self.path.state.admission.acquire(self.ctx.api_key_id, weight, self.ctx.priority or 0))
        record = current_record()
        if record is not None:  # the access log's queue_ms: time spent in the gateway's queue
            record.queued_s = (record.queued_s or 0.0) + time.perf_counter() - asked

    async def run(self) -> None:
        try:
            await self._handle()
        except Exception as exc:  # a bug: one log line (the traceback at debug level), a 500 in the API's shape
            log.error("request %s on %s failed: %s: %s", self.ctx.request_id, self.scope["path"], type(exc).__name__, exc,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            if not self.started:
                await self._send_error(GatewayError("internal server error"), {})

    async def _closed(self) -> None:
        """The client left: nothing to say (nginx's 499 for the metrics and the access log)."""
        if self.started:
            return
        with contextlib.suppress(Exception):
            await self.send({"type": "http.response.start", "status": CLIENT_CLOSED, "headers": []})
            await self.send({"type": "http.response.body", "body": b""})

    async def _handle(self) -> None:
        path, route = self.path, self.route
        state, door = path.state, path.door
        watch: asyncio.Handle | None = None
        hook: DisconnectHook | None = self.scope.get("extensions", {}).get(DISCONNECT_HOOK)
        try:
            try:
                headers = _headers(self.scope)
                if route.auth == "anthropic":
                    headers = dict(with_bearer(headers))
                auth = state.auth.inspector if route.auth == "inspector" else state.auth.inference
                self.ctx = ctx = door.context_from(headers, auth)
                # The whole body before the disconnect watcher shares ``receive``: two
                # readers would race for the body's chunks. A GET has none.
                body = b"" if route.method == "GET" else await read_body(
                    self.receive, headers.get("content-length"), path.max_body, door.max_values
                )
                if hook is not None:  # this gateway's server says when the client leaves: no watcher task
                    hook.watch(self._client_left)
                else:
                    # The watcher is created one loop turn later, and its first step runs one
                    # more turn later: after the request's own turn, which ends once its worker
                    # call is started, and after grpc.aio's send of that call. Created here, its
                    # first step would run before that send, on every request's critical path; a
                    # client that leaves meanwhile is seen a turn later, which changes nothing.
                    watch = asyncio.get_running_loop().call_soon(self._start_watch)
                if route.model is None:  # a stored stream: no body, no admission (nothing is computed)
                    stored = route.stored(self.scope)
                    assert stored is not None
                    events = await route.open(stored, ctx)
                    assert type(events) is Events
                    await self._stream(events, ctx)
                    return
                data = parse_json(body)
                model = data.get("model") if type(data) is dict and route.path in FORWARDED_PATHS else None
                if model is not None and state.text_relay.serves(model):
                    # Text-only workers (OpenAI backends): the body goes as it is, on load only.
                    await self._take(1)
                    await forward(state.text_relay, route.path, body, model, ctx.request_id, self.send, door.headers_for(ctx))
                    return
                if route.precheck is not None:
                    route.precheck(data)
                if route.long and needs_steps(route.model, data):
                    req = await parse_model_in_steps(route.model, data)
                else:
                    req = parse_model(route.model, data)
                if ctx.priority is None:
                    ctx.priority = getattr(req, "priority", None)
                if route.admit == "batch":
                    ctx.admit = self._take  # the route reserves one slot per prompt once it knows the count
                elif route.admit:
                    await self._take(1)
                result = await route.open(req, ctx)
                if type(result) is Events:
                    await self._stream(result, ctx)
                else:
                    await _send_json(self.send, 200, result, door.headers_for(ctx))
            except asyncio.CancelledError:
                if not self.gone:
                    raise
                self.task.uncancel()
                await self._closed()
            except ClientGone:
                await self._closed()
            except GatewayError as exc:
                if self.started:
                    raise
                await self._send_error(exc, door.headers_for(self.ctx))
        finally:
            if hook is not None:
                hook.watch(None)
            if watch is not None:
                watch.cancel()  # not started yet: never will be
            watcher = self.watcher
            if watcher is not None:
                # Dropped, not only cancelled: a task cancelled before its first step keeps
                # the error's traceback, whose frame holds this request.
                self.watcher = None
                if not watcher.done():
                    watcher.cancel()
            for ticket in self.tickets:
                ticket.release()

    async def _send_error(self, exc: GatewayError, headers: dict[str, str]) -> None:
        response = error_response(exc, headers)
        if self.route.error_body is not None:
            kept = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
            response = JSONResponse(self.route.error_body(exc), status_code=response.status_code, headers=kept)
        await response(self.scope, self.receive, self.send)

    async def _stream(self, events: Events, ctx: RequestContext) -> None:
        """``_relay`` in a task of its own. A task's every wake-up resumes each coroutine
        it awaits through, and the request's own task awaits through the server's,
        the middleware's and this path's frames before it reaches the relay's: resumed
        once per relayed token, they cost more than the one task per stream. Cancelling
        the request's task (the client left) cancels this one; ``events`` is closed here
        too, in case that happened before the relay ever ran."""
        relay = self.task.get_loop().create_task(self._relay(events, ctx))
        try:
            await relay
        finally:
            await events.aclose()

    async def _relay(self, events: Events, ctx: RequestContext) -> None:
        """The one SSE writer: one loop from typed events (or an event already written: the
        common completion or chat token, asked for with ``SSE_FRAME``) to SSE bytes on the
        socket; a mid-stream error becomes an error event, then ``[DONE]``."""
        send = self.send
        await send(_head(200, self.path.door.headers_for(ctx), _SSE_HEADERS))
        body = self.send_raw  # a more_body message changes none of self.send's flags: skip its layer
        # The gateway's own server writes the events after the first straight to the
        # connection (``guard.ChunkWriter``); the first goes through ``send``, whose
        # observability layer times it (TTFT).
        writer: ChunkWriter | None = self.scope.get("extensions", {}).get(CHUNK_WRITER)
        write: Callable[[bytes], bool] | None = None
        try:
            try:
                async for event in events.events:
                    data = event if type(event) is bytes else b"".join((b"data: ", event.to_json(), b"\n\n"))
                    if write is None or not write(data):
                        await body({"type": "http.response.body", "body": data, "more_body": True})
                        if writer is not None:
                            write = writer.write
                            if events.direct is not None:  # the text path may write its tokens' events now
                                events.direct.writer = writer
            except GatewayError as exc:
                log.warning("request %s failed mid-stream: %s", ctx.request_id, exc.message)
                shape = self.route.error_body
                error = sse_error(exc.status, exc.message, exc.type, exc.code) if shape is None else (
                    b"event: error\ndata: " + orjson.dumps(shape(exc)) + b"\n\n"
                )
                await send({"type": "http.response.body", "body": error, "more_body": True})
            await send({"type": "http.response.body", "body": self.route.done, "more_body": False})
        finally:
            await events.aclose()  # a client gone mid-stream: the generation ends (and aborts) now


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name, the first of repeated ones (as Starlette's
    ``Headers.get``), built once instead of a scan of the raw list per lookup."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"])}
