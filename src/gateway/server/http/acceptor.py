"""Accept every connection waiting on the listening socket in one turn of the event loop.

uvloop's server (libuv underneath) accepts one connection per turn of the loop: after
each ``accept`` it waits for the next readiness report of the listening socket. A burst
of N new connections (a client pool opening at once) then waits N turns, and a turn of
a busy gateway can run tens of milliseconds, so the last of those connections' first
requests wait seconds with their bytes already in the kernel. asyncio's own server
accepts up to its backlog per turn instead.

``Acceptor`` reads the listening socket itself: on each readiness report it accepts
until the kernel's queue is empty (at most ``ACCEPT_BATCH``, so a connection flood
cannot hold the loop) and hands each socket to the loop's ``connect_accepted_socket``
with uvicorn's protocol; ``AcceptingServer`` is uvicorn's server with its listeners
replaced by acceptors. Nothing changes per request: only how a connection is accepted.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import cast

import uvicorn

log = logging.getLogger(__name__)

ACCEPT_BATCH = 256
"""Connections accepted per readiness report at most (a few milliseconds of work)."""
RETRY_S = 1.0
"""Pause before accepting again when the process is out of file descriptors or memory."""
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Acceptor(asyncio.AbstractServer):
    """One listening socket, accepted in batches; closed like an ``asyncio.Server``."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        *,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 2048,
        batch: int = ACCEPT_BATCH,
    ) -> None:
        self.sockets = [sock]
        self._sock = sock
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._backlog = backlog
        self._batch = batch
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self._closed = asyncio.Event()
        self._retry: asyncio.TimerHandle | None = None
        self._opening: set[asyncio.Task[object]] = set()

    def start(self) -> Acceptor:
        """Listen and watch the socket (the bound socket may already be listening)."""
        self._sock.listen(self._backlog)
        self._sock.setblocking(False)
        self._watch()
        return self

    def _watch(self) -> None:
        self._retry = None
        if not self._reading and not self._closed.is_set():
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._reading = True

    def _unwatch(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client left while queued
                continue
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    # Level-triggered: watching on would spin the loop until a descriptor frees.
                    log.warning("cannot accept connections (%s); retrying in %.0f s", exc, RETRY_S)
                    self._unwatch()
                    self._retry = self._loop.call_later(RETRY_S, self._watch)
                    return
                raise
            conn.setblocking(False)
            opening = self._loop.create_task(
                self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)  # type: ignore[arg-type]
            )
            self._opening.add(opening)
            opening.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[object]) -> None:
        self._opening.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # a TLS handshake that failed, or a peer gone before its transport was made
            log.debug("connection not opened: %r", exc)

    # ------------------------------------------------------------------ asyncio.AbstractServer
    def close(self) -> None:
        if self._closed.is_set():
            return
        self._unwatch()
        if self._retry is not None:
            self._retry.cancel()
        self._closed.set()
        self._sock.close()

    def is_serving(self) -> bool:
        return not self._closed.is_set()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def start_serving(self) -> None:
        if not self._reading:
            self.start()

    async def serve_forever(self) -> None:
        await self.start_serving()
        await self._closed.wait()

    async def wait_closed(self) -> None:
        await self._closed.wait()


class AcceptingServer(uvicorn.Server):
    """uvicorn's server whose listening sockets are read by ``Acceptor`` (see module doc).

    Everything else (lifespan, connection tracking, graceful shutdown, which closes the
    acceptors first) is uvicorn's own."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        if sockets is None:
            sockets = [config.bind_socket()]
        await super().startup(sockets=[])  # the lifespan, and no listener of uvicorn's own

        def protocol() -> asyncio.Protocol:  # as uvicorn's own listeners make it
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        acceptors = [
            Acceptor(sock, protocol, ssl_context=config.ssl, backlog=config.backlog).start()
            for sock in sockets
        ]
        # uvicorn closes and awaits its ``servers`` when it shuts down; an acceptor does both.
        self.servers = cast(list[asyncio.Server], acceptors)
