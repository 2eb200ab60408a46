"""Connection-level limits in front of httptools: header size and count, header and body read time.

httptools (the fastest HTTP/1.1 parser uvicorn offers) has no header limit: it
concatenates a header value chunk by chunk until the client stops, so one
unauthenticated connection sending a 100 MB header holds the event loop and the
memory before any route (or the API-key check) runs. ``GuardedHttpTools`` counts
the bytes and lines of each request head *before* the parser accumulates more,
answers ``431`` past ``--max-header-bytes`` / ``--max-headers`` and closes; a head
that does not arrive within ``--header-timeout-s`` gets ``408`` and a body that
does not arrive within ``--body-timeout-s`` of its head gets ``408`` too (a
slow-loris client cannot hold a connection and an admission slot for ever).

The cost on the hot path is one integer add per received chunk while a head is
being read and two timer handles per request (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.http.limits import HttpLimitsConfig


def _plain_response(status: int, reason: str, message: str) -> bytes:
    body = message.encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


TOO_LARGE = _plain_response(431, "Request Header Fields Too Large", "request header fields too large")
TOO_MANY = _plain_response(431, "Request Header Fields Too Large", "too many request header fields")
HEAD_TIMEOUT = _plain_response(408, "Request Timeout", "the request head did not arrive in time")
BODY_TIMEOUT = _plain_response(408, "Request Timeout", "the request body did not arrive in time")


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the guard refused."""


IDLE, HEAD, BODY = 0, 1, 2
LINGER_S = 2.0  # how long a refused connection's further bytes are read and dropped
LINGER_BYTES = 16 * 1024 * 1024  # and how many at most


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits and read deadlines (see module doc).

    Two counts bound a head: the bytes received since the request began while its head
    is incomplete (checked after each chunk, so a single endless header line is cut off
    within one read), and the parsed head's size and line count (checked per header, so
    a head that completes within one chunk is judged exactly)."""

    limits = HttpLimitsConfig()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state = IDLE
        self._raw_head = 0  # bytes received while the head was incomplete
        self._head_size = 0  # bytes of request line and headers parsed so far
        self._header_count = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._lingering = False

    # ------------------------------------------------------------------ timers
    def _arm(self, seconds: float, on_expiry: Any) -> None:
        self._disarm()
        if seconds > 0:
            self._deadline = self.loop.call_later(seconds, on_expiry)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _refuse(self, response: bytes) -> None:
        """Answer (when no response has started) and close the connection."""
        self._disarm()
        if self.transport.is_closing() or self._lingering:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app sees http.disconnect and frees its slot
            cycle.message_event.set()
        if self._lingering or (cycle is not None and cycle.response_started):
            self.transport.close()
            return
        # Lingering close (as nginx does): send the answer and a FIN, then read and drop
        # what the client still sends for a moment. Closing with unread data would send
        # a reset that can destroy the answer before the client reads it.
        self.transport.write(response)
        self._lingering = True
        try:
            self.transport.write_eof()
        except (NotImplementedError, RuntimeError, OSError):  # TLS transports cannot half-close
            self.transport.close()
            return
        self._deadline = self.loop.call_later(LINGER_S, self.transport.close)

    def _head_expired(self) -> None:
        self._deadline = None
        if self._state != BODY:
            self._refuse(HEAD_TIMEOUT)

    def _body_expired(self) -> None:
        self._deadline = None
        if self._state == BODY:
            self._refuse(BODY_TIMEOUT)

    # ------------------------------------------------------------------ protocol
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout_s, self._head_expired)  # bounds connect-and-say-nothing

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # refused: drop what still arrives, within bounds
            self._raw_head += len(data)
            if self._raw_head > LINGER_BYTES:
                self.transport.close()
            return
        if self._state != BODY:
            self._raw_head += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except _Refused:
            return
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refused) or self.transport.is_closing():
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._state == HEAD and self._raw_head > self.limits.max_header_bytes:
            self._refuse(TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._state = HEAD
        self._head_size = 0
        self._header_count = 0
        if self._deadline is None:  # the first request's deadline runs from the connection
            self._arm(self.limits.header_timeout_s, self._head_expired)

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size > self.limits.max_header_bytes:
            self._refuse(TOO_LARGE)
            raise _Refused()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.limits.max_header_bytes:
            self._refuse(TOO_LARGE)
            raise _Refused()
        if self._header_count > self.limits.max_headers:
            self._refuse(TOO_MANY)
            raise _Refused()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._state = BODY
        self._arm(self.limits.body_timeout_s, self._body_expired)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._state = IDLE
        self._raw_head = 0
        self._disarm()
        super().on_message_complete()


def guarded_protocol(limits: HttpLimitsConfig) -> type[GuardedHttpTools]:
    """The protocol class for one server, bound to its limits."""
    return type("GuardedHttpTools", (GuardedHttpTools,), {"limits": limits})


def http_server_config(app: Any, limits: HttpLimitsConfig, **kwargs: Any) -> uvicorn.Config:
    """The one place a gateway HTTP server is configured: uvicorn + httptools behind the guard."""
    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("lifespan", "off")
    kwargs.setdefault("loop", "none")
    return uvicorn.Config(
        app, http=guarded_protocol(limits), timeout_keep_alive=max(1, round(limits.keep_alive_timeout_s)), **kwargs,
    )
