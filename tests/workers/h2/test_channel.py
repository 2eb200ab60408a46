"""The gateway's own HTTP/2 client for Generate streams, against an independent HTTP/2
server (the ``h2`` library, ``peer.py``): what it sends, grpc.aio's reading semantics,
every way a call ends, flow control both ways, GOAWAY, lost connections and reconnects."""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.parse

import pytest

from gateway.workers.h2 import H2Call, H2Channel
from gateway.workers.h2 import connection as h2_connection
from gateway.workers.reply_bound import ReplyTooLarge
from gateway.workers.transport import END_OF_STREAM, CallCode, WorkerCallError
from tests.workers.h2.peer import (
    ErrorCodes,
    Peer,
    PeerRequest,
    Reply,
    echo_after,
    grpc_message,
    hang_handler,
    ok_handler,
)

METHOD = "/sglang.grpc.scheduler.SglangScheduler/Generate"


def channel(peer: Peer, **kwargs: object) -> H2Channel:
    return H2Channel("127.0.0.1", peer.port, f"127.0.0.1:{peer.port}", **kwargs)  # type: ignore[arg-type]


def start(ch: H2Channel, request: bytes = b"req", **kwargs: object) -> H2Call:
    return ch.unary_stream(METHOD, request, bytes, **kwargs)  # type: ignore[arg-type]


async def read_all(call: H2Call) -> list[bytes]:
    return [m async for m in call]


async def test_a_call_sends_a_grpc_request_and_reads_messages_to_eof() -> None:
    async with Peer() as peer:
        ch = channel(peer)
        call = start(ch, b"hello", timeout=30.0, metadata=[("x-request-id", "r-1"), ("authorization", "Bearer k")])
        assert await read_all(call) == [b"hello", b"hello"]
        assert await call.read() is END_OF_STREAM  # and again, as grpc.aio
        req = peer.requests[0]
        h = req.headers
        assert (h[":method"], h[":scheme"], h[":path"]) == ("POST", "http", METHOD)
        assert h[":authority"] == f"127.0.0.1:{peer.port}"
        assert h["content-type"] == "application/grpc" and h["te"] == "trailers"
        assert h["grpc-timeout"] == "30000m" and h["x-request-id"] == "r-1" and h["authorization"] == "Bearer k"
        assert h["user-agent"].startswith("token-gateway/")
        assert req.messages() == [b"hello"]
        assert call.status is not None and call.status.code is CallCode.OK
        await ch.close()


@pytest.mark.parametrize("cuts", [[1], [3, 1, 7], [2, 50], [4096]])
async def test_messages_cut_anywhere_across_frames_come_out_whole(cuts: list[int]) -> None:
    payloads = [b"a" * n for n in (0, 1, 5, 17, 300, 2)]

    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers()
        reply.messages(payloads, cuts=cuts)
        reply.trailers(0)

    async with Peer(handler) as peer:
        ch = channel(peer)
        assert await read_all(start(ch)) == payloads
        await ch.close()


async def test_messages_that_arrived_together_are_ready_without_waiting() -> None:
    gate = asyncio.Event()

    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers()
        reply.messages([b"1", b"2", b"3"])  # one DATA frame, one socket write
        await gate.wait()
        reply.messages([b"4"])
        reply.trailers(0)

    async with Peer(handler) as peer:
        ch = channel(peer)
        call = start(ch)
        assert not call.ready()
        assert await call.read() == b"1"
        assert call.ready()
        assert [await call.read(), await call.read()] == [b"2", b"3"]
        assert not call.ready()
        gate.set()
        assert await read_all(call) == [b"4"]
        assert call.ready()  # ended: a read returns at once
        await ch.close()


async def test_an_error_status_comes_after_the_messages_before_it() -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers(extra=(("x-initial", "i"),))
        reply.messages([b"m1"])
        reply.trailers(3, urllib.parse.quote("bad input: ünïcode\n", safe=" :"), extra=(("x-detail", "d"),))

    async with Peer(handler) as peer:
        ch = channel(peer)
        call = start(ch)
        assert await call.read() == b"m1"
        with pytest.raises(WorkerCallError) as err:
            await call.read()
        assert err.value.code is CallCode.INVALID_ARGUMENT
        assert err.value.message == "bad input: ünïcode\n"
        assert call.status is not None and ("x-detail", "d") in call.status.trailing
        assert ("x-initial", "i") in call.initial_metadata
        with pytest.raises(WorkerCallError):
            await call.read()  # stays failed
        await ch.close()


