"""SSE framing (server/http/sse.py): one ``data:`` line per event, and an error event in
OpenAI's shape for a stream that fails midway."""

from __future__ import annotations

import json

from gateway.server.http.sse import DONE, SSE_FRAME, sse, sse_error


def test_an_event_is_one_data_line_and_a_blank_line() -> None:
    frame = sse({"text": "a\nb", "n": 1})
    assert frame.startswith(SSE_FRAME[0]) and frame.endswith(SSE_FRAME[1])
    body = frame[len(SSE_FRAME[0]) : -len(SSE_FRAME[1])]
    assert b"\n" not in body  # a newline in the payload is escaped, so the frame stays one event
    assert json.loads(body) == {"text": "a\nb", "n": 1}
    assert DONE == b"data: [DONE]\n\n"


def test_a_midstream_error_has_openais_four_keys() -> None:
    event = json.loads(sse_error(503, "worker gone", "worker_error")[6:-2])
    assert event == {"error": {"message": "worker gone", "type": "worker_error", "param": None, "code": 503}}
    coded = json.loads(sse_error(504, "slow", "timeout", "worker_timeout")[6:-2])
    assert coded["error"]["code"] == "worker_timeout"
