"""One HTTP/2 connection to a worker (workers/h2/connection.py), against an independent
``h2``-library peer: settings exchanged, calls on their own streams, PINGs answered,
window credit given back in worth-while amounts, GOAWAY and close ending calls."""

from __future__ import annotations

import asyncio

import pytest

from gateway.workers.h2 import frames
from gateway.workers.h2.call import H2Call
from gateway.workers.h2.connection import STREAM_WINDOW, H2Connection
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from tests.workers.h2.peer import Peer, hang_handler


def _block(authority: str) -> bytes:
    return b"".join((
        frames.METHOD_POST, frames.SCHEME_HTTP,
        frames.literal_indexed_name(frames.PATH_INDEX, b"/test.Echo/Call"),
        frames.literal_indexed_name(frames.AUTHORITY_INDEX, authority.encode()),
        frames.literal(b"content-type", b"application/grpc"), frames.literal(b"te", b"trailers"),
    ))


def _body(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


async def _connect(peer: Peer) -> H2Connection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: H2Connection(f"127.0.0.1:{peer.port}"), "127.0.0.1", peer.port)
    await asyncio.wait_for(conn.settings_received, 5)
    return conn


def _call(conn: H2Connection, payload: bytes) -> H2Call:
    call = H2Call(asyncio.get_running_loop(), bytes, 1 << 20)
    conn.open(call, _block(conn.authority), _body(payload))
    return call


async def test_calls_run_on_their_own_streams() -> None:
    async with Peer() as peer:  # echoes each request's message twice, then OK
        conn = await _connect(peer)
        try:
            first, second = _call(conn, b"one"), _call(conn, b"two")
            assert (first.stream_id, second.stream_id) == (1, 3) and conn.next_stream_id == 5
            assert [m async for m in first] == [b"one", b"one"]
            assert [m async for m in second] == [b"two", b"two"]
            assert await first.read() is END_OF_STREAM and conn.calls == {}
            requests = await peer.wait_requests(2)
            assert requests[0].headers[":path"] == "/test.Echo/Call" and requests[0].messages() == [b"one"]
        finally:
            conn.close()


async def test_pings_are_answered_and_credit_is_given_back_in_worthwhile_amounts() -> None:
    async with Peer(hang_handler) as peer:
        conn = await _connect(peer)
        try:
            call = _call(conn, b"x")
            await peer.wait_requests(1)
            peer.connections[0].ping()
            for _ in range(200):  # bounded: the ack comes back within a few loop turns
                if peer.connections[0].pings_acked:
                    break
                await asyncio.sleep(0.005)
            assert peer.connections[0].pings_acked == 1
            assert not conn.credit(call.stream_id, 10, False)  # too small to be worth a frame
            assert conn.credit(call.stream_id, STREAM_WINDOW // 4, False) and conn.credit(call.stream_id, 1, True)
        finally:
            conn.close()


async def test_close_and_goaway_end_the_open_calls() -> None:
    async with Peer(hang_handler) as peer:
        conn = await _connect(peer)
        call = _call(conn, b"x")
        await peer.wait_requests(1)
        assert conn.can_open()
        conn.close()
        assert conn.closing and conn.lost and not conn.can_open()
        with pytest.raises(WorkerCallError) as err:
            await call.read()
        assert err.value.code is CallCode.UNAVAILABLE
        conn.close()  # twice is fine
    async with Peer(hang_handler) as peer:
        conn = await _connect(peer)
        try:
            seen = _call(conn, b"a")
            await peer.wait_requests(1)
            peer.connections[0].goaway(last_stream_id=seen.stream_id)
            for _ in range(200):  # bounded
                if conn.closing:
                    break
                await asyncio.sleep(0.005)
            assert conn.closing and not conn.can_open() and seen.stream_id in conn.calls  # the worker saw it: it goes on
        finally:
            conn.close()


async def test_header_blocks_decode_as_a_fresh_decoder_does_while_repeats_are_kept() -> None:
    """Kept header lists are handed out only while the dynamic table is as it was: blocks
    that insert (with and without evictions in a small table), shrink the table, or repeat
    decode exactly as an independent decoder fed every block."""
    import random

    from hpack import Decoder, Encoder

    encoder, reference = Encoder(), Decoder()
    conn = H2Connection("127.0.0.1:1")
    rng = random.Random(7)
    pool = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"0"),
            (b"grpc-message", b""), (b"x-a", b"1"), (b"x-a", b"2"), (b"x-b", b"long" * 20)]
    kept = 0
    # A one-entry table: the same index names another header after an insertion evicts.
    encoder.header_table_size = 48
    for headers in ([(b"x-a", b"1")], [(b"x-a", b"1")], [(b"x-a", b"2")], [(b"x-a", b"2")], [(b"x-a", b"1")]):
        block = encoder.encode(headers)
        assert [tuple(h) for h in conn._decode_block(block)] == [tuple(h) for h in reference.decode(block, raw=True)]
    encoder.header_table_size = 4096
    for step in range(400):
        if step in (100, 250):
            encoder.header_table_size = 96 if step == 100 else 4096  # evictions, then room again
        headers = rng.sample(pool, rng.randint(1, 3))
        block = encoder.encode(headers)
        expected = reference.decode(block, raw=True)
        before = conn._decoded.get(block)
        got = conn._decode_block(block)
        assert [tuple(h) for h in got] == [tuple(h) for h in expected]
        kept += before is not None and got is before
    assert kept > 100  # repeats are the common case
