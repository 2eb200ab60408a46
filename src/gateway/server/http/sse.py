"""Server-sent events framing for OpenAI-style streams."""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from gateway.protocol.stream import JsonEvent, StreamChunk

DONE = b"data: [DONE]\n\n"
SSE_FRAME = (b"data: ", b"\n\n")  # what goes around each event's JSON


class StreamEvent(Protocol):
    """What the door frames: a typed event that serializes itself once."""

    def to_json(self) -> bytes: ...


__all__ = ["DONE", "SSE_FRAME", "JsonEvent", "StreamChunk", "StreamEvent", "sse", "sse_error"]


def sse(payload: dict[str, Any]) -> bytes:
    return SSE_FRAME[0] + orjson.dumps(payload) + SSE_FRAME[1]


def sse_error(status: int, message: str, type_: str, code: str | None = None) -> bytes:
    """An error event in the OpenAI error shape, sent when a stream fails midway."""
    return sse({"error": {"message": message, "type": type_, "param": None, "code": code or status}})
