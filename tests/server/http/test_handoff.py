"""Parked processes pass their connections on (server/http/handoff.py): descriptors over the
set's unix sockets, two real guarded servers standing in for two processes of a set, the
supervisor's word read from the run folder, and keep-alive connections shed after their
current response."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway.server.http.acceptor import AcceptingServer
from gateway.server.http.guard import http_server_config
from gateway.server.http.handoff import HandOff, follow_supervisor, handoff_path
from gateway.server.http.limits import HttpLimitsConfig
from gateway.server.process_set import read_parking, write_parking


async def test_a_parked_end_passes_a_connection_with_its_unread_bytes(tmp_path: Path) -> None:
    a, b = HandOff(tmp_path, 0), HandOff(tmp_path, 1)
    taken: list[socket.socket] = []
    b.start(taken.append)
    client, conn = socket.socketpair()
    try:
        assert not a.give(conn.fileno()) and a.stats.given == 0  # not parked: served here
        a.park([1])
        assert a.parked and a.targets == [1]
        client.sendall(b"hello")
        assert a.give(conn.fileno())
        conn.close()  # the parked end's copy goes; the connection lives on in the sibling
        for _ in range(100):
            if taken:
                break
            await asyncio.sleep(0.01)
        assert len(taken) == 1 and b.stats.taken == 1 and a.stats.given == 1
        taken[0].setblocking(True)
        assert taken[0].recv(5) == b"hello"
        taken[0].sendall(b"back")
        assert client.recv(4) == b"back"
    finally:
        client.close()
        for s in taken:
            s.close()
        a.close()
        b.close()
    assert not handoff_path(tmp_path, 0).exists()


async def test_a_burst_of_connections_is_passed_whole(tmp_path: Path) -> None:
    """A client pool opens its connections at once: more than a datagram queue holds."""
    a, b = HandOff(tmp_path, 0), HandOff(tmp_path, 1)
    taken: list[socket.socket] = []
    b.start(taken.append)
    a.park([1])
    pairs = [socket.socketpair() for _ in range(64)]
    try:
        assert all(a.give(conn.fileno()) for _, conn in pairs)
        for _ in range(200):
            if len(taken) == 64:
                break
            await asyncio.sleep(0.01)
        assert len(taken) == 64 and a.stats.kept == 0
    finally:
        for x, y in pairs:
            x.close()
            y.close()
        for s in taken:
            s.close()
        a.close()
        b.close()


async def test_a_connection_nobody_takes_is_kept(tmp_path: Path) -> None:
    a = HandOff(tmp_path, 0)
    a.park([1])  # the sibling's socket is not there (restarting)
    x, y = socket.socketpair()
    try:
        assert not a.give(x.fileno()) and a.stats.kept == 1
        b = HandOff(tmp_path, 1)
        assert a.give(x.fileno())  # it is back
        b.close()
        b = HandOff(tmp_path, 1)  # restarted: a new listener at the same path
        assert a.give(x.fileno()) and a.stats.given == 2  # reconnected once, not kept
        a.park([0, 1])  # this process is active again: nothing is passed
        assert not a.parked and not a.give(x.fileno())
        b.close()
    finally:
        x.close()
        y.close()
        a.close()


def test_the_parking_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    assert read_parking(tmp_path) is None  # no word yet: every process takes connections
    write_parking(tmp_path, [0])
    assert read_parking(tmp_path) == [0]
    (tmp_path / "parking.json").write_text("{broken")
    assert read_parking(tmp_path) is None


def _app(name: str) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        await send({"type": "http.response.body", "body": name.encode()})

    return app


@contextlib.asynccontextmanager
async def _process(name: str, handoff: HandOff) -> AsyncIterator[tuple[AcceptingServer, int]]:
    """One stand-in process: the gateway's own server, with ``handoff``, on a free port."""
    config = http_server_config(_app(name), HttpLimitsConfig(), host="127.0.0.1", port=0)
    config.http.handoff = handoff  # type: ignore[union-attr]
    server = AcceptingServer(config)
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(1000):
            if server.started:
                break
            await asyncio.sleep(0.01)
        assert server.started and server.adopt is not None
        handoff.start(server.adopt)
        yield server, server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        server.force_exit = True
        await serving


