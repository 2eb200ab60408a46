"""An asyncio event loop on a virtual clock: time moves only when nothing is ready to run.

Why: the simulator's step loop, the gateway's admission queue and worker gate all wait on
the event loop's clock (``loop.time()``, ``asyncio.sleep``, ``asyncio.timeout``). Run on
this loop, with no sockets between them, a replay of minutes of traffic takes the CPU time
of its callbacks only, and its figures do not depend on how loaded the host is: the
same seeds give the same answer on every run.

The loop asks its selector for ready I/O without waiting; when there is none, instead of
sleeping until the next timer, it sets the clock to that timer's moment. A run with
nothing scheduled and nothing ready would wait forever: that is raised as an error.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every task waits and no timer is scheduled: on a virtual clock nothing would ever wake them."""


class _AdvancingSelector(selectors.BaseSelector):
    """A real selector polled without waiting; a wait it was asked for moves the clock instead."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Deadlock("virtual clock: every task waits and no timer is scheduled")
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` starts at 0 and jumps to the next timer when idle."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_AdvancingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (never back)."""
        if seconds > 0:
            self._now += seconds


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualClockLoop` (like ``asyncio.run``)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main)