async def test_trailers_only_and_http_errors() -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        which = request.messages()[0]
        if which == b"trailers-only":
            reply.headers(extra=(("grpc-status", "14"), ("grpc-message", "down")), end=True)
        elif which == b"http-503":
            reply.headers(status=503, end=True)
        elif which == b"http-404":
            reply.headers(status=404, end=True)
        elif which == b"no-status":
            reply.headers()
            reply.conn.h2.send_headers(reply.stream_id, [("x-other", "1")], end_stream=True)
            reply.conn.flush()
        elif which == b"data-end":
            reply.headers()
            reply.messages([b"x"])
            reply.end_data()

    async with Peer(handler) as peer:
        ch = channel(peer)
        expected = {
            b"trailers-only": (CallCode.UNAVAILABLE, "down"),
            b"http-503": (CallCode.UNAVAILABLE, "Received http2 header with status: 503"),
            b"http-404": (CallCode.UNIMPLEMENTED, "Received http2 header with status: 404"),
            b"no-status": (CallCode.UNKNOWN, "missing grpc-status in the trailers"),
            b"data-end": (CallCode.INTERNAL, "the worker ended the stream without a status"),
        }
        for which, (code, details) in expected.items():
            with pytest.raises(WorkerCallError) as err:
                await read_all(start(ch, which))
            assert (err.value.code, err.value.message) == (code, details), which
        await ch.close()


@pytest.mark.parametrize(
    ("code", "status"),
    [(ErrorCodes.REFUSED_STREAM, CallCode.UNAVAILABLE), (ErrorCodes.CANCEL, CallCode.CANCELLED),
     (ErrorCodes.INTERNAL_ERROR, CallCode.INTERNAL)],
)
async def test_a_reset_from_the_worker_ends_the_call(code: ErrorCodes, status: CallCode) -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        if request.messages()[0] == b"again":
            await ok_handler(request, reply)
            return
        reply.headers()
        reply.messages([b"m"])
        reply.reset(code)

    async with Peer(handler) as peer:
        ch = channel(peer)
        call = start(ch)
        assert await call.read() == b"m"
        with pytest.raises(WorkerCallError) as err:
            await call.read()
        assert err.value.code is status
        assert await read_all(start(ch, b"again")) == [b"again", b"again"]  # the connection stays usable
        assert len(peer.connections) == 1
        await ch.close()


async def test_cancel_resets_the_stream_and_fails_the_pending_read_only() -> None:
    async with Peer(hang_handler) as peer:
        ch = channel(peer)
        call = start(ch)
        reader = asyncio.ensure_future(call.read())
        await peer.wait_requests(1)
        await asyncio.sleep(0.01)
        assert call.cancel() and not call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        with pytest.raises(asyncio.CancelledError):
            await call.read()
        req = peer.requests[0]
        await asyncio.wait_for(req.reset_seen.wait(), 5)
        assert req.reset == ErrorCodes.CANCEL
        assert call.status is not None and call.status.code is CallCode.CANCELLED
        await ch.close()


async def test_cancelling_the_reading_task_cancels_the_call() -> None:
    async with Peer(hang_handler) as peer:
        ch = channel(peer)
        call = start(ch)
        task = asyncio.ensure_future(read_all(call))
        await peer.wait_requests(1)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        req = peer.requests[0]
        await asyncio.wait_for(req.reset_seen.wait(), 5)
        assert req.reset == ErrorCodes.CANCEL and call.cancelled
        await ch.close()


async def test_a_deadline_ends_the_call_and_tells_the_worker() -> None:
    async with Peer(hang_handler) as peer:
        ch = channel(peer)
        call = start(ch, timeout=0.2)
        with pytest.raises(WorkerCallError) as err:
            await read_all(call)
        assert err.value.code is CallCode.DEADLINE_EXCEEDED
        req = peer.requests[0]
        assert req.headers["grpc-timeout"] == "200m"
        await asyncio.wait_for(req.reset_seen.wait(), 5)
        await ch.close()


async def test_pings_are_answered() -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.conn.ping()
        reply.headers()
        await asyncio.sleep(0.05)
        reply.messages([b"x"])
        reply.trailers(0)

    async with Peer(handler) as peer:
        ch = channel(peer)
        assert await read_all(start(ch)) == [b"x"]
        assert peer.connections[0].pings_acked == 1
        await ch.close()


async def test_headers_continued_and_padded_data() -> None:
    big = "v" * 40_000  # more than one frame: HEADERS + CONTINUATION

    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers(extra=(("x-big", big),))
        reply.data(grpc_message(b"padded") + grpc_message(b"twice"), cuts=[3, 9], pad=7)
        reply.trailers(0, extra=(("x-big-trailer", big),))

    async with Peer(handler) as peer:
        ch = channel(peer)
        assert await read_all(start(ch)) == [b"padded", b"twice"]
        await ch.close()


