"""Connection-level limits in front of httptools: header size and count, header and body read time.

httptools (the fastest HTTP/1.1 parser uvicorn offers) has no header limit: it
concatenates a header value chunk by chunk until the client stops, so one
unauthenticated connection sending a 100 MB header holds the event loop and the
memory before any route (or the API-key check) runs. ``GuardedHttpTools`` counts
the bytes and lines of each request head *before* the parser accumulates more,
answers ``431`` past ``--max-header-bytes`` / ``--max-headers`` and closes; a head
that does not arrive within ``--header-timeout-s`` gets ``408`` and a body that
does not arrive within ``--body-timeout-s`` of its head gets ``408`` too (a
slow-loris client cannot hold a connection and an admission slot for ever). The
bytes of bodies still arriving are counted across all connections: the one whose
body takes the total past ``--max-pending-body-bytes`` gets ``503`` (many slow
uploads cannot hold the gateway's memory between them).

The cost on the hot path is an integer add per received chunk while a head is being
read and three clock reads per request; one timer per server sweeps the deadlines
(see docs/BENCHMARKS.md, ``token-gateway bench http-guard``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.http.coalesce import CoalescingTransport
from gateway.server.http.handoff import HandOff
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
_BUSY_BODY = (
    b'{"error":{"message":"the gateway holds too many request bodies still arriving; retry later",'
    b'"type":"service_unavailable","param":null,"code":"body_budget_exceeded"}}'
)
BODIES_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(_BUSY_BODY)
) + _BUSY_BODY


DISCONNECT_HOOK = "gateway.disconnect"  # scope["extensions"] key: the request's DisconnectHook


class DisconnectHook:
    """Tells one request's handler that its client left, by a plain callback: the server
    fires it when the connection is lost (or refused) before the response completed, so
    the handler needs no task of its own waiting on ``receive`` for an ``http.disconnect``
    (a task, a future and a cancellation per request). A callback set after the client
    left runs at once."""

    __slots__ = ("callback", "gone")

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None
        self.gone = False

    def watch(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` once when the client leaves (None: stop watching)."""
        if callback is not None and self.gone:
            callback()
            return
        self.callback = callback

    def fire(self) -> None:
        self.gone = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


CHUNK_WRITER = "gateway.chunk_writer"  # scope["extensions"] key: the request's ChunkWriter


