"""Raw-socket attacks on the HTTP server: oversized and numerous headers, slow heads and
bodies. Each gets its 431/408 and a closed connection while a normal request is still
served, and the gateway's memory and admission counters return to where they were."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway_lab.bench.soak_targets import rss_mb
from tests.e2e.http.conftest import Stack

KEY = "sk-guard"
LIMITS = {"max_header_bytes": 8192, "max_headers": 32, "header_timeout_s": 0.5, "body_timeout_s": 0.5}
pytestmark = pytest.mark.stack(server={"api_keys": [KEY]}, sections={"http": LIMITS})
BOUND = 20.0  # generous: an attack never delays a normal request anywhere near this


async def _open(stack: Stack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = stack.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _status(reader: asyncio.StreamReader) -> int:
    line = await asyncio.wait_for(reader.readline(), BOUND)
    return int(line.split()[1]) if line else 0


async def _closed(reader: asyncio.StreamReader) -> bool:
    with contextlib.suppress(ConnectionError):
        await asyncio.wait_for(reader.read(), BOUND)  # reads to EOF
    return True


async def _still_serves(stack: Stack) -> None:
    reply = await asyncio.wait_for(stack.http.get("/health"), BOUND)
    assert reply.status_code == 200
    reply = await asyncio.wait_for(
        stack.http.post("/v1/completions", json={"model": stack.model, "prompt": "hi", "max_tokens": 2},
                        headers={"authorization": f"Bearer {KEY}"}), BOUND)
    assert reply.status_code == 200, reply.text


async def _send_slowly(writer: asyncio.StreamWriter, chunks: list[bytes]) -> None:
    with contextlib.suppress(ConnectionError):
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()


async def test_oversized_header_gets_431_before_auth_and_others_are_served(stack: Stack) -> None:
    before = rss_mb()
    reader, writer = await _open(stack)
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-big: "
    # 64 MiB offered in 64 KiB writes: the gateway must cut it off after its limit.
    status = asyncio.create_task(_status(reader))  # read while sending, as a real client's stack would
    sender = asyncio.create_task(_send_slowly(writer, [head] + [b"a" * 65536] * 1024))
    await _still_serves(stack)
    assert await status == 431
    sender.cancel()
    with contextlib.suppress(BaseException):
        await sender
    writer.close()
    await _still_serves(stack)
    assert rss_mb() - before < 64  # nowhere near the 64 MiB offered
    assert stack.state.admission.in_flight == 0


async def test_too_many_headers_gets_431(stack: Stack) -> None:
    reader, writer = await _open(stack)
    lines = b"".join(b"x-h%d: v\r\n" % i for i in range(40))
    writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
    await writer.drain()
    assert await _status(reader) == 431
    assert await _closed(reader)
    writer.close()
    await _still_serves(stack)


async def test_headers_within_limits_are_served(stack: Stack) -> None:
    reader, writer = await _open(stack)
    lines = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(20))
    writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n" + lines + b"\r\n")
    await writer.drain()
    assert await _status(reader) == 200
    writer.close()


async def test_slow_heads_get_408_and_do_not_block_others(stack: Stack) -> None:
    conns = [await _open(stack) for _ in range(32)]
    for i, (_, writer) in enumerate(conns):
        if i % 2:  # half say nothing at all, half send a head that never ends
            writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: ")
            await writer.drain()
    await _still_serves(stack)
    statuses = await asyncio.gather(*(_status(r) for r, _ in conns))
    assert statuses == [408] * 32
    for reader, writer in conns:
        assert await _closed(reader)
        writer.close()
    await _still_serves(stack)


async def test_slow_body_gets_408_and_frees_the_admission_slot(stack: Stack) -> None:
    reader, writer = await _open(stack)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY.encode()
        + b"\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"prompt\": "
    )
    await writer.drain()
    await _still_serves(stack)
    assert await _status(reader) == 408
    assert await _closed(reader)
    writer.close()
    for _ in range(200):  # the handler sees the disconnect and unwinds (bounded wait)
        if stack.state.admission.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    assert stack.state.admission.in_flight == 0
    await _still_serves(stack)


async def test_keep_alive_connection_serves_several_requests(stack: Stack) -> None:
    reader, writer = await _open(stack)
    for _ in range(3):
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        assert await _status(reader) == 200
        while (line := await asyncio.wait_for(reader.readline(), BOUND)) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
    writer.close()