async def test_a_compressed_or_oversized_message_fails_the_call_not_the_connection() -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        which = request.messages()[0]
        reply.headers()
        if which == b"compressed":
            reply.data(grpc_message(b"zz", compressed=True))
        elif which == b"big":
            reply.messages([b"x" * 500])
        else:
            reply.messages([b"fine"])
        reply.trailers(0)

    async with Peer(handler) as peer:
        ch = channel(peer, max_message=100)
        with pytest.raises(WorkerCallError) as err:
            await read_all(start(ch, b"compressed"))
        assert err.value.code is CallCode.INTERNAL
        with pytest.raises(WorkerCallError) as err:
            await read_all(start(ch, b"big"))
        assert err.value.code is CallCode.RESOURCE_EXHAUSTED
        assert await read_all(start(ch, b"ok")) == [b"fine"]
        # a call's own bound, below the channel's, refuses what the channel would take
        with pytest.raises(ReplyTooLarge):
            await read_all(start(ch, b"ok", max_message=3))
        assert len(peer.connections) == 1
        await ch.close()


async def test_a_malformed_frame_fails_the_connection_and_the_next_call_reconnects() -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        if request.messages()[0] == b"break":
            reply.headers()
            reply.conn.raw(b"\x00\x00\x03\x03\x00\x00\x00\x00\x01abc")  # RST_STREAM of 3 bytes
            return
        await ok_handler(request, reply)

    async with Peer(handler) as peer:
        ch = channel(peer)
        with pytest.raises(WorkerCallError) as err:
            await read_all(start(ch, b"break"))
        assert err.value.code is CallCode.UNAVAILABLE
        assert await read_all(start(ch, b"again")) == [b"again", b"again"]
        assert len(peer.connections) == 2
        await ch.close()


async def test_goaway_fails_only_the_calls_the_worker_never_saw() -> None:
    release = asyncio.Event()
    handler = echo_after(release)

    async with Peer(handler) as peer:
        ch = channel(peer)
        calls = [start(ch, bytes([65 + i])) for i in range(3)]  # streams 1, 3, 5
        await peer.wait_requests(3)
        peer.connections[0].goaway(last_stream_id=3)
        with pytest.raises(WorkerCallError) as err:
            await read_all(calls[2])
        assert err.value.code is CallCode.UNAVAILABLE
        release.set()
        assert [await read_all(c) for c in calls[:2]] == [[b"A"], [b"B"]]
        later = start(ch, b"new")  # goes on a new connection
        assert await read_all(later) == [b"new"]
        assert len(peer.connections) == 2
        await ch.close()


async def test_a_lost_connection_fails_open_calls_and_a_new_call_reconnects() -> None:
    async def handler(request: PeerRequest, reply: Reply) -> None:
        if request.messages()[0] == b"hang":
            reply.headers()
            reply.messages([b"one"])
            await asyncio.sleep(0.05)
            reply.conn.close()
            return
        reply.headers()
        reply.messages([b"fine"])
        reply.trailers(0)

    async with Peer(handler) as peer:
        ch = channel(peer)
        call = start(ch, b"hang")
        assert await call.read() == b"one"
        with pytest.raises(WorkerCallError) as err:
            await call.read()
        assert err.value.code is CallCode.UNAVAILABLE
        assert await read_all(start(ch, b"x")) == [b"fine"]
        await ch.close()


async def test_a_dead_worker_fails_fast_and_is_retried_after_the_backoff() -> None:
    async with Peer() as peer:
        port = peer.port
    ch = H2Channel("127.0.0.1", port, f"127.0.0.1:{port}", initial_backoff_s=0.2, max_backoff_s=0.4)
    with pytest.raises(WorkerCallError) as err:
        await read_all(start(ch))
    assert err.value.code is CallCode.UNAVAILABLE and "failed to connect" in err.value.message
    # Within the back-off: no new attempt, the same error at once.
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(WorkerCallError):
        await read_all(start(ch))
    assert loop.time() - t0 < 0.1
    await asyncio.sleep(0.25)
    with pytest.raises(WorkerCallError):
        await read_all(start(ch))  # a new attempt, failing again
    await ch.close()


async def test_a_large_request_waits_for_the_workers_windows() -> None:
    body = bytes(range(256)) * 1200  # 300 KB: far over a 1,000-byte window and 16 KB frames

    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers()
        reply.messages([len(request.messages()[0]).to_bytes(4, "big")])
        reply.trailers(0)

    async with Peer(handler, settings={4: 1000}, hold_window=True) as peer:
        ch = channel(peer)
        call = start(ch, body)
        await peer.wait_requests(1)
        await asyncio.sleep(0.05)
        req = peer.requests[0]
        assert len(req.body) <= 1000 and not req.ended.is_set()  # held back by the stream window
        peer.hold_window = False
        peer.connections[0].release_window()
        assert await read_all(call) == [(len(body)).to_bytes(4, "big")]
        assert req.messages() == [body]
        await ch.close()


