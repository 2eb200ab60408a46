"""An engine's HTTP failures as the seam's ``WorkerCallError``: the one translation.

Every HTTP worker client (SGLang's native API, vLLM's OpenAI server) reports failed
calls through here, so the retry loop and the client-facing error mapping see the
same ``CallCode`` vocabulary as for gRPC workers: a bad request stays a bad request
(not retried, no breaker strike) and a worker that is down or overloaded is
UNAVAILABLE / RESOURCE_EXHAUSTED (retried elsewhere).
"""

from __future__ import annotations

import aiohttp
import orjson

from gateway.workers.transport import CallCode, WorkerCallError

_STATUS_CODES: dict[int, CallCode] = {
    400: CallCode.INVALID_ARGUMENT,
    401: CallCode.UNAUTHENTICATED,
    403: CallCode.PERMISSION_DENIED,
    404: CallCode.UNIMPLEMENTED,  # the route is not there: this engine lacks the call
    405: CallCode.UNIMPLEMENTED,
    408: CallCode.DEADLINE_EXCEEDED,
    409: CallCode.ABORTED,
    413: CallCode.OUT_OF_RANGE,
    422: CallCode.INVALID_ARGUMENT,
    429: CallCode.RESOURCE_EXHAUSTED,
    499: CallCode.CANCELLED,
    500: CallCode.INTERNAL,
    501: CallCode.UNIMPLEMENTED,
    502: CallCode.UNAVAILABLE,
    503: CallCode.UNAVAILABLE,
    504: CallCode.DEADLINE_EXCEEDED,
}


def status_code(status: int) -> CallCode:
    """The call code for an HTTP status the worker answered with."""
    if status in _STATUS_CODES:
        return _STATUS_CODES[status]
    if 400 <= status < 500:
        return CallCode.INVALID_ARGUMENT
    return CallCode.UNKNOWN if status < 500 else CallCode.INTERNAL


def body_message(body: bytes) -> str:
    """The worker's own words from an error body (``{"error": {"message"}}``,
    ``{"message"}``, FastAPI's ``{"detail"}``), else the body's text, shortened."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:500]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail"):
            if data.get(key):
                return str(data[key])
        if isinstance(err, str):
            return err
    return body.decode("utf-8", "replace").strip()[:500]


def http_status_error(status: int, body: bytes) -> WorkerCallError:
    """A non-2xx answer as a call error with the worker's message."""
    return WorkerCallError(status_code(status), body_message(body) or f"HTTP {status}")


def transport_error(exc: aiohttp.ClientError) -> WorkerCallError:
    """A failure below HTTP (connect, read, timeout, a dropped connection)."""
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return WorkerCallError(CallCode.DEADLINE_EXCEEDED, f"worker did not answer in time: {exc!r}")
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return WorkerCallError(CallCode.UNAVAILABLE, f"the worker closed the connection: {exc}")
    return WorkerCallError(CallCode.UNAVAILABLE, f"worker unreachable: {exc!r}")


__all__ = ["body_message", "http_status_error", "status_code", "transport_error"]
