"""HTTP plumbing: the body reader, body parsing and the error response."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from gateway.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    PayloadTooLargeError,
    validation_error_to_gateway,
)
from gateway.protocol.headers import RETRY_AFTER

M = TypeVar("M", bound=BaseModel)


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(exc: GatewayError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error writer: the OpenAI error shape, its status and ``retry-after``
    (FastAPI routes return it; the inference path sends it as an ASGI app)."""
    extra = dict(headers or {})
    if exc.retry_after is not None:
        extra[RETRY_AFTER] = str(max(1, round(exc.retry_after)))
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=extra)


async def read_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    """The one body reader: the whole body, within ``limit`` bytes (a declared length over
    it is refused before any byte is read). Raises ClientGone if the client leaves first.

    Call it before anything else listens on ``receive`` (the disconnect watcher): two
    readers would race for the body's chunks."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
    first = await receive()
    if first["type"] != "http.request":
        raise ClientGone()
    body: bytes = first.get("body", b"")
    if len(body) > limit:
        raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
    if not first.get("more_body", False):
        return body
    parts = bytearray(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone()
        parts += message.get("body", b"")
        if len(parts) > limit:
            raise PayloadTooLargeError(f"request body is larger than {limit} bytes")
        if not message.get("more_body", False):
            return bytes(parts)


async def buffer_body(request: Request, max_bytes: int) -> bytes:
    """``read_body`` for a FastAPI route, kept on the request (a second call returns it)."""
    cached = getattr(request, "_body", None)
    if cached is not None:
        return bytes(cached)
    request._body = await read_body(request.receive, request.headers.get("content-length"), max_bytes)
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
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from None


def parse_model(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_gateway(exc) from None
