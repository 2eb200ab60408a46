"""Abort calls sent without making the request wait for them.

A cancelled stream already stops the worker's stream; the explicit Abort also covers
work queued under the request id. The lease fires them (``pipeline/lease.py``); the
server waits for the last ones at shutdown (``flush_aborts``).
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.workers.worker import Worker

_background: set[asyncio.Task[None]] = set()


def fire_abort(worker: Worker, request_id: str, reason: str) -> None:
    """Send Abort to ``worker`` in the background (failures are ignored: best effort)."""

    async def send() -> None:
        with contextlib.suppress(Exception):
            await worker.client.abort(request_id, reason, timeout=2.0)

    task = asyncio.get_running_loop().create_task(send())
    _background.add(task)
    task.add_done_callback(_background.discard)


async def flush_aborts(timeout_s: float = 2.0) -> None:
    """Give Abort calls still in flight a moment to reach their workers (at shutdown)."""
    pending = list(_background)
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)
