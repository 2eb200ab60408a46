"""The guarded httptools protocol on a real uvicorn server: a complete response leaves at
once, before the rest of the loop turn that completed it runs."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import uvicorn

from gateway.server.http.guard import http_server_config
from gateway.server.http.limits import HttpLimitsConfig

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

    server = uvicorn.Server(http_server_config(app, HttpLimitsConfig(), host="127.0.0.1", port=0))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(1000):
            if server.started:
                break
            await asyncio.sleep(0.01)
        assert server.started
        port = server.servers[0].sockets[0].getsockname()[1]
        reply, arrived = await asyncio.to_thread(_get, port)
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\ndone")
        assert held and arrived < held[0] - HOLD_S / 2  # came while the app still held the loop
    finally:
        server.should_exit = True
        await serving


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

    server = uvicorn.Server(http_server_config(app, HttpLimitsConfig(), host="127.0.0.1", port=0))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(1000):
            if server.started:
                break
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        for path in ("/done", "/left"):
            answered.clear()
            await asyncio.to_thread(visit, port, path)
            await asyncio.wait_for(answered.wait(), 5)
        for _ in range(500):  # bounded: the close reaches the server within a few turns
            if fired:
                break
            await asyncio.sleep(0.01)
        assert fired == ["/left"]
    finally:
        server.should_exit = True
        server.force_exit = True
        await serving
