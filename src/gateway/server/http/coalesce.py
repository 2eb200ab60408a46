"""A transport wrapper that sends what one turn of the event loop wrote in one system call.

uvicorn writes a response's head and its body (and every SSE event) with one
``transport.write`` each, and uvloop sends each at once: a system call, on loopback
the largest fixed cost of a short request. ``CoalescingTransport`` queues the writes of
one turn of the event loop and sends them together at its end (``loop.call_soon``), so
a head and its body, or the events relayed in one turn, leave in one write; the HTTP
protocol (``guard``) flushes as soon as a response is complete, without waiting for the
rest of the turn. Closing
(or half-closing) sends what is queued first; aborting drops it. Everything else is the
wrapped transport's own.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport:
    """Wraps an ``asyncio.Transport``: ``write`` queues until the end of this loop turn."""

    __slots__ = ("_loop", "_out", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._out: list[bytes] = []

    # ------------------------------------------------------------------ writing
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        out = self._out
        if not out:
            self._loop.call_soon(self.flush)
        out.append(bytes(data) if not isinstance(data, bytes) else data)

    def write_now(self, data: bytes) -> None:
        """Send ``data`` at once, or behind what this turn queued already: for the one
        write a connection gets in a turn (a relayed token's event, pushed as the worker's
        message arrives), which then needs no end-of-turn callback."""
        if self._out:
            self._out.append(data)
        elif not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        """Send what is queued now (the end of the loop turn, or before closing)."""
        out = self._out
        if not out:
            return
        self._out = []
        if not self._transport.is_closing():
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(b) for b in self._out)

    # ------------------------------------------------------------------ endings
    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._out = []
        self._transport.abort()

    # ------------------------------------------------------------------ the wrapped transport's own
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def __getattr__(self, name: str) -> Any:  # set_protocol, can_write_eof, is_reading, ...
        return getattr(self._transport, name)
