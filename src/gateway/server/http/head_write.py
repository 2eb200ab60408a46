"""A response's head goes out in the same write as its first body bytes.

uvicorn writes the status line and headers the moment the app sends
``http.response.start`` and the body with the next message: two socket writes, two
segments and two wake-ups of the client for every response, though the body almost
always follows within the same event-loop turn. ``HeadWithBody`` wraps the transport a
request/response cycle writes to: it holds the head until the first body write (then
sends both at once) or the end of the current loop turn, whichever comes first, so a
head is never delayed past the turn it was sent in.
"""

from __future__ import annotations

import asyncio
from typing import Any

_CONTINUE = b"HTTP/1.1 100 "  # "100 Continue" is an interim answer, not the head


class HeadWithBody:
    """The cycle's transport; everything but ``write`` and ``close`` is the real one's."""

    __slots__ = ("_fresh", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._fresh = True  # the next write is the response head

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif self._fresh and not data.startswith(_CONTINUE):
            self._fresh = False
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