async def test_the_receive_window_is_given_back_as_the_reader_takes_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h2_connection, "STREAM_WINDOW", 16_384)
    many = [bytes([i % 251]) * 1000 for i in range(100)]  # 100 KB through a 16 KB window
    whole = b"w" * 50_000  # one message larger than the whole window

    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers()
        for payload in [*many, whole]:
            frame = grpc_message(payload)
            sent = 0
            while sent < len(frame):  # h2 refuses what the window does not allow: wait for it
                room = reply.conn.h2.local_flow_control_window(reply.stream_id)
                if room <= 0:
                    await asyncio.sleep(0.002)
                    continue
                reply.data(frame[sent:sent + room])
                sent += room
        reply.trailers(0)

    async with Peer(handler) as peer:
        ch = channel(peer)
        call = start(ch)
        got = []
        async for message in call:
            got.append(message)
            await asyncio.sleep(0)  # a slow reader
        assert got == [*many, whole]
        await ch.close()


async def test_more_calls_than_the_worker_allows_open_another_connection() -> None:
    release = asyncio.Event()
    handler = echo_after(release)

    async with Peer(handler, settings={3: 1}) as peer:
        ch = channel(peer)
        first = start(ch, b"1")
        await peer.wait_requests(1)
        await asyncio.sleep(0.02)  # the worker's SETTINGS have arrived
        second = start(ch, b"2")
        await peer.wait_requests(2)
        release.set()
        assert [await read_all(first), await read_all(second)] == [[b"1"], [b"2"]]
        assert len(peer.connections) == 2
        await ch.close()


async def test_closing_the_channel_ends_open_calls_and_refuses_new_ones() -> None:
    async with Peer(hang_handler) as peer:
        ch = channel(peer)
        call = start(ch)
        await peer.wait_requests(1)
        await ch.close()
        with pytest.raises(WorkerCallError) as err:
            await call.read()
        assert err.value.code is CallCode.UNAVAILABLE
        with pytest.raises(WorkerCallError):
            await start(ch).read()


async def test_a_call_cancelled_while_connecting_never_reaches_the_worker() -> None:
    async with Peer() as peer:
        ch = channel(peer)
        call = start(ch)  # no connection yet: the call waits for one
        assert call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call.read()
        await asyncio.sleep(0.05)
        assert peer.requests == []
        assert await read_all(start(ch, b"after")) == [b"after", b"after"]
        await ch.close()


async def test_a_deadline_passes_while_the_connection_is_still_being_made() -> None:
    """A worker that accepts TCP but never finishes the TLS handshake: the call ends at its
    deadline, not at the connect timeout."""
    import ssl

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    context = ssl.create_default_context()
    context.set_alpn_protocols(["h2"])
    ch = H2Channel("127.0.0.1", port, f"127.0.0.1:{port}", ssl_context=context, connect_timeout_s=20.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(WorkerCallError) as err:
        await read_all(start(ch, timeout=0.2))
    assert err.value.code is CallCode.DEADLINE_EXCEEDED
    assert loop.time() - t0 < 2.0
    await ch.close()
    server.close()


async def test_request_headers_larger_than_a_frame_go_in_continuation_frames() -> None:
    async with Peer() as peer:
        ch = channel(peer)
        big = "k" * 40_000
        assert await read_all(start(ch, b"x", metadata=[("authorization", f"Bearer {big}")])) == [b"x", b"x"]
        assert peer.requests[0].headers["authorization"] == f"Bearer {big}"
        await ch.close()



async def test_the_first_call_of_a_loop_turn_leaves_at_once_the_others_together_at_its_end() -> None:
    async with Peer() as peer:
        ch = channel(peer)
        assert await read_all(start(ch, b"first")) == [b"first", b"first"]  # the connection is up
        await asyncio.sleep(0.05)  # the peer has read everything sent so far
        transport = peer.connections[0].transport
        assert transport is not None
        # A second handle on the peer's socket, to look at what the kernel holds for it.
        server_side = socket.socket(fileno=os.dup(transport.get_extra_info("socket").fileno()))
        try:
            calls = [start(ch, f"r{i}".encode()) for i in range(4)]  # one turn: no await in between
            # Only the first call was written yet: the others leave at the turn's end.
            held = server_side.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            assert b"r0" in held and not any(f"r{i}".encode() in held for i in (1, 2, 3))
            await asyncio.sleep(0)  # the turn ends: the other three go in one write
            held = server_side.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            assert all(f"r{i}".encode() in held for i in range(4))
        finally:
            server_side.close()  # the duplicate only: the peer's own handle stays open
        assert [await read_all(c) for c in calls] == [[f"r{i}".encode()] * 2 for i in range(4)]
        assert [r.messages() for r in peer.requests[1:]] == [[f"r{i}".encode()] for i in range(4)]
        await ch.close()
