"""HeadWithBody: a response head leaves in the same write as its first body bytes, and
never later than the end of the loop turn it was sent in."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.server.http.head_write import HeadWithBody


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


async def test_head_and_first_body_are_one_write_then_writes_pass_through() -> None:
    real = _Transport()
    t = HeadWithBody(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert real.writes == []
    t.write(b"body")
    t.write(b"more")
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]  # the turn-end flush had nothing left
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)


async def test_a_head_alone_leaves_at_the_end_of_the_loop_turn() -> None:
    real = _Transport()
    t = HeadWithBody(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    t.write(b"late body")
    assert real.writes[-1] == b"late body"


async def test_100_continue_is_not_held_and_close_flushes() -> None:
    real = _Transport()
    t = HeadWithBody(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert real.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    t.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    t.close()
    assert real.writes[-1] == b"HTTP/1.1 204 No Content\r\n\r\n" and real.closed
