"""The accepting server under uvloop: a burst of queued connections is accepted within a
few loop turns (uvloop's own server takes one turn per connection), every connection is
served, and shutdown stops accepting; the drain takes at most its batch, and leaves the
queue to the loop's own accept when the process is out of descriptors."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.server.http.acceptor import AcceptingServer, Drain
from gateway.server.http.guard import http_server_config
from gateway.server.http.limits import HttpLimitsConfig

uvloop = pytest.importorskip("uvloop")

BURST = 100


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _on_uvloop(test: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test())


async def _started(app: Any = _app) -> tuple[AcceptingServer, asyncio.Task[None], socket.socket]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = AcceptingServer(http_server_config(app, HttpLimitsConfig(), backlog=BURST * 2))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started
    return server, serving, sock


def test_a_burst_of_connections_is_accepted_in_a_few_loop_turns() -> None:
    async def scenario() -> None:
        server, serving, sock = await _started()
        port = sock.getsockname()[1]
        loop = asyncio.get_running_loop()
        turns = [0]

        def tick() -> None:  # once per turn of the loop
            turns[0] += 1
            loop.call_soon(tick)

        # Connected and sent while the loop is held here: all of them wait in the kernel's queue.
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]
        for client in clients:
            client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        loop.call_soon(tick)
        try:
            # polled once per turn on purpose: the turns are what is counted
            while len(server.server_state.connections) < BURST and turns[0] < 10 * BURST:  # noqa: ASYNC110
                await asyncio.sleep(0)
            assert len(server.server_state.connections) == BURST
            assert turns[0] <= 10, f"{BURST} queued connections took {turns[0]} loop turns"

            def replies() -> list[bytes]:
                out = []
                for client in clients:
                    client.settimeout(10)
                    got = b""
                    while not got.endswith(b"ok"):
                        chunk = client.recv(4096)
                        if not chunk:
                            break
                        got += chunk
                    out.append(got)
                return out

            assert all(r.startswith(b"HTTP/1.1 200") and r.endswith(b"ok") for r in await asyncio.to_thread(replies))
        finally:
            for client in clients:
                client.close()
            server.should_exit = True
            await serving
        with pytest.raises(ConnectionRefusedError):  # shutdown closed the listening socket
            socket.create_connection(("127.0.0.1", port), timeout=2).close()

    _on_uvloop(scenario)


class _Exhausted(socket.socket):
    """A listening socket whose next ``accept`` fails as a process out of descriptors does."""

    failures = 1

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def test_the_drain_leaves_the_queue_to_the_loop_when_out_of_descriptors_and_opens_what_waits() -> None:
    async def scenario() -> None:
        made: list[asyncio.BaseTransport] = []

        class Keep(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                made.append(transport)

        sock = _Exhausted()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        drain = Drain([sock], Keep, batch=2)
        clients = [socket.create_connection(sock.getsockname()) for _ in range(3)]
        try:
            assert drain() == 0 and sock.failures == 0  # no error raised: the loop's accept copes
            assert drain() == 2  # at most the batch at once
            assert drain() == 1
            assert drain() == 0  # nothing waits: one accept that finds nothing
            for _ in range(200):
                if len(made) == 3:
                    break
                await asyncio.sleep(0.01)
            assert len(made) == 3
        finally:
            for client in clients:
                client.close()
            for transport in made:
                transport.close()
            sock.close()
        assert drain() == 0  # a closed listener: nothing taken, nothing raised

    _on_uvloop(scenario)
