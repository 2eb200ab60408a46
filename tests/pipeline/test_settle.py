"""``settle``: tasks the gateway gave up on end without raising, and leave no cycle."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Awaitable, Callable

from gateway.pipeline.settle import settle


async def _fails() -> None:
    raise ValueError("worker gone")


async def _answers() -> int:
    return 7


async def test_every_task_ends_and_none_of_their_errors_is_raised() -> None:
    failing, answering, sleeping = (asyncio.ensure_future(c) for c in (_fails(), _answers(), asyncio.sleep(30)))
    await asyncio.sleep(0)
    sleeping.cancel()
    await settle([failing, answering, sleeping])
    assert all(t.done() for t in (failing, answering, sleeping))
    assert isinstance(failing.exception(), ValueError) and answering.result() == 7 and sleeping.cancelled()


async def test_no_tasks_is_nothing_to_wait_for() -> None:
    await settle([])


async def _await_each(tasks: list[asyncio.Future[None]]) -> None:
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task


async def _freed_by_reference_counting(abandon: Callable[[list[asyncio.Future[None]]], Awaitable[None]]) -> bool:
    """Whether a failed task, once abandoned this way and let go, is freed without a collection."""
    gc.collect()
    gc.disable()
    try:
        tasks = [asyncio.ensure_future(_fails())]
        await abandon(tasks)
        ref = weakref.ref(tasks[0])
        del tasks
        return ref() is None
    finally:
        gc.enable()


async def test_a_failed_task_settled_is_freed_without_a_collection() -> None:
    assert not await _freed_by_reference_counting(_await_each)  # the cycle ``settle`` avoids
    assert await _freed_by_reference_counting(settle)
