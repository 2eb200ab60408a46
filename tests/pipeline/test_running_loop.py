"""``running_loop`` and ``current_task``: the answers of asyncio's own, from a per-thread memo."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from gateway.pipeline import running_loop as module
from gateway.pipeline.running_loop import cancelling, current_task, running_loop


def test_without_a_running_loop_it_raises_as_asyncio_does() -> None:
    with pytest.raises(RuntimeError):
        running_loop()
    with pytest.raises(RuntimeError):
        current_task()


async def test_it_answers_the_running_loop_and_task() -> None:
    assert running_loop() is asyncio.get_running_loop()
    assert running_loop() is asyncio.get_running_loop()  # from the memo
    assert current_task() is asyncio.current_task()

    async def inner() -> asyncio.Task[object] | None:
        return current_task()

    task = asyncio.get_running_loop().create_task(inner())
    assert await task is task


def test_a_new_loop_in_the_same_thread_replaces_a_stopped_one() -> None:
    async def ask() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]:
        return running_loop(), asyncio.get_running_loop()

    first, first_truth = asyncio.run(ask())
    assert first is first_truth
    with pytest.raises(RuntimeError):  # that loop stopped: no answer from the memo
        running_loop()
    second, second_truth = asyncio.run(ask())
    assert second is second_truth and second is not first


async def test_another_thread_gets_its_own_answer() -> None:
    running_loop()  # this thread's memo holds this loop
    seen: list[object] = []

    def elsewhere() -> None:
        try:
            seen.append(running_loop())
        except RuntimeError as exc:
            seen.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(seen) == 1 and isinstance(seen[0], RuntimeError)


def test_a_forked_child_forgets_the_memo() -> None:
    async def ask() -> asyncio.AbstractEventLoop:
        return running_loop()

    loop = asyncio.run(ask())
    assert module._memo.loop is loop
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its memo is empty, whatever the parent's held
        os.write(write, b"1" if module._memo.loop is None else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"


async def test_cancelling_tells_a_cancel_of_this_task_from_a_cancelled_call() -> None:
    seen: list[bool] = []

    async def reads(inner: asyncio.Future[None]) -> None:
        try:
            await inner
        except asyncio.CancelledError:
            seen.append(cancelling())
            raise

    ours = asyncio.ensure_future(reads(asyncio.get_running_loop().create_future()))
    await asyncio.sleep(0)
    ours.cancel()  # the task itself is cancelled: a client gone
    await asyncio.gather(ours, return_exceptions=True)
    call: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    theirs = asyncio.ensure_future(reads(call))
    await asyncio.sleep(0)
    call.cancel()  # only what it awaited was: a worker's call cut
    await asyncio.gather(theirs, return_exceptions=True)
    assert seen == [True, False]
    assert cancelling() is False
