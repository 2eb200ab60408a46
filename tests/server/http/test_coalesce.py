"""CoalescingTransport on a real loopback TCP connection: what one loop turn writes
leaves in one send, in order; closing sends what is queued first; aborting drops it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from gateway.server.http.coalesce import CoalescingTransport


class _Sink(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


@pytest.fixture
async def pair() -> AsyncIterator[tuple[CoalescingTransport, socket.socket]]:
    """A coalescing transport on our side of a TCP connection, a plain socket on the other."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(_Sink, *listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    peer.setblocking(False)
    try:
        yield CoalescingTransport(transport, loop), peer  # type: ignore[arg-type]
    finally:
        transport.close()
        peer.close()


async def _read(peer: socket.socket, want: int) -> bytes:
    got = b""
    for _ in range(200):
        try:
            chunk = peer.recv(65536)
        except BlockingIOError:
            await asyncio.sleep(0.01)
            continue
        if not chunk:
            break
        got += chunk
        if len(got) >= want:
            break
    return got


async def test_writes_of_one_turn_leave_together_at_its_end(pair: tuple[CoalescingTransport, socket.socket]) -> None:
    out, peer = pair
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out.write(bytearray(b"body-1 "))
    out.write(memoryview(b"body-2"))
    out.write(b"")
    assert out.get_write_buffer_size() == 32
    with pytest.raises(BlockingIOError):  # nothing reached the socket within the turn
        peer.recv(65536)
    assert await _read(peer, 32) == b"HTTP/1.1 200 OK\r\n\r\nbody-1 body-2"
    out.writelines([b"a", b"b"])
    assert await _read(peer, 2) == b"ab"


async def test_write_now_sends_at_once_or_behind_what_the_turn_queued(pair: tuple[CoalescingTransport, socket.socket]) -> None:
    out, peer = pair
    out.write_now(b"token-1 ")
    assert out.get_write_buffer_size() == 0  # handed to the socket within the turn
    assert await _read(peer, 8) == b"token-1 "
    out.write(b"head ")
    out.write_now(b"token-2")  # queued: it must not overtake what this turn wrote first
    assert out.get_write_buffer_size() == 12
    assert await _read(peer, 12) == b"head token-2"


async def test_close_sends_what_is_queued_then_closes(pair: tuple[CoalescingTransport, socket.socket]) -> None:
    out, peer = pair
    out.write(b"last words")
    out.close()
    assert out.is_closing()
    assert await _read(peer, 100) == b"last words"  # then EOF


async def test_abort_drops_what_is_queued_and_late_writes_are_dropped(pair: tuple[CoalescingTransport, socket.socket]) -> None:
    out, peer = pair
    out.write(b"never sent")
    out.abort()
    out.write(b"after the end")  # no error: the flush sees a closing transport
    try:
        assert await _read(peer, 100) == b""  # the connection ended with nothing on it
    except ConnectionResetError:
        pass  # an abort may reset instead: nothing was sent either way


async def test_the_wrapped_transport_answers_the_rest(pair: tuple[CoalescingTransport, socket.socket]) -> None:
    out, peer = pair
    assert out.get_extra_info("peername") == peer.getsockname()
    out.pause_reading()
    out.resume_reading()
    assert out.is_reading()  # through __getattr__
    out.write(b"x")
    out.write_eof()
    assert await _read(peer, 10) == b"x"