class ChunkWriter:
    """Writes a streamed response's body chunks straight to the connection, as uvicorn's
    ``send`` would for an ``http.response.body`` message with ``more_body`` (the same
    chunked-encoding bytes, to the same coalescing transport), without the message dict
    and the coroutines of ``send`` and of every middleware that wraps it: the relay writes
    one such chunk per token. Only where ``send`` would do nothing else: ``write`` says
    False when the response is not a started, unfinished, chunked one or the transport
    asked to pause writing, and the caller then sends the message the ASGI way (which
    waits for the drain)."""

    __slots__ = ("_cycle", "_now")

    def __init__(self, cycle: Any) -> None:
        # uvicorn's RequestResponseCycle of this request, which holds the scope that holds
        # this writer: weakly, so a finished request is freed without the cyclic collector.
        self._cycle = weakref.ref(cycle)
        transport = cycle.transport  # the connection's (``CoalescingTransport``): it outlives the request
        self._now: Any = getattr(transport, "write_now", None) or transport.write

    def writable(self) -> bool:
        """``write`` would take a chunk now (a client that left: it would drop it)."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected:
            return True
        return not (
            cycle.flow.write_paused or cycle.chunked_encoding is not True
            or not cycle.response_started or cycle.response_complete
        )

    def write(self, body: bytes) -> bool:
        """Send ``body`` as the next chunk now; False: use ``send`` instead. A client that
        left: True, the chunk dropped (as ``send`` drops it)."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected or not body:  # an empty chunk would end the response: ``send`` skips it too
            return True
        if (
            cycle.flow.write_paused or cycle.chunked_encoding is not True
            or not cycle.response_started or cycle.response_complete
        ):
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    def push(self, body: bytes) -> None:
        """``write`` for a caller that asked ``writable`` in this same step, with nothing
        written since (a delivery of relayed tokens): its checks are not made twice, and the
        chunk leaves now (``CoalescingTransport.write_now``), not at the end of the turn."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected or not body:
            return
        self._now(b"%x\r\n%b\r\n" % (len(body), body))


def _client_left(cycle: Any) -> None:
    """Fire the hook of ``cycle``'s request if its client left before the response completed."""
    if cycle is None or not cycle.disconnected:
        return
    hook = cycle.scope.get("extensions", {}).get(DISCONNECT_HOOK)
    if hook is not None:
        hook.fire()


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request the guard refused."""


IDLE, HEAD, BODY = 0, 1, 2
LINGER_S = 2.0  # how long a refused connection's further bytes are read and dropped
LINGER_BYTES = 16 * 1024 * 1024  # and how many at most


class _Sweeper:
    """One timer per server, not per request: every ``interval`` it refuses the
    connections whose head or body deadline passed (deadlines are precise to
    ``interval``; a per-request ``call_later`` would cost more than the parsing)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.connections: set[GuardedHttpTools] = set()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, proto: GuardedHttpTools) -> None:
        self.connections.add(proto)
        if self._handle is None:
            self._handle = self.loop.call_later(self.interval, self._sweep)

    def discard(self, proto: GuardedHttpTools) -> None:
        self.connections.discard(proto)

    def _sweep(self) -> None:
        now = self.loop.time()
        for proto in [p for p in self.connections if p._deadline_at is not None and p._deadline_at <= now]:
            proto._expire()
        self._handle = self.loop.call_later(self.interval, self._sweep) if self.connections else None


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with head limits and read deadlines (see module doc).

    Two counts bound a head: the bytes received while it is incomplete (checked after
    each chunk, so a single endless header line is cut off within one read), and, when
    the head completes, its line count (and its exact size, when the chunk that carried
    it also carried body bytes)."""

    limits = HttpLimitsConfig()
    handoff: HandOff | None = None  # set in a process of serve --processes N (server.http.handoff)
    _sweepers: dict[asyncio.AbstractEventLoop, _Sweeper] = {}  # per server class (guarded_protocol), by loop
    _pending: list[int] = [0]  # per server class: body bytes received for requests not yet complete

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state = IDLE
        self._raw_head = 0  # bytes received while the head was incomplete
        self._deadline_at: float | None = None  # loop time the current head or body is due by
        self._lingering = False
        self._body_held = 0  # this connection's share of _pending
        self._shed = False  # close after the current (or next) response: the client reconnects elsewhere
        self._handed = False  # passed to a sibling process at once: never served here
        self.passed = False  # passed here by a sibling: never passed on
        sweepers = type(self)._sweepers
        sweeper = sweepers.get(self.loop)
        if sweeper is None:
            limits = self.limits
            timeouts = [t for t in (limits.header_timeout_s, limits.body_timeout_s) if t > 0] or [1.0]
            sweeper = sweepers[self.loop] = _Sweeper(self.loop, max(0.05, min(1.0, min(timeouts) / 4)))
        self._sweeper = sweeper

    def _release_body(self) -> None:
        if self._body_held:
            self._pending[0] -= self._body_held
            self._body_held = 0

    def _refuse(self, response: bytes) -> None:
        """Answer (when no response has started) and close the connection."""
        self._deadline_at = None
        self._release_body()
        if self.transport.is_closing() or self._lingering:
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app sees http.disconnect and frees its slot
            cycle.message_event.set()
            _client_left(cycle)
        if cycle is not None and cycle.response_started:
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
        self.loop.call_later(LINGER_S, self.transport.close)

    def _expire(self) -> None:
        self._refuse(BODY_TIMEOUT if self._state == BODY else HEAD_TIMEOUT)

    # ------------------------------------------------------------------ protocol
    def shed(self) -> None:
        """Close this connection after its current response, or its next one when it is
        idle (an idle connection closed now could cross a request already on its way)."""
        self._shed = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        handoff = self.handoff
        if handoff is not None and handoff.targets and not self.passed:
            sock = transport.get_extra_info("socket")
            if sock is not None and handoff.give(sock.fileno()):
                # Nothing was read from it: the sibling's copy gets every byte.
                self._handed = True
                transport.abort()
                return
        # A response's head and body (or the SSE events of one loop turn) in one write.
        self._coalescing = CoalescingTransport(transport, self.loop)
        super().connection_made(self._coalescing)  # type: ignore[arg-type]
        if self.limits.header_timeout_s > 0:  # bounds connect-and-say-nothing
            self._deadline_at = self.loop.time() + self.limits.header_timeout_s
        self._sweeper.add(self)

    def on_response_complete(self) -> None:
        # The response's last bytes leave now: the end of the loop turn would add to its
        # latency whatever else the turn still runs (the request's own bookkeeping after
        # its answer). One connection carries one response at a time: nothing is lost.
        self._coalescing.flush()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handed:
            return
        self._sweeper.discard(self)
        self._release_body()
        super().connection_lost(exc)
        _client_left(self.cycle)

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
        if self._deadline_at is None and self.limits.header_timeout_s > 0:
            # a keep-alive request: its head is due from its first byte
            self._deadline_at = self.loop.time() + self.limits.header_timeout_s

    def on_headers_complete(self) -> None:
        limits = self.limits
        if len(self.headers) > limits.max_headers:
            self._refuse(TOO_MANY)
            raise _Refused()
        if self._raw_head > limits.max_header_bytes:  # this chunk also held body bytes: measure exactly
            size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
            if size > limits.max_header_bytes:
                self._refuse(TOO_LARGE)
                raise _Refused()
        self._state = BODY
        self._deadline_at = self.loop.time() + limits.body_timeout_s if limits.body_timeout_s > 0 else None
        scope: dict[str, Any] = self.scope  # type: ignore[assignment]
        extensions: dict[str, Any] | None = scope.get("extensions")
        if extensions is None:
            extensions = scope["extensions"] = {}
        extensions[DISCONNECT_HOOK] = DisconnectHook()
        super().on_headers_complete()
        cycle = self.cycle
        if self._shed and cycle is not None:
            cycle.keep_alive = False  # answered with "connection: close"
        if cycle is not None and cycle.scope is scope and scope["method"] != "HEAD":
            # Before the request's task first runs (it starts on a later loop turn).
            extensions[CHUNK_WRITER] = ChunkWriter(cycle)

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_held += size
        pending = self._pending
        pending[0] += size
        bound = self.limits.max_pending_body_bytes
        if 0 < bound < pending[0]:
            self._refuse(BODIES_BUSY)
            raise _Refused()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._release_body()
        self._state = IDLE
        self._raw_head = 0
        self._deadline_at = None
        super().on_message_complete()


def guarded_protocol(limits: HttpLimitsConfig) -> type[GuardedHttpTools]:
    """The protocol class for one server, bound to its limits."""
    return type("GuardedHttpTools", (GuardedHttpTools,), {"limits": limits, "_sweepers": {}, "_pending": [0]})


def http_server_config(app: Any, limits: HttpLimitsConfig, **kwargs: Any) -> uvicorn.Config:
    """The one place a gateway HTTP server is configured: uvicorn + httptools behind the guard."""
    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("lifespan", "off")
    kwargs.setdefault("loop", "none")
    return uvicorn.Config(
        app, http=guarded_protocol(limits), timeout_keep_alive=max(1, round(limits.keep_alive_timeout_s)), **kwargs,
    )
