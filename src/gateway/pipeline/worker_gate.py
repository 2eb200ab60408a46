"""Per worker, the requests past its running slots wait in the gateway, in fair order.

Why: with the gateway's fleet queue on (``--fleet-headroom``), the fleet as a whole has a
slot for every request admitted, but the routing policy sends each one where its prefix is
cached, and that worker's slots may all be taken. Sent on, the request would wait in the
worker's own first-come queue, where a light API key's request sits behind a heavy key's.
Sent elsewhere instead (a hard slot bound), it pays a cold prefill, which on a worker whose
prefill is dear stalls every running request's decode step: the fleet then loses
throughput and hit rate to fairness. Here it is held in the gateway until a slot of the
chosen worker frees, and the held requests of one worker are let through by
``policies.fair_queue`` (weighted shares between keys, priority within a key), so a light
key's request takes the worker's next free slot. The policy still sees a held request as
the worker's load (its lease is taken before the wait), so a long wait makes it spill.

``CALLER`` carries the request's API key and priority from admission (set in the
request's own task) to here without threading them through every layer between.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.policies.fair_queue import FairQueue

CALLER: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("token_gateway_caller", default=("-", 0))
"""(API key id or "-", priority) of the request running in this task (set at admission)."""


def _noop() -> None:
    return None


@dataclass(slots=True)
class _Slots:
    """One worker's requests let through (sent, not yet ended) and the ones held."""

    queue: FairQueue
    through: int = 0
    cap: int = 0  # running slots + headroom: at most this many let through
    open: int = 0  # running slots - reserve: past this many, only keys below their share


class WorkerGate:
    """Holds requests for a worker whose ``max_running_requests + headroom`` sent requests
    have not ended; ``enter`` waits for a slot and returns its release (idempotent)."""

    def __init__(
        self,
        weights: dict[str, float] | None = None,
        *,
        headroom: int = 0,
        reserve: int = 0,
        below_share: Callable[[str], bool] = lambda tenant: False,
        aging_s: float = 0.0,
        low_values_first: bool = False,
        across_tenants: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``reserve``: of each worker's *running* slots, this many go only to a key that
        ``below_share`` says holds less than its weighted share (admission's count), and
        the headroom past them too: the light key's request then finds a running slot at
        once instead of waiting in the worker's queue for one to end, which with equal
        answer lengths can take a whole wave of the worker's batch."""
        self.headroom = max(0, headroom)
        self.reserve = max(0, reserve)
        self._below_share = below_share
        self._queue_args = (dict(weights or {}), aging_s, low_values_first, across_tenants)
        self._clock = clock
        self._workers: dict[str, _Slots] = {}

    def _slots(self, worker_id: str) -> _Slots:
        slots = self._workers.get(worker_id)
        if slots is None:
            weights, aging_s, low_first, across = self._queue_args
            queue = FairQueue(weights, aging_s=aging_s, low_values_first=low_first, across_tenants=across)
            slots = self._workers[worker_id] = _Slots(queue)
        return slots

    def through(self, worker_id: str) -> int:
        """Requests let through to ``worker_id`` and not ended."""
        slots = self._workers.get(worker_id)
        return slots.through if slots else 0

    def held(self, worker_id: str | None = None) -> int:
        """Requests waiting for a slot (of ``worker_id``, or of any worker)."""
        if worker_id is not None:
            slots = self._workers.get(worker_id)
            return len(slots.queue) if slots else 0
        return sum(len(s.queue) for s in self._workers.values())

    async def enter(self, worker_id: str, running_slots: int) -> Callable[[], None]:
        """Wait until ``worker_id`` has fewer than ``running_slots + headroom`` requests let
        through (``running_slots`` 0, unknown: no wait); returns what gives the slot back.
        A waiter that is cancelled leaves the queue (or passes a slot granted meanwhile on)."""
        if running_slots <= 0:
            return _noop
        slots = self._slots(worker_id)
        slots.cap = running_slots + self.headroom
        slots.open = running_slots - self.reserve if self.reserve else slots.cap
        if slots.through < slots.open and not slots.queue:
            slots.through += 1
            return self._release_once(worker_id, slots)
        tenant, priority = CALLER.get()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = slots.queue.push(tenant, priority, 1, self._clock(), waiter)
        self._grant(slots)  # a key below its share may take a reserved slot at once
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release(slots)  # granted as the caller left: the slot goes to the next one
            else:
                slots.queue.remove(entry)
                self._grant(slots)
            raise
        return self._release_once(worker_id, slots)

    def _release_once(self, worker_id: str, slots: _Slots) -> Callable[[], None]:
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self._release(slots)

        return release

    def _release(self, slots: _Slots) -> None:
        slots.through -= 1
        self._grant(slots)

    def _grant(self, slots: _Slots) -> None:
        """Let waiters through in fair order while there is room; once only the reserved
        running slots are left (``open``), only keys below their share (the others are
        passed over, not dropped)."""
        queue = slots.queue
        now = self._clock()
        held_back: set[str] = set()
        while queue and slots.through < slots.cap:
            entry = queue.peek(now, held_back)
            if entry is None:
                return
            if slots.through >= slots.open and not self._below_share(entry.tenant):
                held_back.add(entry.tenant)
                continue
            queue.pop(entry)
            waiter = entry.handle
            if waiter.done():  # cancelled: its own handler removes it; nothing to hand over
                continue
            slots.through += 1
            waiter.set_result(None)
