"""One HTTP/2 connection to a worker, carrying Generate calls (an asyncio protocol).

Each socket read is cut into frames in one pass; every call whose DATA arrived gets
its messages queued and its reader woken once, however many messages came. The
connection owns the HTTP/2 state a client needs for these calls: settings in both
directions, flow control (receive windows given back as readers consume, the request
body held back while the worker's windows are full), stream ids, PING answers and
keepalive, GOAWAY (calls the worker never saw end as UNAVAILABLE, the others finish)
and RST_STREAM. Anything the worker sends that breaks the protocol closes the
connection and fails its calls; nothing here raises into the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import cast

from hpack import Decoder
from hpack.exceptions import HPACKError

from gateway.workers.h2 import frames
from gateway.workers.h2.call import H2Call
from gateway.workers.transport import CallCode

log = logging.getLogger(__name__)

STREAM_WINDOW = 4 * 1024 * 1024  # per call: output a reader has not taken yet, at most
CONNECTION_WINDOW = 64 * 1024 * 1024
CREDIT_STEP = STREAM_WINDOW // 4  # received bytes worth a WINDOW_UPDATE of their own
MAX_HEADER_LIST = 1024 * 1024

_DECODED_BLOCKS = 64  # distinct header blocks kept decoded per connection

_END_STREAM = frames.END_STREAM
_DATA = frames.DATA
_HEAD = frames.HEAD.unpack_from


class ProtocolViolation(Exception):
    """The worker broke HTTP/2: the connection is closed with this error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2Connection(asyncio.Protocol):
    """The client side of one HTTP/2 connection (prior knowledge, or TLS with ALPN h2)."""

    def __init__(self, authority: str, *, keepalive_s: float = 300.0, keepalive_timeout_s: float = 20.0) -> None:
        self.authority = authority
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, H2Call] = {}
        self.next_stream_id = 1
        self.closing = False  # GOAWAY seen or sent: no new calls
        self.lost = False
        self._loop = asyncio.get_running_loop()
        self._buffer = b""
        self._decoder = Decoder(max_header_list_size=MAX_HEADER_LIST)
        # Header blocks seen before, decoded, while the dynamic table is as it was then
        # (``_decode_block``): a worker sends every call the same few blocks.
        self._decoded: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._table_state: tuple[int, object, int] = self._table_now()
        self._header_stream = 0  # a header block continued in CONTINUATION frames
        self._header_flags = 0
        self._header_block = bytearray()
        # What the worker allows us (its SETTINGS and WINDOW_UPDATEs).
        self.peer_max_frame = frames.DEFAULT_MAX_FRAME
        self.peer_initial_window = frames.DEFAULT_WINDOW
        self.peer_max_streams = 2**31 - 1
        self.send_window = frames.DEFAULT_WINDOW
        self._blocked: dict[int, H2Call] = {}  # calls whose request body waits for window
        self._received = 0  # DATA bytes not yet given back as connection window
        self._deferred: list[H2Call] = []  # calls with messages of this read not yet parsed
        self._outbox: list[bytes] = []  # frames written in this turn of the event loop, sent at its end
        self._turn_open = False  # this turn wrote already: an end-of-turn send is scheduled
        self._keepalive_s = keepalive_s
        self._keepalive_timeout_s = keepalive_timeout_s
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_payload: bytes | None = None
        self.settings_received = self._loop.create_future()

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        transport.write(
            frames.PREFACE
            + frames.settings({
                frames.ENABLE_PUSH: 0,
                frames.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                frames.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            })
            + frames.window_update(0, CONNECTION_WINDOW - frames.DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(f"connection to the worker lost: {exc}" if exc else "connection to the worker closed")

    def data_received(self, data: bytes) -> None:
        try:
            self._frames(data)
        except ProtocolViolation as exc:
            self._flush_quietly()  # what came before the violation still reaches its readers
            log.warning("worker %s broke HTTP/2 (%s): closing the connection", self.authority, exc)
            self._abandon(exc.code, f"worker broke HTTP/2: {exc}")
        except Exception as exc:  # a bug here must not kill the event loop's reader
            log.exception("HTTP/2 connection to %s failed", self.authority)
            self._flush_quietly()
            self._abandon(frames.INTERNAL_ERROR, f"HTTP/2 client error: {exc}")

    # ------------------------------------------------------------------ calls
    def can_open(self) -> bool:
        return (
            not self.closing
            and not self.lost
            and len(self.calls) < self.peer_max_streams
            and self.next_stream_id < frames.MAX_STREAM_ID
        )

    def open(self, call: H2Call, header_block: bytes, message: bytes) -> None:
        """Start ``call``: HEADERS, then the request body as far as the windows allow."""
        transport = self.transport
        assert transport is not None
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        self.calls[stream_id] = call
        call.attach(self, stream_id, self.peer_initial_window, CREDIT_STEP)
        call.send_payload = message
        call.send_offset = 0
        out = self._header_frames(stream_id, header_block)
        self._body(call, out)
        if self._turn_open:  # frames of this turn are queued: these join them
            self._outbox += out
        else:
            # The turn's first write leaves at once (a call alone, at concurrency 1, waits
            # for nothing else the turn runs); later ones of the turn leave together at its end.
            self._turn_open = True
            self._loop.call_soon(self._send_outbox)
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        if self._keepalive is None and self._keepalive_s > 0:
            self._keepalive = self._loop.call_later(self._keepalive_s, self._send_keepalive)

    def _header_frames(self, stream_id: int, block: bytes) -> list[bytes]:
        """HEADERS, and CONTINUATION frames for a block larger than the worker's frame size."""
        size = self.peer_max_frame
        if len(block) <= size:
            return [frames.frame(frames.HEADERS, frames.END_HEADERS, stream_id, block)]
        parts = [block[at:at + size] for at in range(0, len(block), size)]
        out = [frames.frame(frames.HEADERS, 0, stream_id, parts[0])]
        out += [frames.frame(frames.CONTINUATION, 0, stream_id, part) for part in parts[1:-1]]
        out.append(frames.frame(frames.CONTINUATION, frames.END_HEADERS, stream_id, parts[-1]))
        return out

    def _body(self, call: H2Call, out: list[bytes]) -> None:
        """Append the DATA frames of ``call``'s request body the windows allow; the last
        one ends the stream. Whatever is left waits in ``_blocked``."""
        payload, offset = call.send_payload, call.send_offset
        total = len(payload)
        stream_id = call.stream_id
        while True:
            size = min(total - offset, self.peer_max_frame, self.send_window, call.send_window)
            if size <= 0 and offset < total:
                self._blocked[stream_id] = call
                break
            last = offset + size >= total
            out.append(frames.frame(_DATA, _END_STREAM if last else 0, stream_id, payload[offset:offset + size]))
            offset += size
            self.send_window -= size
            call.send_window -= size
            if last:
                self._blocked.pop(stream_id, None)
                break
        call.send_offset = offset

    def detach(self, call: H2Call, reset: int | None) -> None:
        """``call`` ended: forget it, and reset the stream when the worker may still be at it."""
        stream_id = call.stream_id
        if self.calls.pop(stream_id, None) is None:
            return
        self._blocked.pop(stream_id, None)
        if reset is None and call.send_offset < len(call.send_payload):
            reset = frames.CANCEL  # the worker answered before the whole request went out
        if reset is not None:
            self._write(frames.rst_stream(stream_id, reset))
        if self.closing and not self.calls:
            self.close()

    def defer(self, call: H2Call) -> None:
        """``call`` has messages of this read to parse (``flush`` parses them)."""
        self._deferred.append(call)

    def flush(self) -> None:
        """Parse the deferred calls' messages, those with one parser together, and hand each
        call its own. Runs at the end of every read and before any frame that may end a call."""
        deferred = self._deferred
        if not deferred:
            return
        self._deferred = []
        if len(deferred) == 1:
            if len(deferred[0].pending) == 1:  # one message (a GPU's pace): nothing to share
                deferred[0].deliver_one_by_one()
                return
            groups = [deferred]
        else:
            by_parser: dict[int, list[H2Call]] = {}
            for call in deferred:
                by_parser.setdefault(id(call.parser), []).append(call)
            groups = list(by_parser.values())
        for group in groups:
            many = getattr(group[0].parser, "many", None)
            if many is None:
                for call in group:
                    call.deliver_one_by_one()
                continue
            payloads = group[0].pending if len(group) == 1 else [p for call in group for p in call.pending]
            try:
                messages = many(payloads)
            except Exception:  # a malformed message: find it, call by call
                for call in group:
                    call.deliver_one_by_one()
                continue
            at = 0
            for call in group:
                count = len(call.pending)
                call.deliver(messages[at:at + count] if len(group) > 1 else messages)
                at += count

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception:  # the connection is being given up anyway
            log.exception("HTTP/2 connection to %s: messages lost while closing", self.authority)

    def credit(self, stream_id: int, amount: int, force: bool) -> bool:
        """Give ``amount`` received bytes back as window of ``stream_id`` once there are
        enough to be worth a frame (or now, with ``force``); True when sent."""
        if not force and amount < CREDIT_STEP:
            return False
        if stream_id in self.calls:
            self._write(frames.window_update(stream_id, amount))
        return True

    def close(self) -> None:
        """Say goodbye and close; calls still open end as UNAVAILABLE."""
        if self.lost:
            return
        self.closing = True
        transport = self.transport
        if transport is not None:
            self._send_outbox()
            transport.write(frames.goaway(0, frames.NO_ERROR))
            transport.close()
        self._lose("connection to the worker closed by the gateway")

    # ------------------------------------------------------------------ frames
    def _frames(self, data: bytes) -> None:
        buf = self._buffer + data if self._buffer else data
        pos, end = 0, len(buf)
        calls = self.calls
        received = 0
        head = _HEAD
        while end - pos >= 9:
            length_kind, flags, stream_id = head(buf, pos)  # one read of the head, not one per field
            length = length_kind >> 8
            stop = pos + 9 + length
            if stop > end:
                break
            kind = length_kind & 0xFF
            stream_id &= 0x7FFFFFFF
            if self._header_stream and kind != frames.CONTINUATION:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "a header block was interrupted")
            if kind == _DATA:
                received += length
                call = calls.get(stream_id)
                if call is not None:
                    if flags & frames.PADDED:
                        pad = buf[pos + 9] if length else 0
                        if pad >= length:
                            raise ProtocolViolation(frames.PROTOCOL_ERROR, "DATA padding exceeds the frame")
                        call.on_data(buf[pos + 10:stop - pad], stop == end and not self._deferred)
                    else:
                        call.on_data(buf[pos + 9:stop], stop == end and not self._deferred)
                    if flags & _END_STREAM and stream_id in calls:
                        self.flush()
                        call.on_end_without_trailers()
                elif stream_id == 0:
                    raise ProtocolViolation(frames.PROTOCOL_ERROR, "DATA on stream 0")
            elif self._deferred:
                self.flush()  # any other frame may end a call: its messages come first
                continue  # the same frame again, now with nothing deferred
            elif kind == frames.HEADERS:
                self._headers(stream_id, flags, buf[pos + 9:stop])
            elif kind == frames.CONTINUATION:
                self._continuation(stream_id, flags, buf[pos + 9:stop])
            elif kind == frames.WINDOW_UPDATE:
                self._window_update(stream_id, buf[pos + 9:stop])
            elif kind == frames.SETTINGS:
                self._settings(flags, buf[pos + 9:stop])
            elif kind == frames.PING:
                self._ping(flags, buf[pos + 9:stop])
            elif kind == frames.RST_STREAM:
                if length != 4:
                    raise ProtocolViolation(frames.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
                call = calls.get(stream_id)
                if call is not None:
                    call.on_reset(frames.u32(buf, pos + 9))
            elif kind == frames.GOAWAY:
                self._goaway(buf[pos + 9:stop])
            elif kind == frames.PUSH_PROMISE:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "server push was disabled")
            # PRIORITY and unknown frame types are ignored (RFC 9113 5.5).
            pos = stop
        self._buffer = buf[pos:] if pos < end else b""
        if self._deferred:
            self.flush()
        if received:
            self._received += received
            if self._received >= CONNECTION_WINDOW // 2:
                self._write(frames.window_update(0, self._received))
                self._received = 0

    def _headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, stop = 0, len(payload)
        if flags & frames.PADDED:
            if not payload:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "HEADERS padding without a length")
            start, stop = 1, stop - payload[0]
        if flags & frames.PRIORITY_FLAG:
            start += 5
        if start > stop:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "HEADERS padding exceeds the frame")
        block = payload[start:stop]
        if flags & frames.END_HEADERS:
            self._header_block_done(stream_id, flags, block)
        else:
            self._header_stream = stream_id
            self._header_flags = flags
            self._header_block = bytearray(block)

    def _continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        if not self._header_stream or stream_id != self._header_stream:
            raise ProtocolViolation(frames.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._header_block += payload
        if len(self._header_block) > MAX_HEADER_LIST:
            raise ProtocolViolation(frames.ENHANCE_YOUR_CALM, "header block too large")
        if flags & frames.END_HEADERS:
            block, self._header_stream = bytes(self._header_block), 0
            self._header_block = bytearray()
            self._header_block_done(stream_id, self._header_flags, block)

    def _header_block_done(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode_block(block)
        call = self.calls.get(stream_id)
        if call is not None:
            call.on_headers(headers, bool(flags & _END_STREAM))  # type: ignore[arg-type]

    def _table_now(self) -> tuple[int, object, int]:
        """What identifies the decoder's dynamic table: an insertion puts a new entry object
        first (evicting or not), an eviction shortens it, a size update changes its size.
        The first entry is held here, so its identity cannot pass to another object."""
        table = self._decoder.header_table
        entries = table.dynamic_entries
        return len(entries), entries[0] if entries else None, table.maxsize

    def _decode_block(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The header list of ``block`` (never changed by its readers). A block that left the
        dynamic table as it was decodes the same way while the table stays so: its list is
        kept and handed out again; any block that changes the table drops what was kept.
        Every other block is decoded, so the table stays in step with the worker's."""
        found = self._decoded.get(block)
        if found is not None:
            return found
        try:
            headers = cast(list[tuple[bytes, bytes]], self._decoder.decode(block, raw=True))
        except HPACKError as exc:
            raise ProtocolViolation(frames.COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        state, was = self._table_now(), self._table_state
        if state[0] != was[0] or state[1] is not was[1] or state[2] != was[2]:  # the entry itself, not an equal one
            self._table_state = state
            self._decoded.clear()
        elif len(self._decoded) < _DECODED_BLOCKS:
            self._decoded[block] = headers
        return headers

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolViolation(frames.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = frames.u32(payload) & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > frames.MAX_WINDOW:
                raise ProtocolViolation(frames.FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            call = self.calls.get(stream_id)
            if call is None:
                return
            call.send_window += increment
            if call.send_window > frames.MAX_WINDOW:
                call.on_lost(CallCode.INTERNAL, "the worker's stream window overflowed")
                return
        self._flush_blocked()

    def _flush_blocked(self) -> None:
        if not self._blocked or self.transport is None:
            return
        out: list[bytes] = []
        for call in list(self._blocked.values()):
            if self.send_window <= 0:
                break
            if call.send_window > 0:
                self._body(call, out)
        if out:
            self._write(b"".join(out))

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & frames.ACK:
            return
        try:
            values = frames.parse_settings(payload)
        except ValueError as exc:
            raise ProtocolViolation(frames.FRAME_SIZE_ERROR, str(exc)) from exc
        if frames.MAX_FRAME_SIZE in values:
            size = values[frames.MAX_FRAME_SIZE]
            if not frames.DEFAULT_MAX_FRAME <= size <= 2**24 - 1:
                raise ProtocolViolation(frames.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {size} out of range")
            self.peer_max_frame = size
        if frames.INITIAL_WINDOW_SIZE in values:
            window = values[frames.INITIAL_WINDOW_SIZE]
            if window > frames.MAX_WINDOW:
                raise ProtocolViolation(frames.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE above 2^31-1")
            delta = window - self.peer_initial_window
            self.peer_initial_window = window
            for call in self.calls.values():
                call.send_window += delta
        if frames.MAX_CONCURRENT_STREAMS in values:
            self.peer_max_streams = values[frames.MAX_CONCURRENT_STREAMS]
        self._write(frames.SETTINGS_ACK)
        if not self.settings_received.done():
            self.settings_received.set_result(None)
        self._flush_blocked()

    def _ping(self, flags: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise ProtocolViolation(frames.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & frames.ACK:
            if payload == self._ping_payload:
                self._ping_payload = None
            return
        self._write(frames.ping(payload, ack=True))

    def _goaway(self, payload: bytes) -> None:
        if len(payload) < 8:
            raise ProtocolViolation(frames.FRAME_SIZE_ERROR, "GOAWAY too short")
        last = frames.u32(payload) & 0x7FFFFFFF
        code = frames.u32(payload, 4)
        self.closing = True
        for stream_id, call in list(self.calls.items()):
            if stream_id > last:  # the worker never saw it: safe to send elsewhere
                call.on_lost(CallCode.UNAVAILABLE, f"worker is going away (HTTP/2 GOAWAY, error {code})")
        if not self.calls:
            self.close()

    def _write(self, data: bytes) -> None:
        """Queue ``data`` for the end of this turn of the event loop: the calls opened and
        the windows given back in one turn leave in one socket write (a write to a socket
        is a system call, the largest fixed cost of a short call)."""
        if self.transport is not None and not self.lost:
            if not self._turn_open:
                self._turn_open = True
                self._loop.call_soon(self._send_outbox)
            self._outbox.append(data)

    def _send_outbox(self) -> None:
        self._turn_open = False
        outbox = self._outbox
        if not outbox:
            return
        self._outbox = []
        if self.transport is not None and not self.lost:
            self.transport.write(outbox[0] if len(outbox) == 1 else b"".join(outbox))

    # ------------------------------------------------------------------ keepalive and endings
    def _send_keepalive(self) -> None:
        """While calls are open, PING every ``keepalive_s``; no answer in time: the worker is gone."""
        self._keepalive = None
        if self.lost or not self.calls or self.transport is None:
            return
        if self._ping_payload is not None:
            log.warning("worker %s did not answer a keepalive PING: closing the connection", self.authority)
            self._abandon(frames.NO_ERROR, "worker did not answer a keepalive ping")
            return
        self._ping_payload = os.urandom(8)
        self._write(frames.ping(self._ping_payload))
        self._keepalive = self._loop.call_later(self._keepalive_timeout_s, self._check_keepalive)

    def _check_keepalive(self) -> None:
        self._keepalive = None
        if self._ping_payload is not None:
            self._send_keepalive()  # still unanswered: gives up
        elif self.calls:
            self._keepalive = self._loop.call_later(self._keepalive_s, self._send_keepalive)

    def _abandon(self, code: int, details: str) -> None:
        """Close after a protocol error (or a dead peer); the calls end as UNAVAILABLE."""
        transport = self.transport
        if transport is not None and not self.lost:
            last = max(self.calls, default=0)
            self._send_outbox()
            transport.write(frames.goaway(last, code))
            transport.close()
        self._lose(details)

    def _lose(self, details: str) -> None:
        if self.lost:
            return
        self.lost = True
        self.closing = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        calls, self.calls = self.calls, {}
        self._blocked.clear()
        for call in calls.values():
            call.on_lost(CallCode.UNAVAILABLE, details)
        if not self.settings_received.done():
            self.settings_received.set_result(None)

    def __repr__(self) -> str:
        state = "lost" if self.lost else "closing" if self.closing else "open"
        return f"<H2Connection {self.authority} {state} calls={len(self.calls)}>"