async def _get(port: int, sock: socket.socket | None = None) -> tuple[bytes, socket.socket]:
    """One GET on ``sock`` (a new connection when None): the whole response and the socket."""
    loop = asyncio.get_running_loop()
    if sock is None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setblocking(False)
    await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < 1:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), 10)
        if not chunk:
            break
        got += chunk
    return got, sock


async def test_a_parked_server_passes_new_connections_and_sheds_its_own(tmp_path: Path) -> None:
    parked, active = HandOff(tmp_path, 1), HandOff(tmp_path, 0)
    async with _process("A", active) as (_, _port_a), _process("P", parked) as (p_server, port_p):
        before, kept = await _get(port_p)  # a keep-alive connection of the process about to park
        assert before.endswith(b"P") and b"connection: close" not in before.lower()
        write_parking(tmp_path, [0])
        apply = follow_supervisor(tmp_path, 1, 2, parked, lambda: p_server.server_state.connections, None)
        assert parked.targets == [0]
        again, _ = await _get(port_p, kept)  # answered here, then closed: its client reconnects
        assert again.endswith(b"P") and b"connection: close" in again.lower()
        assert await asyncio.get_running_loop().sock_recv(kept, 10) == b""
        kept.close()
        moved, new = await _get(port_p)  # a new connection to the parked port is served by the active one
        assert moved.endswith(b"A") and parked.stats.given == 1 and active.stats.taken == 1
        follow, _ = await _get(port_p, new)  # and stays there, keep-alive
        assert follow.endswith(b"A") and b"connection: close" not in follow.lower()
        new.close()
        write_parking(tmp_path, [0, 1])
        os.kill(os.getpid(), signal.SIGUSR1)  # the supervisor's signal re-reads the word
        for _ in range(100):
            if not parked.parked:
                break
            await asyncio.sleep(0.01)
        assert not parked.parked
        back, sock = await _get(port_p)
        assert back.endswith(b"P")
        sock.close()
        apply()
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
    parked.close()
    active.close()


class _Conn:
    def __init__(self) -> None:
        self.shed_count = 0

    def shed(self) -> None:
        self.shed_count += 1


async def test_the_active_process_sheds_its_connections_when_the_set_grows_back(tmp_path: Path) -> None:
    """Parked, the active process took every connection; when a sibling comes back, its
    connections close once after their current response, so their reconnections spread."""
    handoff = HandOff(tmp_path, 0)
    conns = [_Conn(), _Conn()]
    try:
        write_parking(tmp_path, [0])
        heard: list[list[int]] = []
        apply = follow_supervisor(tmp_path, 0, 2, handoff, lambda: conns, None, heard.append)
        assert not handoff.parked and [c.shed_count for c in conns] == [0, 0]  # active, and the set shrank: kept
        assert heard == [[0]]  # the active processes, for this process's share of the set's limits
        write_parking(tmp_path, [0, 1])
        apply()
        assert [c.shed_count for c in conns] == [1, 1]
        apply()  # no change: nothing more
        assert [c.shed_count for c in conns] == [1, 1] and heard == [[0], [0, 1]]
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        handoff.close()


async def test_without_a_hand_off_the_signal_is_still_caught(tmp_path: Path) -> None:
    follow_supervisor(tmp_path, 1, 2, None, list, None)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the process without the handler
        await asyncio.sleep(0.05)
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)


async def test_the_hand_off_counts_are_on_the_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.server.http.handoff import HandOffCollector

    a = HandOff(tmp_path, 0)
    registry = CollectorRegistry()
    registry.register(HandOffCollector(a))
    a.park([1])  # no sibling there: kept
    x, y = socket.socketpair()
    try:
        a.give(x.fileno())
        text = generate_latest(registry).decode()
        assert "token_gateway_process_handoff_kept_total 1.0" in text
        assert "token_gateway_process_handoff_given_total 0.0" in text and "token_gateway_process_handoff_taken_total 0.0" in text
    finally:
        x.close()
        y.close()
        a.close()
