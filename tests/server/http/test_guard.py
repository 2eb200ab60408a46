"""The guarded httptools protocol's response writes: a response with a Content-Length goes
out in one write (head and body together); a stream's head and events are written as
they come.

A real uvicorn server on 127.0.0.1 with the gateway's protocol class; the transport it is
given records each write (the bytes still go to the socket), and a raw socket client
reads the answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from gateway.server.http.guard import GuardedHttpTools, HeadWithBodyCycle, http_server_config
from gateway.server.http.limits import HttpLimitsConfig

JSON = b'{"ok":true}'


class _Recording:
    """The connection's transport, with every write recorded (and still made)."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while (await receive()).get("more_body", False):
        pass
    if scope["path"] in ("/stream", "/later"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            if scope["path"] == "/later":
                await asyncio.sleep(0.01)  # the next token is not there yet
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if scope["path"] == "/later":
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(JSON)).encode())]
    if scope["path"] == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": JSON})


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[bytes]]]:
    writes: list[bytes] = []
    config = http_server_config(app, HttpLimitsConfig(), host="127.0.0.1", port=0)
    base: type[GuardedHttpTools] = config.http  # type: ignore[assignment]

    class Recorded(base):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(_Recording(transport, writes))  # type: ignore[arg-type]

    config.http = Recorded
    srv = uvicorn.Server(config)
    task = asyncio.create_task(srv.serve())
    while not srv.started:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield port, writes
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, 10)


async def _exchange(port: int, raw: bytes, until: bytes, count: int = 1) -> bytes:
    """Send ``raw``; read until ``until`` was seen ``count`` times, or the connection ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    data = b""
    while data.count(until) < count:
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        if not chunk:
            break
        data += chunk
    writer.close()
    return data


async def test_a_json_answer_is_one_write(server: tuple[int, list[bytes]]) -> None:
    port, writes = server
    request = b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    data = await _exchange(port, request + request, JSON, count=2)  # two on one connection
    assert data.count(b"HTTP/1.1 200 OK") == 2 and data.endswith(JSON)
    assert len(writes) == 2  # one per response
    for write in writes:
        assert write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b"\r\n\r\n" + JSON)
        assert b"content-length: 11\r\n" in write


async def test_connection_close_still_closes_after_the_one_write(server: tuple[int, list[bytes]]) -> None:
    port, writes = server
    data = await _exchange(port, b"GET /close HTTP/1.1\r\nhost: x\r\n\r\n", b"\x00never")  # reads to EOF
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(JSON)
    assert len(writes) == 1 and b"connection: close\r\n" in writes[0]


async def test_head_request_writes_the_head_alone(server: tuple[int, list[bytes]]) -> None:
    port, writes = server
    data = await _exchange(port, b"HEAD /x HTTP/1.1\r\nhost: x\r\n\r\n", b"\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200 OK") and b"content-length: 11" in data
    assert len(writes) == 1 and writes[0].endswith(b"\r\n\r\n")


async def test_a_stream_s_head_and_events_are_written_as_they_come(server: tuple[int, list[bytes]]) -> None:
    port, writes = server
    for path in (b"/stream", b"/later"):
        writes.clear()
        data = await _exchange(port, b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n", b"0\r\n\r\n")
        assert data.count(b"data: ") == 3
        assert writes[0].startswith(b"HTTP/1.1 200 OK") and writes[0].endswith(b"\r\n\r\n")  # the head alone
        assert b"transfer-encoding: chunked" in writes[0]
        assert [w.count(b"data: ") for w in writes] == [0, 1, 1, 1, 0]  # head, each event, the end


class _Wire:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class _Flow:
    write_paused = False

    async def drain(self) -> None:
        self.write_paused = False


def _cycle(wire: _Wire, flow: _Flow) -> HeadWithBodyCycle:
    import logging

    scope = {"type": "http", "method": "POST", "path": "/x", "http_version": "1.1"}
    return HeadWithBodyCycle(
        scope=scope, transport=wire, flow=flow, logger=logging.getLogger("t"),  # type: ignore[arg-type]
        access_logger=logging.getLogger("t"), access_log=False, default_headers=[], message_event=asyncio.Event(),
        expect_100_continue=False, keep_alive=True, on_response=lambda: None,
    )


START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"11")]}


async def test_with_writing_paused_nothing_is_held() -> None:
    """A slow reader paused writing: the head is written at once and the body after the
    drain, as uvicorn does (the stand-in transport is never installed across a wait)."""
    wire, flow = _Wire(), _Flow()
    cycle = _cycle(wire, flow)
    flow.write_paused = True
    await cycle.send(START)
    assert len(wire.writes) == 1 and wire.writes[0].endswith(b"\r\n\r\n")
    flow.write_paused = True
    await cycle.send({"type": "http.response.body", "body": JSON})
    assert wire.writes[1:] == [JSON] and cycle.response_complete


async def test_a_head_held_when_the_client_left_is_dropped() -> None:
    wire, flow = _Wire(), _Flow()
    cycle = _cycle(wire, flow)
    await cycle.send(START)
    assert wire.writes == []  # held for the body
    cycle.disconnected = True
    await asyncio.sleep(0)  # the end of the turn releases it: to nobody
    assert wire.writes == []
    await cycle.send({"type": "http.response.body", "body": JSON})  # uvicorn ignores it once disconnected
    assert wire.writes == []


async def test_a_large_body_is_not_held_past_the_bound() -> None:
    from gateway.server.http.guard import HOLD_BYTES

    wire, flow = _Wire(), _Flow()
    cycle = _cycle(wire, flow)
    big = b"x" * (HOLD_BYTES // 4)
    await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % (5 * len(big)))]})
    for i in range(5):  # one turn, no await that suspends
        await cycle.send({"type": "http.response.body", "body": big, "more_body": i < 4})
    # the head and the first parts, released once past the bound; the rest as they come
    assert len(wire.writes) == 2 and wire.writes[0].startswith(b"HTTP/1.1 200")
    assert HOLD_BYTES < len(wire.writes[0]) < HOLD_BYTES + len(big) + 256
    assert cycle.response_complete and sum(map(len, wire.writes)) > 5 * len(big)
