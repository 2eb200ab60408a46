"""Wait for tasks the gateway gave up on, without their errors making reference cycles.

The serving process collects cycles rarely (``gateway.server.gc_policy``), so a cycle
on a request's path keeps the whole request alive until a full collection. Awaiting
an abandoned task makes one when it failed: ``await task`` raises the task's error in
the awaiting frame, the error's traceback then holds that frame, the frame holds the
task (in a list of them, say), and the task holds the error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from typing import Any


async def settle(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Wait until every task has ended, raising none of their errors."""
    if not tasks:
        return
    with contextlib.suppress(BaseException):  # as the callers did: an abandoned part's ending is not theirs to report
        await asyncio.wait(tasks)
