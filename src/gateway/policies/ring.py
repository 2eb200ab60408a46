"""A consistent-hash ring with virtual nodes, identical in every process.

Each worker owns ``virtual_nodes`` points at ``xxh3_64("<worker_id>#<i>")``; a key
(any 64-bit int) belongs to the first point clockwise from it (wrapping past the
top). Adding a worker only takes over the arcs its new points cut off (about
``1/(N+1)`` of the keys); removing one only hands its own arcs to the next points.
Ordering ties are broken by worker id, so the ring depends on nothing but the
worker ids and the virtual node count.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
RING_SIZE = 1 << 64
DEFAULT_VIRTUAL_NODES = 160


class RingPosition(NamedTuple):
    """Where a key lands: its point, the index and point of the virtual node that owns it."""

    key: int
    vnode_index: int
    vnode_point: int
    owner: str


def vnode_point(worker_id: str, i: int) -> int:
    return _xxh3(f"{worker_id}#{i}".encode(), 0)


class HashRing:
    """Sorted virtual-node points and their owners; lookups are a bisect."""

    def __init__(self, virtual_nodes: int = DEFAULT_VIRTUAL_NODES, workers: Iterable[str] = ()) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")
        self.virtual_nodes = virtual_nodes
        self._members: frozenset[str] = frozenset()
        self._points: list[int] = []
        self._owners: list[str] = []
        self.set_workers(workers)

    @property
    def members(self) -> frozenset[str]:
        return self._members

    def __len__(self) -> int:
        return len(self._members)

    def set_workers(self, workers: Iterable[str]) -> bool:
        """Make the ring hold exactly ``workers``; returns True if membership changed."""
        members = frozenset(workers)
        if members == self._members and (self._points or not members):
            return False
        pairs = sorted(
            (vnode_point(w, i), w) for w in members for i in range(self.virtual_nodes)
        )
        self._points = [p for p, _ in pairs]
        self._owners = [w for _, w in pairs]
        self._members = members
        return True

    def add(self, worker_id: str) -> None:
        self.set_workers(self._members | {worker_id})

    def remove(self, worker_id: str) -> None:
        self.set_workers(self._members - {worker_id})

    def position(self, key: int) -> RingPosition:
        """The virtual node owning ``key`` (raises LookupError on an empty ring)."""
        if not self._points:
            raise LookupError("the ring has no workers")
        i = bisect_left(self._points, key % RING_SIZE)
        if i == len(self._points):
            i = 0
        return RingPosition(key % RING_SIZE, i, self._points[i], self._owners[i])

    def owner(self, key: int) -> str:
        return self.position(key).owner

    def walk(self, key: int) -> Iterator[str]:
        """Distinct workers clockwise from ``key``: the owner first, then its successors."""
        points = self._points
        n = len(points)
        if n == 0:
            return
        owners = self._owners
        start = bisect_left(points, key % RING_SIZE)
        seen: set[str] = set()
        total = len(self._members)
        for j in range(n):
            w = owners[(start + j) % n]
            if w not in seen:
                seen.add(w)
                yield w
                if len(seen) == total:
                    return

    def points(self) -> list[tuple[int, str]]:
        """All (point, worker_id) pairs in ring order, for ``inspect``."""
        return list(zip(self._points, self._owners, strict=True))
