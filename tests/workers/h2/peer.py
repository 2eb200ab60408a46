"""An HTTP/2 server on 127.0.0.1 built on the ``h2`` library, as the gateway's own client's
independent peer: a test scripts each call's answer (headers, gRPC messages cut into DATA
frames any way, trailers, resets, GOAWAY, pings, raw bytes) and sees what the client sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hyperframe.frame


@dataclass
class PeerRequest:
    stream_id: int
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reset: int | None = None  # the error code of the client's RST_STREAM, if any
    reset_seen: asyncio.Event = field(default_factory=asyncio.Event)

    def messages(self) -> list[bytes]:
        """The request body's gRPC messages (5-byte prefix each)."""
        out, pos, body = [], 0, bytes(self.body)
        while pos + 5 <= len(body):
            size = int.from_bytes(body[pos + 1:pos + 5], "big")
            out.append(body[pos + 5:pos + 5 + size])
            pos += 5 + size
        return out


def grpc_message(payload: bytes, *, compressed: bool = False) -> bytes:
    return bytes((1 if compressed else 0,)) + len(payload).to_bytes(4, "big") + payload


class Reply:
    """What one call's handler sends back (each method writes at once)."""

    def __init__(self, conn: PeerConnection, request: PeerRequest) -> None:
        self.conn = conn
        self.request = request
        self.stream_id = request.stream_id

    def headers(self, status: int = 200, extra: tuple[tuple[str, str], ...] = (), *, end: bool = False) -> None:
        self.conn.h2.send_headers(
            self.stream_id, [(":status", str(status)), ("content-type", "application/grpc"), *extra], end_stream=end,
        )
        self.conn.flush()

    def data(self, payload: bytes, *, cuts: list[int] | None = None, pad: int | None = None) -> None:
        """``payload`` as DATA frames of the sizes in ``cuts`` (cycled), or one frame."""
        pos = 0
        k = 0
        while pos < len(payload):
            size = cuts[k % len(cuts)] if cuts else len(payload)
            self.conn.h2.send_data(self.stream_id, payload[pos:pos + size], pad_length=pad)
            pos += size
            k += 1
        self.conn.flush()

    def messages(self, payloads: list[bytes], **kwargs: Any) -> None:
        self.data(b"".join(grpc_message(p) for p in payloads), **kwargs)

    def trailers(self, code: int = 0, message: str = "", extra: tuple[tuple[str, str], ...] = ()) -> None:
        fields = [("grpc-status", str(code)), *extra]
        if message:
            fields.append(("grpc-message", message))
        self.conn.h2.send_headers(self.stream_id, fields, end_stream=True)
        self.conn.flush()

    def end_data(self) -> None:
        """END_STREAM on an empty DATA frame: no trailers (a broken gRPC server)."""
        self.conn.h2.end_stream(self.stream_id)
        self.conn.flush()

    def reset(self, code: int) -> None:
        self.conn.h2.reset_stream(self.stream_id, code)
        self.conn.flush()


Handler = Callable[[PeerRequest, Reply], Awaitable[None]]


async def ok_handler(request: PeerRequest, reply: Reply) -> None:
    """Echo the request's message back twice, then OK."""
    payloads = request.messages()
    reply.headers()
    reply.messages(payloads * 2)
    reply.trailers(0)


def echo_after(release: asyncio.Event) -> Handler:
    """Answer the headers at once, the request's messages once ``release`` is set."""

    async def handler(request: PeerRequest, reply: Reply) -> None:
        reply.headers()
        await release.wait()
        reply.messages(request.messages())
        reply.trailers(0)

    return handler


async def hang_handler(request: PeerRequest, reply: Reply) -> None:
    """Answer the headers, then nothing (until the test ends)."""
    reply.headers()
    await asyncio.sleep(30)


class PeerConnection(asyncio.Protocol):
    def __init__(self, server: Peer) -> None:
        self.server = server
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.requests: dict[int, PeerRequest] = {}
        self.pings_acked = 0
        self.lost = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.local_settings = h2.settings.Settings(client=False, initial_values=self.server.settings)
        self.h2.initiate_connection()
        self.flush()
        self.server.connections.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.h2.data_to_send())

    def raw(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        opened: list[int] = []  # streams whose request began in this read
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                headers = dict(event.headers)  # type: ignore[arg-type]
                req = PeerRequest(event.stream_id, headers)  # type: ignore[arg-type]
                opened.append(event.stream_id)  # type: ignore[arg-type]
                self.requests[event.stream_id] = req  # type: ignore[index]
                self.server.requests.append(req)
            elif isinstance(event, h2.events.DataReceived):
                req = self.requests[event.stream_id]  # type: ignore[index]
                req.body += event.data  # type: ignore[operator]
                if not self.server.hold_window:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)  # type: ignore[arg-type]
            elif isinstance(event, h2.events.StreamEnded):
                req = self.requests[event.stream_id]  # type: ignore[index]
                req.ended.set()
                task = asyncio.get_running_loop().create_task(self.server.handler(req, Reply(self, req)))
                self.server.tasks.add(task)
                task.add_done_callback(self.server.tasks.discard)
            elif isinstance(event, h2.events.StreamReset):
                req = self.requests.get(event.stream_id)  # type: ignore[arg-type]
                if req is not None:
                    req.reset = int(event.error_code)  # type: ignore[arg-type]
                    req.reset_seen.set()
            elif isinstance(event, h2.events.PingAckReceived):
                self.pings_acked += 1
        if opened:
            self.server.opened_per_read.append(opened)
        self.flush()

    def release_window(self) -> None:
        """Give back every byte received so far (after ``hold_window``)."""
        for req in self.requests.values():
            with contextlib.suppress(Exception):
                self.h2.increment_flow_control_window(len(req.body), stream_id=req.stream_id)
        self.h2.increment_flow_control_window(sum(len(r.body) for r in self.requests.values()))
        self.flush()

    def goaway(self, last_stream_id: int, code: int = 0) -> None:
        """A graceful GOAWAY: streams up to ``last_stream_id`` go on (h2's own
        ``close_connection`` would end them all, so the frame is written beside it)."""
        self.raw(hyperframe.frame.GoAwayFrame(stream_id=0, last_stream_id=last_stream_id, error_code=code).serialize())

    def ping(self) -> None:
        self.h2.ping(b"12345678")
        self.flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Peer:
    """``async with Peer(handler) as peer``: a server on 127.0.0.1, ``peer.port``."""

    def __init__(self, handler: Handler = ok_handler, *, settings: dict[int, int] | None = None, hold_window: bool = False) -> None:
        self.handler = handler
        self.settings = dict(settings or {})
        self.hold_window = hold_window
        self.requests: list[PeerRequest] = []
        self.connections: list[PeerConnection] = []
        self.opened_per_read: list[list[int]] = []  # per socket read that began requests, their stream ids
        self.tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Peer:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: PeerConnection(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self.tasks):
            task.cancel()
        for conn in self.connections:
            conn.close()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def wait_requests(self, n: int, timeout: float = 5.0) -> list[PeerRequest]:
        async with asyncio.timeout(timeout):
            while len(self.requests) < n:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        return self.requests


ErrorCodes = h2.errors.ErrorCodes
