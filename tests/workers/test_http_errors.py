"""HTTP failures of workers as the seam's call errors: status, body and transport."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.workers.http_errors import (
    body_message,
    http_status_error,
    status_code,
    transport_error,
)
from gateway.workers.transport import CallCode


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, CallCode.INVALID_ARGUMENT), (404, CallCode.UNIMPLEMENTED), (413, CallCode.OUT_OF_RANGE),
        (429, CallCode.RESOURCE_EXHAUSTED), (500, CallCode.INTERNAL), (503, CallCode.UNAVAILABLE),
        (504, CallCode.DEADLINE_EXCEEDED), (418, CallCode.INVALID_ARGUMENT), (599, CallCode.INTERNAL),
    ],
)
def test_statuses_map_to_codes(status: int, code: CallCode) -> None:
    assert status_code(status) is code


def test_bad_requests_are_refusals_and_outages_are_retryable() -> None:
    refused = http_status_error(400, b'{"error": {"message": "prompt too long"}}')
    assert refused.rejected and not refused.retryable and refused.message == "prompt too long"
    down = http_status_error(503, b"")
    assert down.retryable and down.message == "HTTP 503"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "m1"}}', "m1"),
        (b'{"message": "m2", "object": "error"}', "m2"),
        (b'{"detail": "m3"}', "m3"),
        (b'{"error": "m4"}', "m4"),
        (b"plain text\n", "plain text"),
        (b"\xff\xfe", "\ufffd\ufffd"),
    ],
)
def test_the_workers_own_words_are_kept(body: bytes, message: str) -> None:
    assert body_message(body) == message


def test_transport_failures() -> None:
    assert transport_error(aiohttp.ClientConnectionError("refused")).code is CallCode.UNAVAILABLE
    assert transport_error(aiohttp.ServerTimeoutError("slow")).code is CallCode.DEADLINE_EXCEEDED
    dropped = transport_error(aiohttp.ServerDisconnectedError())
    assert dropped.code is CallCode.UNAVAILABLE and dropped.retryable and "closed the connection" in dropped.message
    cut = transport_error(aiohttp.ClientPayloadError("truncated body"))
    assert cut.code is CallCode.UNAVAILABLE
