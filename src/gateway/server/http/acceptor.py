"""Accept every connection waiting on the listening socket in one turn of the event loop.

uvloop's server (libuv underneath) accepts one connection per turn of the loop: after
each ``accept`` it waits for the next readiness report of the listening socket (libuv
stopped accepting in a loop because the second ``accept`` nearly always finds nothing).
A burst of N new connections (a client pool opening at once) then waits N turns, and a
turn of a busy gateway can run tens of milliseconds, so the last of those connections'
first requests wait seconds with their bytes already in the kernel. asyncio's own server
accepts up to its backlog per turn instead.

``AcceptingServer`` keeps uvicorn's listeners (a lone connection is accepted by uvloop,
as cheaply as before) and, each time one accepts, ``Drain`` takes whatever else waits in
the kernel's queue (at most ``ACCEPT_BATCH``, so a connection flood cannot hold the loop)
and hands each socket to the loop's ``connect_accepted_socket`` with the same protocol.
The cost when nothing else waits is one ``accept`` that finds nothing; nothing changes
per request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

ACCEPT_BATCH = 256
"""Connections taken from the queue per accepted connection at most (a few milliseconds of work)."""


class Drain:
    """Takes the connections waiting on ``sockets`` and opens each with ``protocol_factory``."""

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        *,
        ssl_context: ssl.SSLContext | None = None,
        batch: int = ACCEPT_BATCH,
    ) -> None:
        self.sockets = list(sockets)
        for sock in self.sockets:
            sock.setblocking(False)
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._batch = batch
        self._opening: set[asyncio.Task[Any]] = set()

    def __call__(self) -> int:
        """Open the waiting connections now; how many were taken."""
        taken = 0
        for sock in self.sockets:
            while taken < self._batch:
                try:
                    conn, _ = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except ConnectionAbortedError:  # the client left while queued
                    continue
                except OSError as exc:
                    # Out of descriptors, or the listener closed: the loop's own accept
                    # (libuv copes with running out) takes the queue from here.
                    log.debug("queued connections left to the loop's own accept: %s", exc)
                    break
                taken += 1
                self.open(conn)
        return taken

    def open(self, conn: socket.socket, factory: Callable[[], asyncio.BaseProtocol] | None = None) -> None:
        """Serve an accepted connection (``factory``: another protocol maker than the listener's)."""
        conn.setblocking(False)
        loop = asyncio.get_running_loop()
        opening = loop.create_task(
            loop.connect_accepted_socket(factory or self._factory, conn, ssl=self._ssl)
        )  # type: ignore[arg-type]
        self._opening.add(opening)
        opening.add_done_callback(self._opened)

    def _opened(self, task: asyncio.Task[Any]) -> None:
        self._opening.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # a TLS handshake that failed, or a peer gone before its transport was made
            log.debug("connection not opened: %r", exc)


class AcceptingServer(uvicorn.Server):
    """uvicorn's server whose every accepted connection also drains the accept queue (see
    module doc). Lifespan, connection tracking and graceful shutdown are uvicorn's own:
    closing its listeners ends the draining too. ``adopt`` serves a connection another
    process of the set accepted (``server.http.handoff``)."""

    adopt: Callable[[socket.socket], None] | None = None  # set at startup

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        if sockets is None:
            sockets = [config.bind_socket()]
        await super().startup(sockets=sockets)
        make = config.http_protocol_class
        state = self.server_state

        def protocol() -> asyncio.Protocol:  # as uvicorn's own listeners make it
            return make(config=config, server_state=state, app_state=self.lifespan.state)  # type: ignore[call-arg]

        drain = Drain(sockets, protocol, ssl_context=config.ssl)

        def passed() -> asyncio.Protocol:  # a connection a sibling process passed here: never passed on
            made = protocol()
            made.passed = True  # type: ignore[attr-defined]
            return made

        self.adopt = lambda conn: drain.open(conn, passed)

        def accepted(**kwargs: Any) -> asyncio.Protocol:
            made = make(**kwargs)
            drain()
            return made

        # uvicorn's listeners look the protocol up on its config for each connection they accept.
        config.http_protocol_class = accepted  # type: ignore[assignment]
