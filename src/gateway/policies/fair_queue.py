"""The admission queue's order: priority within a tenant, weighted fair shares between tenants.

Why not one FIFO: when the fleet is saturated, whoever sends most fills the queue, and a
light tenant's request waits behind a heavy tenant's whole backlog. Here every tenant
(API key) has its own queue, and the next free slot goes to the tenant that has had the
least service for its weight: start-time fair queuing, where each tenant carries a
virtual time that advances by ``slots / weight`` each time it is served and the tenant
with the smallest one goes next. A tenant that was idle starts at the current virtual
time, so idleness banks no credit, and a tenant that sends less than its share is never
made to wait behind one that sends more.

Inside a tenant's queue, a higher priority goes first (``low_values_first`` flips the
sense, as vLLM's scheduler reads it; SGLang's default reads higher as sooner). Waiting
ages a request: every ``aging_s`` seconds in the queue counts as one more level of
priority, so a low-priority request is never starved by a stream of higher ones. With
aging, a request's rank is ``priority + waited / aging_s``; since every request ages at
the same rate, ordering by ``priority - enqueued / aging_s`` is the same order at any
moment, and a plain heap keeps it.

``across_tenants`` makes priority strict between tenants too (the highest aged level
goes first, fair shares only among tenants at that level): for one operator's own
tiers, not for untrusted keys, who could then all claim the top.

Pure and synchronous: the callers (``server.admission`` for the fleet, ``pipeline.worker_gate`` for
one worker's slots) own the futures and the clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Entry:
    """One waiting request: ``slots`` it needs, its tenant and priority, and the caller's handle."""

    tenant: str
    priority: int
    slots: int
    enqueued: float
    seq: int
    handle: Any = None
    removed: bool = False
    rank: float = 0.0  # the heap key: lower goes first


@dataclass(slots=True)
class _Tenant:
    weight: float
    vtime: float = 0.0  # the virtual time of this tenant's next service
    heap: list[tuple[float, int, Entry]] = field(default_factory=list)
    waiting: int = 0  # live (not removed) entries


class FairQueue:
    """Waiting requests by tenant; ``peek`` / ``pop`` give the one to admit next."""

    def __init__(
        self,
        weights: dict[str, float] | None = None,
        *,
        aging_s: float = 0.0,
        low_values_first: bool = False,
        across_tenants: bool = False,
        default_weight: float = 1.0,
    ) -> None:
        self.weights = dict(weights or {})
        self.aging_s = aging_s
        self.sign = 1 if low_values_first else -1
        self.across_tenants = across_tenants
        self.default_weight = default_weight
        self._tenants: dict[str, _Tenant] = {}
        self._vtime = 0.0  # the start tag of the last tenant served
        self._seq = itertools.count()
        self.waiting = 0

    def __len__(self) -> int:
        return self.waiting

    def _priority(self, entry: Entry) -> int:
        """The priority in "higher goes first" terms."""
        return -self.sign * entry.priority

    def push(self, tenant: str, priority: int, slots: int, now: float, handle: Any = None) -> Entry:
        entry = Entry(tenant, priority, max(1, slots), now, next(self._seq), handle)
        t = self._tenants.get(tenant)
        if t is None:
            t = self._tenants[tenant] = _Tenant(self.weights.get(tenant, self.default_weight), self._vtime)
        elif t.waiting == 0:
            t.vtime = max(t.vtime, self._vtime)  # an idle spell earns no credit
        # Rank by aged priority: priority + waited/aging_s is largest for the smallest rank below.
        aged = now / self.aging_s if self.aging_s > 0 else 0.0
        entry.rank = aged - self._priority(entry)
        heapq.heappush(t.heap, (entry.rank, entry.seq, entry))
        t.waiting += 1
        self.waiting += 1
        return entry

    def remove(self, entry: Entry) -> None:
        """Take a waiting entry out (its client left, it timed out); a no-op once popped or removed."""
        if entry.removed:
            return
        entry.removed = True
        t = self._tenants.get(entry.tenant)
        if t is not None:
            t.waiting -= 1
            self.waiting -= 1
            if t.waiting == 0:
                t.heap.clear()

    def _head(self, t: _Tenant) -> Entry | None:
        heap = t.heap
        while heap and heap[0][2].removed:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def peek(self, now: float, skip: frozenset[str] | set[str] = frozenset()) -> Entry | None:
        """The entry to admit next (not taken out), of a tenant not in ``skip``."""
        best: tuple[float, float, int] | None = None
        chosen: Entry | None = None
        for name, t in self._tenants.items():
            if t.waiting == 0 or name in skip:
                continue
            head = self._head(t)
            if head is None:
                continue
            key = (-self._level(head, now) if self.across_tenants else 0.0, t.vtime, head.seq)
            if best is None or key < best:
                best, chosen = key, head
        return chosen

    def _level(self, entry: Entry, now: float) -> float:
        waited = math.floor(max(0.0, now - entry.enqueued) / self.aging_s) if self.aging_s > 0 else 0
        return self._priority(entry) + waited

    def pop(self, entry: Entry) -> None:
        """Admit ``entry`` (the one ``peek`` gave): charge its tenant for its slots."""
        t = self._tenants[entry.tenant]
        heapq.heappop(t.heap)  # peek left it at the top
        entry.removed = True
        t.waiting -= 1
        self.waiting -= 1
        self._vtime = t.vtime
        t.vtime += entry.slots / t.weight
        self._prune()

    def _prune(self) -> None:
        """Forget idle tenants with no debt (a tenant ahead of the clock keeps its place)."""
        if len(self._tenants) <= 64:
            return
        for name in [n for n, t in self._tenants.items() if t.waiting == 0 and t.vtime <= self._vtime]:
            del self._tenants[name]

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self.default_weight)

    def backlogged(self) -> Iterator[str]:
        """Tenants with requests waiting."""
        return (name for name, t in self._tenants.items() if t.waiting)

    def entries(self) -> Iterator[Entry]:
        """Every live waiting entry, in no particular order."""
        for t in self._tenants.values():
            for _, _, entry in t.heap:
                if not entry.removed:
                    yield entry

    def drain(self) -> list[Entry]:
        """Take every waiting entry out (shutdown)."""
        out = list(self.entries())
        for entry in out:
            self.remove(entry)
        return out


def parse_weights(items: list[str]) -> dict[str, float]:
    """``NAME=WEIGHT`` pairs (``--key-weights``) into a dict; raises ValueError naming a bad one."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name or not weight > 0 or math.isinf(weight):
            raise ValueError(f"--key-weights wants KEY=WEIGHT with a positive weight, got {item!r}")
        out[name] = weight
    return out
