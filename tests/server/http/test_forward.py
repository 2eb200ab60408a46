"""The door's side of a forwarded request (server/http/forward.py), against a fake
answer: error bodies kept when they are OpenAI's, wrapped when not; a stream passed
through chunk by chunk, and one that breaks ended with an error event and [DONE]."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from gateway.protocol.errors import GatewayError
from gateway.server.http.forward import _broken, _stream, _whole, upstream_error
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import CallCode, WorkerCallError


def test_an_openai_error_body_is_kept_and_any_other_is_wrapped() -> None:
    theirs = b'{"error": {"message": "no such model", "type": "invalid_request_error"}}'
    assert upstream_error(404, theirs) == theirs
    wrapped = upstream_error(503, b"<html>busy</html>")
    assert isinstance(wrapped, GatewayError) and wrapped.status == 503 and "busy" in wrapped.message
    assert wrapped.to_dict()["error"]["code"] == "upstream_http_503"
    odd = upstream_error(302, b"")
    assert isinstance(odd, GatewayError) and odd.status == 502


class _Upstream:
    status = 200
    content_type = "text/event-stream"

    def __init__(self, parts: list[bytes | Exception]) -> None:
        self.parts = parts

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            if isinstance(part, Exception):
                raise part
            yield part


async def _sent(parts: list[bytes | Exception]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        out.append(message)

    await _stream(_Upstream(parts), send, {"x-request-id": "r"})  # type: ignore[arg-type]
    return out


async def test_a_stream_passes_through_and_a_broken_one_ends_cleanly() -> None:
    whole = await _sent([b"data: {}\n\n", b"data: [DONE]\n\n"])
    assert whole[0]["status"] == 200 and (b"x-request-id", b"r") in whole[0]["headers"]
    assert b"".join(m.get("body", b"") for m in whole[1:]) == b"data: {}\n\ndata: [DONE]\n\n"
    assert whole[-1]["more_body"] is False
    broken = await _sent([b"data: {}\n\n", WorkerCallError(CallCode.UNAVAILABLE, "dropped")])
    tail = broken[-1]["body"]
    assert broken[-1]["more_body"] is False and tail.endswith(b"data: [DONE]\n\n")
    event = orjson.loads(tail.split(b"\n\n")[0].removeprefix(b"data: "))
    assert event["error"]["type"] == "worker_error" and "dropped" in event["error"]["message"]
    done_then_broken = await _sent([b"data: [DONE]\n\n", WorkerCallError(CallCode.UNAVAILABLE, "late")])
    assert done_then_broken[-1]["body"] == b""  # the stream had ended: nothing added after [DONE]


async def test_an_oversized_whole_answer_is_a_502_named_for_it() -> None:
    class Huge:
        status = 200
        content_type = "application/json"

        async def read(self) -> bytes:
            raise ReplyTooLarge(5000, 4096)

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    with pytest.raises(WorkerCallError) as caught:
        await _whole(Huge(), send, {})  # type: ignore[arg-type]
    error = _broken(caught.value)
    assert error.status == 502 and error.code == "worker_reply_too_large" and "5000 bytes" in error.message
    assert sent == []  # nothing of the answer went out
