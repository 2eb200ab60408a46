"""The guarded httptools protocol on a real uvicorn server: a complete response leaves at
once, before the rest of the loop turn that completed it runs."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from gateway.server.http.guard import http_server_config
from gateway.server.http.limits import HttpLimitsConfig


@contextlib.asynccontextmanager
async def _serving(app: Any, *, force_exit: bool = False) -> AsyncIterator[int]:
    """``app`` on the gateway's own server (uvicorn with the guarded protocol) on a free
    loopback port, which it yields; stopped on exit (``force_exit``: without waiting for
    open connections)."""
    server = uvicorn.Server(http_server_config(app, HttpLimitsConfig(), host="127.0.0.1", port=0))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(1000):  # bounded: the server starts within a few turns
            if server.started:
                break
            await asyncio.sleep(0.01)
        assert server.started
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        server.force_exit = force_exit
        await serving


HOLD_S = 0.5  # how long the app blocks its loop after the response is complete


def _get(port: int) -> tuple[bytes, float]:
    """A plain blocking HTTP/1.1 GET: the whole response and when its last byte came."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while not got.endswith(b"done"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got, time.monotonic()


async def test_a_complete_response_leaves_before_the_rest_of_its_turn() -> None:
    held: list[float] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"done"})
        # The same turn goes on (bookkeeping after the answer) with the loop blocked: on purpose.
        time.sleep(HOLD_S)  # noqa: ASYNC251
        held.append(time.monotonic())

    async with _serving(app) as port:
        reply, arrived = await asyncio.to_thread(_get, port)
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\ndone")
        assert held and arrived < held[0] - HOLD_S / 2  # came while the app still held the loop


def test_a_disconnect_hook_calls_back_once_and_at_once_when_set_late() -> None:
    from gateway.server.http.guard import DisconnectHook

    calls: list[str] = []
    hook = DisconnectHook()
    hook.watch(lambda: calls.append("a"))
    hook.fire()
    hook.fire()
    assert calls == ["a"]
    late = DisconnectHook()
    late.fire()
    late.watch(lambda: calls.append("late"))  # the client left before anyone watched
    assert calls == ["a", "late"]
    dropped = DisconnectHook()
    dropped.watch(lambda: calls.append("dropped"))
    dropped.watch(None)  # the request ended: nothing to tell
    dropped.fire()
    assert calls == ["a", "late"]


async def test_a_client_that_leaves_fires_its_requests_hook_and_a_finished_one_does_not() -> None:
    """On a real server: the hook is in the request's scope, a client that closes its
    connection mid-response fires it, and a complete response's later close does not."""
    from gateway.server.http.guard import DISCONNECT_HOOK

    fired: list[str] = []
    answered = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        scope["extensions"][DISCONNECT_HOOK].watch(lambda: fired.append(path))
        if path == "/done":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
            await send({"type": "http.response.body", "body": b"done"})
            answered.set()
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        answered.set()
        await asyncio.sleep(30)  # the client leaves meanwhile

    def visit(port: int, path: str) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            sock.recv(65536)

    async with _serving(app, force_exit=True) as port:
        for path in ("/done", "/left"):
            answered.clear()
            await asyncio.to_thread(visit, port, path)
            await asyncio.wait_for(answered.wait(), 5)
        for _ in range(500):  # bounded: the close reaches the server within a few turns
            if fired:
                break
            await asyncio.sleep(0.01)
        assert fired == ["/left"]


def _raw(port: int, path: str) -> bytes:
    """A whole HTTP/1.1 response to a GET that closes its connection, head and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


async def test_a_chunk_writer_sends_the_bytes_send_would_and_declines_what_send_must_do() -> None:
    """On a real server: the request's ``ChunkWriter`` puts on the wire exactly what ``send``
    does for ``more_body`` chunks (an empty one ends nothing); before the head, and for a
    response with a content-length, it declines (False) and the caller uses ``send``."""
    from gateway.server.http.guard import CHUNK_WRITER

    declined: list[tuple[str, bool]] = []
    parts = [b"data: a\n\n", b"", b"data: \xc3\xa9\n\n" * 20]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        writer = scope["extensions"][CHUNK_WRITER]
        declined.append(("before head", writer.write(b"x")))
        if scope["path"] == "/sized":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
            declined.append(("sized", writer.write(b"x")))
            await send({"type": "http.response.body", "body": b"done"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for part in parts:
            if scope["path"] == "/send":
                await send({"type": "http.response.body", "body": part, "more_body": True})
            else:
                assert writer.write(part)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async with _serving(app) as port:
        sent = await asyncio.to_thread(_raw, port, "/send")
        written = await asyncio.to_thread(_raw, port, "/write")
        sized = await asyncio.to_thread(_raw, port, "/sized")
    body = sent.split(b"\r\n\r\n", 1)[1]
    assert body == b"9\r\ndata: a\n\n\r\n" + b"%x\r\n" % len(parts[2]) + parts[2] + b"\r\n" + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    assert written.split(b"\r\n\r\n", 1)[1] == body
    assert sized.endswith(b"\r\n\r\ndone")
    assert declined == [("before head", False)] * 3 + [("sized", False)]


def test_a_chunk_writer_declines_while_writes_are_paused_and_drops_a_gone_clients_chunks() -> None:
    """Paused writes are ``send``'s to wait out (False); a client that left gets nothing and
    the caller goes on (True), as ``send`` returns silently then."""
    from types import SimpleNamespace

    from gateway.server.http.guard import ChunkWriter

    class Cycle(SimpleNamespace):  # uvicorn's cycle, as far as the writer reads it (weakly referable)
        pass

    out: list[bytes] = []
    cycle = Cycle(
        disconnected=False, flow=SimpleNamespace(write_paused=True), chunked_encoding=True,
        response_started=True, response_complete=False, transport=SimpleNamespace(write=out.append),
    )
    writer = ChunkWriter(cycle)
    assert writer.writable() is False and writer.write(b"paused") is False
    cycle.flow.write_paused = False
    assert writer.writable() is True and writer.write(b"ok") is True
    cycle.response_complete = True
    assert writer.writable() is False and writer.write(b"late") is False
    cycle.response_complete, cycle.disconnected = False, True
    assert writer.writable() is True and writer.write(b"gone") is True
    assert out == [b"2\r\nok\r\n"]
    writer.push(b"pushed")  # a client that left: dropped
    cycle.disconnected = False
    writer.push(b"pushed")
    writer.push(b"")  # an empty chunk would end the response: never written
    assert out == [b"2\r\nok\r\n", b"6\r\npushed\r\n"]
    del cycle
    assert writer.writable() is True and writer.write(b"freed") is True  # the request is gone with its cycle
    writer.push(b"freed")
    assert len(out) == 2
