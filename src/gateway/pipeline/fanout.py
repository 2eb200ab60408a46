"""Run several generations at once and merge their deltas (batched prompts)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from gateway.pipeline.generation import Generation, SampleDelta

_END = object()


async def merged(generations: Sequence[Generation]) -> AsyncIterator[tuple[int, SampleDelta]]:
    """Yield ``(generation index, delta)`` as they arrive. One failure fails the whole
    request: the other generations are cancelled, which aborts their worker requests."""
    if len(generations) == 1:
        async for delta in generations[0].deltas():
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for delta in gen.deltas():
                queue.put_nowait((i, delta))
            queue.put_nowait((i, _END))
        except Exception as exc:
            queue.put_nowait((i, exc))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generations)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is _END:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
