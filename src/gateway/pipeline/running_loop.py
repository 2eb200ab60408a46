"""The event loop running in this thread, without a system call per question.

On CPython 3.11 ``asyncio.get_running_loop()`` (and ``asyncio.current_task()``, which
asks it) calls ``getpid()`` every time, to notice a fork: a system call, about half a
microsecond on a virtual machine, and the request path asks a dozen times per request.
``running_loop()`` answers the same from a per-thread memo of the loop last found here,
trusted while that loop runs (a loop runs in one thread at a time, and this thread found
it running). Anything else (no memo, a loop that stopped or closed, a new loop in the
same thread) goes to ``asyncio.get_running_loop()``, which raises as before when no loop
runs here. A forked child forgets the memo, so it cannot answer with its parent's loop.
"""

from __future__ import annotations

import asyncio
import os
import threading


class _Memo(threading.local):
    loop: asyncio.AbstractEventLoop | None = None


_memo = _Memo()
memo = _memo
"""This thread's memo: where even a Python call per question counts (the off-path queue,
eight times a request), ``memo.loop`` while ``memo.loop.is_running()`` is the answer, and
``running_loop()`` otherwise."""


def running_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()`` (RuntimeError when none runs in this thread)."""
    loop = _memo.loop
    if loop is not None and loop.is_running():
        return loop
    loop = _memo.loop = asyncio.get_running_loop()
    return loop


def current_task() -> asyncio.Task[object] | None:
    """``asyncio.current_task()`` of this thread's running loop."""
    return asyncio.current_task(running_loop())


def cancelling() -> bool:
    """Whether this thread's current task is being cancelled (its caller's doing, not a
    worker's). Asked here, so that the caller's frame does not hold the task: a
    CancelledError's traceback holds that frame, and a cancelled task its error, a cycle."""
    task = asyncio.current_task(running_loop())
    return task is not None and task.cancelling() > 0


def _forget() -> None:
    _memo.loop = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
