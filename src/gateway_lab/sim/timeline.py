"""When each request reached a simulated worker, got a running slot and finished its prefill.

A TTFT seen by a client is the gateway's time, the wait on the worker and the prefill
itself; only the worker knows the middle parts. A bench that wants them per request
attaches a ``Timeline`` to a worker's scheduler (``Scheduler.timeline``; none by default,
so the step loop pays nothing), then joins its entries with the client's results and the
gateway's decisions by request id (``gateway_lab.bench.route_trace``).

Each entry also keeps what was ahead of the request when it arrived (requests, uncached
prompt tokens still to prefill, and the time left in the step then running): the
worker's queue as it really was, to set beside what the gateway believed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_LIMIT = 1 << 16  # entries kept (the oldest go first): a long run cannot grow it without end


@dataclass(slots=True)
class SeqTimes:
    """One request on one worker; times from ``Timeline.clock``, -1 until they happen."""

    received: float
    prompt: int
    ahead_requests: int  # waiting or running on arrival
    ahead_uncached: int  # uncached prompt tokens queued or mid-prefill on arrival
    step_left_s: float  # of the step running on arrival (0: idle)
    admitted: float = -1.0
    cached: int = 0
    prefilled: float = -1.0  # its prefill's last step ended: its first token left

    def as_dict(self) -> dict[str, float | int]:
        return {
            "received": self.received, "prompt": self.prompt, "ahead_requests": self.ahead_requests,
            "ahead_uncached": self.ahead_uncached, "step_left_s": self.step_left_s,
            "admitted": self.admitted, "cached": self.cached, "prefilled": self.prefilled,
        }  # fmt: skip


class Timeline:
    """Request id -> ``SeqTimes`` for the first sample of each request (bounded)."""

    def __init__(self, limit: int = DEFAULT_LIMIT, clock: Callable[[], float] = time.perf_counter) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self.clock = clock
        self._entries: OrderedDict[str, SeqTimes] = OrderedDict()

    def received(self, rid: str, prompt: int, ahead_requests: int, ahead_uncached: int, step_left_s: float) -> None:
        entries = self._entries
        entries[rid] = SeqTimes(self.clock(), prompt, ahead_requests, ahead_uncached, max(0.0, step_left_s))
        entries.move_to_end(rid)
        while len(entries) > self.limit:
            entries.popitem(last=False)

    def admitted(self, rid: str, cached: int) -> None:
        entry = self._entries.get(rid)
        if entry is not None and entry.admitted < 0:
            entry.admitted = self.clock()
            entry.cached = cached

    def prefilled(self, rid: str) -> None:
        entry = self._entries.get(rid)
        if entry is not None and entry.prefilled < 0:
            entry.prefilled = self.clock()

    def get(self, rid: str) -> SeqTimes | None:
        return self._entries.get(rid)

    def __len__(self) -> int:
        return len(self._entries)
