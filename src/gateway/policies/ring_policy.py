"""Shared machinery of the hash-ring policies (``prefix_hash``, ``consistent_hash``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.common import BasePolicy
from gateway.policies.ring import DEFAULT_VIRTUAL_NODES, HashRing, RingPosition

_worker_id = attrgetter("worker_id")


class RingPolicy(BasePolicy):
    """A policy that places keys on a ``HashRing`` of every worker in the pool.

    The ring holds all workers the router lists, available or not: an unhealthy
    worker is skipped at lookup time rather than removed, so its keys come back to
    it when it recovers instead of reshuffling twice.
    """

    def __init__(self, virtual_nodes: int = DEFAULT_VIRTUAL_NODES) -> None:
        self.ring = HashRing(virtual_nodes)

    def select(self, request: RouteRequest, workers: Sequence[WorkerView]) -> Decision:
        self._sync(workers)
        return super().select(request, workers)

    def on_workers_changed(self, workers: Sequence[WorkerView]) -> None:
        self._sync(workers)

    def explain(self, request: RouteRequest, workers: Sequence[WorkerView]) -> dict[str, Any]:
        self._sync(workers)
        return super().explain(request, workers)

    def _sync(self, workers: Sequence[WorkerView]) -> None:
        ids = frozenset(map(_worker_id, workers))
        if ids != self.ring.members:
            self.ring.set_workers(ids)

    def ring_position(self, key: int) -> RingPosition:
        """Where ``key`` lands on the ring (for ``inspect`` and the admin endpoint)."""
        return self.ring.position(key)

    def ring_points(self) -> list[tuple[int, str]]:
        return self.ring.points()

    @staticmethod
    def load_limit(cands: list[WorkerView], load_factor: float) -> int | None:
        """In-flight requests a worker must stay below to take a key (None: unbounded).

        ``ceil(load_factor * (total + 1) / n)``: the pool average counting this
        request, scaled and rounded up to whole requests. With ``load_factor >= 1`` at
        least one candidate is always below it.
        """
        if load_factor <= 0:
            return None
        total = sum(w.in_flight for w in cands)
        return max(1, math.ceil(load_factor * (total + 1) / len(cands)))

    def walk(
        self, key: int, cands: list[WorkerView], limit: int | None, ring: HashRing | None = None
    ) -> tuple[WorkerView, str, list[str]]:
        """First candidate clockwise from ``key`` under ``limit`` (on ``ring``, default the
        pool's); (worker, reason, walked ids)."""
        by_id = {w.worker_id: w for w in cands}
        walked: list[str] = []
        skipped_for_load = False
        for wid in (ring or self.ring).walk(key):
            walked.append(wid)
            w = by_id.get(wid)
            if w is None:
                continue
            if limit is not None and w.in_flight >= limit:
                skipped_for_load = True
                continue
            if len(walked) == 1:
                reason = "ring_owner"
            elif skipped_for_load:
                reason = "load_bounded"
            else:
                reason = "owner_unavailable"
            return w, reason, walked
        # Unreachable with load_factor >= 1 (see load_limit); kept total for safety.
        best = min(cands, key=attrgetter("in_flight"))
        return best, "load_bounded", walked

    def _position_row(self, key: int) -> dict[str, Any]:
        pos = self.ring.position(key)
        return {
            "key": pos.key,
            "vnode_index": pos.vnode_index,
            "vnode_point": pos.vnode_point,
            "owner": pos.owner,
            "fraction": pos.key / float(1 << 64),
        }
