"""Listed workers that were not up when the gateway started, retried in the background.

Compose and Kubernetes start things in any order: a gateway that starts before its
workers must not exit. Every listed worker that fails its first registration is
retried here with a growing pause (up to ``MAX_PAUSE_S``) until it registers or the
gateway stops; ``/readiness`` lists the ones still pending and why. With
``--worker-startup-timeout-secs`` the gateway waits that long for them before it
says it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0


@dataclass
class _Pending:
    url: str
    options: dict[str, Any]
    error: str
    attempts: int = 1
    since: float = field(default_factory=time.time)


class LateWorkers:
    def __init__(self, add: Callable[..., Awaitable[Any]]) -> None:
        self._add = add
        self._pending: dict[str, _Pending] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._done = asyncio.Event()
        self._done.set()

    def retry(self, url: str, error: BaseException, **options: Any) -> None:
        """Keep trying to register ``url`` (with ``add(url, **options)``) in the background."""
        self._pending[url] = _Pending(url, options, f"{type(error).__name__}: {error}")
        self._done.clear()
        self._tasks[url] = asyncio.get_running_loop().create_task(self._loop(url), name=f"late-worker-{url}")

    async def _loop(self, url: str) -> None:
        pause = FIRST_PAUSE_S
        entry = self._pending[url]
        while True:
            await asyncio.sleep(pause)
            try:
                await self._add(url, **entry.options)
            except Exception as exc:  # any failure: try again later
                entry.attempts += 1
                entry.error = f"{type(exc).__name__}: {exc}"
                pause = min(MAX_PAUSE_S, pause * 2)
                continue
            log.info("worker %s registered after %d attempts", url, entry.attempts + 1)
            break
        del self._pending[url]
        self._tasks.pop(url, None)
        if not self._pending:
            self._done.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every pending worker to register; True if they did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), timeout_s)
        return self._done.is_set()

    def describe(self) -> list[dict[str, Any]]:
        return [{"url": p.url, "attempts": p.attempts, "error": p.error, "since": p.since} for p in self._pending.values()]

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
