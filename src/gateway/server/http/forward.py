"""The HTTP door's side of a forwarded request: the endpoint's answer back to the client.

A request for a model that text-only workers serve (``pipeline/text_relay``) goes to
one of them unchanged, and its answer comes back as the endpoint sent it: the JSON
body, or the SSE stream chunk by chunk as it arrives. What the gateway adds is the
OpenAI error shape where the endpoint gave none: an error answer that is not an
OpenAI error object is wrapped in one with the endpoint's status and words; a
connection lost before the answer is a 502 in that shape; one lost mid-stream ends
the stream with an error event and ``[DONE]``.
"""

from __future__ import annotations

import orjson
from starlette.types import Send

from gateway.pipeline.text_relay import TextRelay
from gateway.protocol.errors import GatewayError, WorkerError
from gateway.server.http.sse import DONE, sse_error
from gateway.workers.http_errors import body_message
from gateway.workers.openai_backend import Upstream
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import WorkerCallError


def upstream_error(status: int, content: bytes) -> bytes | GatewayError:
    """An error answer as the client gets it: the endpoint's own body when it is already an
    OpenAI error object, else the gateway's error in that shape with the endpoint's words."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and data["error"].get("message"):
        return content
    return GatewayError(
        f"the upstream endpoint answered HTTP {status}: {body_message(content) or 'no detail'}",
        status=status if 400 <= status < 600 else 502, type="upstream_error", code=f"upstream_http_{status}",
    )


def _head(status: int, headers: dict[str, str], content_type: str, length: int | None = None) -> dict[str, object]:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    raw.append((b"content-type", content_type.encode("latin-1")))
    if length is not None:
        raw.append((b"content-length", str(length).encode()))
    else:
        raw += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    return {"type": "http.response.start", "status": status, "headers": raw}


async def _whole(upstream: Upstream, send: Send, headers: dict[str, str]) -> None:
    content = await upstream.read()
    if upstream.status >= 300:
        error = upstream_error(upstream.status, content)
        if isinstance(error, GatewayError):
            raise error
        content = error
    await send(_head(upstream.status, headers, upstream.content_type, len(content)))
    await send({"type": "http.response.body", "body": content})


def _broken(exc: WorkerCallError) -> WorkerError:
    if isinstance(exc, ReplyTooLarge):
        return WorkerError(f"the upstream answer broke: {exc.message}", code="worker_reply_too_large")
    return WorkerError(f"the upstream answer broke: {exc.code.name}: {exc.message}", code=f"worker_{exc.code.name.lower()}")


async def _stream(upstream: Upstream, send: Send, headers: dict[str, str]) -> None:
    await send(_head(upstream.status, headers, upstream.content_type))
    ended = False
    try:
        async for data in upstream.chunks():
            ended = data.rstrip().endswith(DONE.rstrip())
            await send({"type": "http.response.body", "body": data, "more_body": True})
    except WorkerCallError as exc:
        error = _broken(exc)
        tail = b"" if ended else sse_error(error.status, error.message, error.type, error.code) + DONE
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def forward(
    relay: TextRelay, path: str, body: bytes, model: str, request_id: str, send: Send, headers: dict[str, str],
) -> None:
    """Relay one request to a text worker for ``model`` and its answer to ``send``; a
    failure before the answer began is raised as the client's error (the door writes it)."""
    try:
        async with relay.relay(model, path, body, request_id) as upstream:
            if upstream.streaming and upstream.status < 300:
                await _stream(upstream, send, headers)
            else:
                await _whole(upstream, send, headers)
    except WorkerCallError as exc:  # the answer's body broke before anything was sent
        raise _broken(exc) from None


__all__ = ["forward", "upstream_error"]
