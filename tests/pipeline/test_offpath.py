"""``later``: queued bookkeeping runs in order, after the current and the next loop turn, never lost."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from gateway.pipeline.offpath import later, run_pending


def test_without_a_loop_it_runs_at_once() -> None:
    seen: list[int] = []
    later(seen.append, 1)
    assert seen == [1]


async def test_it_runs_two_loop_turns_later_in_order() -> None:
    seen: list[str] = []
    later(seen.append, "a")
    asyncio.get_running_loop().call_soon(seen.append, "next turn")  # e.g. the gRPC send task's first step
    later(seen.append, "b")
    assert seen == []
    await asyncio.sleep(0)
    assert seen == ["next turn"]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert seen == ["next turn", "a", "b"]


async def test_a_failing_item_is_logged_and_the_rest_still_run(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[int] = []

    def boom() -> None:
        raise ValueError("bad")

    later(boom)
    later(seen.append, 2)
    with caplog.at_level(logging.ERROR, logger="gateway.pipeline.offpath"):
        for _ in range(3):
            await asyncio.sleep(0)
    assert seen == [2]
    assert "deferred bookkeeping" in caplog.text


async def test_run_pending_applies_now_on_the_loop_thread_only() -> None:
    seen: list[int] = []
    later(seen.append, 1)
    other = threading.Thread(target=run_pending)  # another thread never runs loop-owned items
    other.start()
    other.join()
    assert seen == []
    run_pending()
    assert seen == [1]
    for _ in range(3):
        await asyncio.sleep(0)  # the scheduled run finds nothing left
    assert seen == [1]


def test_each_loop_runs_its_own_items() -> None:
    """A loop that ended with items queued leaves nothing stuck for the next one."""
    seen: list[str] = []

    async def queue_and_leave() -> None:
        later(seen.append, "first loop")

    asyncio.run(queue_and_leave())  # closed before the two turns: its items are dropped with it

    async def queue_and_wait() -> None:
        later(seen.append, "second loop")
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(queue_and_wait())
    assert "second loop" in seen


def test_a_loop_remembered_from_before_is_not_taken_for_a_running_one() -> None:
    """The memo's loop stopped: an item queued outside any loop runs at once, not on it."""

    async def remember() -> None:
        later(lambda: None)

    asyncio.run(remember())
    seen: list[int] = []
    later(seen.append, 1)
    assert seen == [1]
