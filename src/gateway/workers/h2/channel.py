"""The Generate calls to one worker: connections opened on first use and replaced when
lost, closed or going away, a reconnect back-off, and each call's request headers.

A call starts on the spot (its HEADERS and DATA written in the caller's turn) when a
connection is up, as grpc.aio's does; otherwise it waits for the connection first. A
connection that fails to open ends the calls waiting for it as UNAVAILABLE, and for
the back-off that follows (0.5 s doubling to 5 s, as the workers' grpc.aio channel is
configured) new calls fail at once, like a gRPC channel in TRANSIENT_FAILURE: the
retry loop then picks another worker instead of queueing behind a dead one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence

from gateway import __version__
from gateway.workers.h2 import frames
from gateway.workers.h2.call import Deserialize, H2Call
from gateway.workers.h2.connection import H2Connection
from gateway.workers.transport import CallCode

log = logging.getLogger(__name__)

USER_AGENT = f"token-gateway/{__version__} (h2)".encode()
_UNAVAILABLE = CallCode.UNAVAILABLE


class _Unavailable(Exception):
    """No connection to the worker (the message says why)."""


class H2Channel:
    """Unary-request, server-streaming gRPC calls to one worker (see the package doc)."""

    def __init__(
        self,
        host: str,
        port: int,
        authority: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_message: int = 256 * 1024 * 1024,
        connect_timeout_s: float = 20.0,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 5.0,
        keepalive_s: float = 300.0,
        keepalive_timeout_s: float = 20.0,
    ) -> None:
        self.host = host
        self.port = port
        self.authority = authority
        self._ssl = ssl_context
        self._max_message = max_message
        self._connect_timeout_s = connect_timeout_s
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._backoff_s = initial_backoff_s
        self._keepalive = (keepalive_s, keepalive_timeout_s)
        self._failed_until = 0.0
        self._last_error = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections: list[H2Connection] = []
        self._connecting: asyncio.Task[H2Connection] | None = None
        self._prefixes: dict[str, bytes] = {}
        self._closed = False

    def unary_stream(
        self,
        method: str,
        request: bytes,
        deserialize: Deserialize,
        *,
        timeout: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        max_message: int | None = None,
    ) -> H2Call:
        """Start ``method`` (``/package.Service/Method``) with one serialized request; read
        the replies from the returned call. ``max_message``: the largest reply this call
        accepts (at most the channel's)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        bound = self._max_message if max_message is None else min(max_message, self._max_message)
        call = H2Call(loop, deserialize, bound)
        if self._closed:
            call.on_lost(_UNAVAILABLE, "the channel to the worker is closed")
            return call
        block = self._header_block(method, timeout, metadata)
        body = b"\x00" + len(request).to_bytes(4, "big") + request
        if timeout is not None:
            call.set_deadline(loop.time() + timeout)
        conn = self._usable()
        if conn is not None:
            conn.open(call, block, body)
        else:
            call.starting(loop.create_task(self._open_later(call, block, body)))
        return call

    def _header_block(self, method: str, timeout: float | None, metadata: Sequence[tuple[str, str]]) -> bytes:
        prefix = self._prefixes.get(method)
        if prefix is None:
            prefix = self._prefixes[method] = b"".join((
                frames.METHOD_POST,
                frames.SCHEME_HTTPS if self._ssl is not None else frames.SCHEME_HTTP,
                frames.literal_indexed_name(frames.PATH_INDEX, method.encode("ascii")),
                frames.literal_indexed_name(frames.AUTHORITY_INDEX, self.authority.encode("ascii")),
                frames.literal(b"content-type", b"application/grpc"),
                frames.literal(b"te", b"trailers"),
                frames.literal(b"user-agent", USER_AGENT),
            ))
        parts = [prefix]
        if timeout is not None:
            parts.append(frames.literal(b"grpc-timeout", frames.grpc_timeout(timeout)))
        for key, value in metadata:
            parts.append(frames.literal(key.lower().encode("ascii"), value.encode("ascii")))
        return b"".join(parts)

    def _usable(self) -> H2Connection | None:
        conns = self.connections
        for conn in conns:
            if conn.can_open():
                return conn
        if conns:
            self.connections = [c for c in conns if not c.lost]
        return None

    async def _open_later(self, call: H2Call, block: bytes, body: bytes) -> None:
        """Wait for a connection, then start ``call`` on it; never raises (the call ends)."""
        try:
            conn = await self._connection()
        except _Unavailable as exc:
            call.on_lost(_UNAVAILABLE, str(exc))
            return
        except asyncio.CancelledError:
            # The call was cancelled (it has ended already), or the channel closed under it.
            call.on_lost(_UNAVAILABLE, "the channel to the worker was closed")
            return
        except Exception as exc:
            log.exception("connecting to the worker at %s failed", self.authority)
            call.on_lost(_UNAVAILABLE, f"failed to connect to the worker at {self.authority}: {exc}")
            return
        if not call.done():
            conn.open(call, block, body)

    async def _connection(self) -> H2Connection:
        loop = self._loop
        assert loop is not None
        while True:
            if self._closed:
                raise _Unavailable("the channel to the worker is closed")
            conn = self._usable()
            if conn is not None:
                return conn
            if loop.time() < self._failed_until:
                raise _Unavailable(self._last_error)
            task = self._connecting
            if task is None:
                task = self._connecting = loop.create_task(self._connect())
                task.add_done_callback(_retrieve)  # its waiters may all be gone by then
            await asyncio.shield(task)

    async def _connect(self) -> H2Connection:
        loop = self._loop
        assert loop is not None
        keepalive_s, keepalive_timeout_s = self._keepalive
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                transport, conn = await loop.create_connection(
                    lambda: H2Connection(self.authority, keepalive_s=keepalive_s, keepalive_timeout_s=keepalive_timeout_s),
                    self.host, self.port,
                    ssl=self._ssl, server_hostname=self.host if self._ssl is not None else None,
                )
            if self._ssl is not None:
                ssl_object = transport.get_extra_info("ssl_object")
                if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
                    transport.close()
                    raise ssl.SSLError("the worker did not agree to HTTP/2 (ALPN h2)")
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            self._last_error = f"failed to connect to the worker at {self.authority}: {exc or type(exc).__name__}"
            self._failed_until = loop.time() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, self._max_backoff_s)
            raise _Unavailable(self._last_error) from exc
        finally:
            self._connecting = None
        self._backoff_s = self._initial_backoff_s
        self._failed_until = 0.0
        if self._closed:
            conn.close()
            raise _Unavailable("the channel to the worker is closed")
        self.connections.append(conn)
        return conn

    async def close(self, grace: float | None = None) -> None:
        """No new calls; with ``grace``, calls still open get that long to finish. Then
        every connection closes and calls still open end as UNAVAILABLE."""
        self._closed = True
        task = self._connecting
        if task is not None:
            task.cancel()
        if grace:
            deadline = asyncio.get_running_loop().time() + grace
            # A rare path (a worker removed after its drain): polling keeps the calls free of waiters.
            while any(c.calls for c in self.connections) and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        for conn in self.connections:
            conn.close()
        self.connections = []


def _retrieve(task: asyncio.Task[H2Connection]) -> None:
    if not task.cancelled():
        task.exception()
