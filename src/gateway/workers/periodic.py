"""A background round repeated on an interval until stopped (health checks, load polls).

A round that fails is logged and the next one runs anyway: one bad worker answer
must not end the monitoring of the whole fleet."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod

log = logging.getLogger(__name__)


class Periodic(ABC):
    name = "periodic"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    @abstractmethod
    def interval_s(self) -> float:
        """Seconds between rounds; 0 or less: never start."""

    @abstractmethod
    async def round(self) -> None:
        """One pass over the fleet."""

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s round failed", self.name)
            await asyncio.sleep(self.interval_s())

    def start(self) -> None:
        if self._task is None and self.interval_s() > 0:
            self._task = asyncio.get_running_loop().create_task(self.run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
