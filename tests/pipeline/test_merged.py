"""Several one-sample worker streams read as one (pipeline/merged.py): whichever part
answers first is read, a finished part frees its slot without an Abort, and the endings
(finish, abort) reach every part."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.pipeline.merged import MergedStreams


class _Part:
    """One worker stream: ``read()`` waits for messages the test pushes."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.finished_calls = 0
        self.aborts: list[str] = []
        self.reads = 0

    async def read(self) -> Any:
        self.reads += 1
        item = await self.queue.get()
        if isinstance(item, Exception):
            raise item
        return item

    def finished(self) -> None:
        self.finished_calls += 1

    async def abort(self, reason: str) -> None:
        self.aborts.append(reason)


class _Reader(MergedStreams):
    """The smallest subclass: messages as they come, a part's ``None`` ends it."""

    async def read(self) -> Any:
        while self._live:
            i, msg = await self._next()
            if msg is None or msg == "done":
                self._part_done(i)
                continue
            return (i, msg)
        return None


async def test_the_first_part_to_answer_is_read_first() -> None:
    a, b = _Part(), _Part()
    reader = _Reader([a, b])
    b.queue.put_nowait("b1")
    assert await reader.read() == (1, "b1")
    a.queue.put_nowait("a1")
    assert await reader.read() == (0, "a1")
    a.queue.put_nowait("done")
    pending = asyncio.ensure_future(reader.read())
    for _ in range(20):  # a's "done" is the only message ready
        if a.finished_calls:
            break
        await asyncio.sleep(0)
    b.queue.put_nowait("b2")
    assert await pending == (1, "b2")
    assert a.finished_calls == 1 and not a.aborts  # a finished part is freed without an Abort
    b.queue.put_nowait(None)
    assert await reader.read() is None
    assert not reader.ready()


async def test_the_last_live_part_is_read_without_a_task_per_message() -> None:
    only = _Part()
    reader = _Reader([only])
    only.queue.put_nowait("x")
    assert await reader.read() == (0, "x")
    assert reader._reads == {}  # no pending read task left behind


async def test_a_worker_error_propagates() -> None:
    a, b = _Part(), _Part()
    reader = _Reader([a, b])
    a.queue.put_nowait(RuntimeError("part failed"))
    with pytest.raises(RuntimeError, match="part failed"):
        await reader.read()


async def test_abort_cancels_pending_reads_and_aborts_every_part() -> None:
    a, b = _Part(), _Part()
    reader = _Reader([a, b])
    b.queue.put_nowait("b1")
    assert await reader.read() == (1, "b1")  # a's read is still pending
    pending = list(reader._reads.values())
    assert pending and not pending[0].done()
    await reader.aclose()
    assert reader.closed and pending[0].cancelled()
    assert a.aborts == b.aborts == ["finished by gateway"]


async def test_finished_frees_every_part_and_output_learns_nothing() -> None:
    a, b = _Part(), _Part()
    reader = _Reader([a, b])
    b.queue.put_nowait("b1")
    await reader.read()
    reader.finished()
    await asyncio.sleep(0)
    assert reader.closed and reader._reads == {}
    assert a.finished_calls == b.finished_calls == 1 and not a.aborts
    assert reader.output([1, 2, 3]) is None
