"""HTTP plumbing: body parsing, error responses, disconnect-aware handlers and streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    PayloadTooLargeError,
    validation_error_to_gateway,
)
from gateway.protocol.headers import RETRY_AFTER

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(exc: GatewayError, headers: dict[str, str] | None = None) -> JSONResponse:
    extra = dict(headers or {})
    if exc.retry_after is not None:
        extra[RETRY_AFTER] = str(max(1, round(exc.retry_after)))
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=extra)


async def buffer_body(request: Request, max_bytes: int) -> bytes:
    """Read the whole body (within ``max_bytes``) and keep it on the request.

    Call this before anything else listens on ``receive`` (the disconnect watcher):
    two readers would race for the body's chunks. Raises ClientGone if the client
    leaves mid-body."""
    cached = getattr(request, "_body", None)
    if cached is not None:
        return bytes(cached)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > max_bytes:
                raise PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")
    except ClientDisconnect:
        raise ClientGone() from None
    request._body = bytes(body)
    return request._body


async def read_json(request: Request, max_bytes: int) -> Any:
    return parse_json(await buffer_body(request, max_bytes))


def parse_json(body: bytes) -> Any:
    """A request body as JSON, or the 400 that says what is wrong with it."""
    if not body:
        raise InvalidRequestError("the request body is empty; send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "UTF-8" in str(exc):  # orjson's message for bad bytes speaks of surrogates
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise InvalidRequestError(
                    f"the request body is not valid UTF-8: byte 0x{body[bad.start]:02x} at offset {bad.start}"
                ) from None
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None


def parse_model(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run ``work`` but cancel it the moment the client disconnects (raises ClientGone).

    Cancelling the work cancels its worker stream, which aborts the worker request,
    so nothing keeps running for a client that left, even during prefill."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise ClientGone()
    finally:
        if not watcher.done():
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher


class EventStream(StreamingResponse):
    """SSE response that stops its generator as soon as the client disconnects,
    whatever the ASGI spec version (Starlette only watches for it on older ones).
    ``on_close`` (e.g. an admission slot's release) runs when the response ends, either way."""

    on_close: Callable[[], None] | None = None

    def __init__(self, content: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({stream, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, watcher):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            if self.on_close is not None:
                self.on_close()
        if stream in done:
            with contextlib.suppress(OSError):
                stream.result()
