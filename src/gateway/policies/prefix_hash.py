"""``prefix_hash``: a token-prefix policy on a consistent-hash ring.

The key is the chained xxh3 hash (``hashing.prefix_key``) of the prompt's first D tokens
in blocks of ``block_size`` (capped by the prompt length; a prompt shorter than one
block is hashed whole). Prompts that share that prefix get the same key, hence the same
worker, in every gateway replica with no coordination.

D adapts to the traffic (``key_depth.KeyDepths``): it starts at ``depth_tokens`` and goes
deeper (in steps of ``depth_tokens``, up to ``max_depth_tokens``) while the key at that
depth carried more than ``depth_max_share`` of the last ``depth_window`` requests: a
prefix every request shares would send them all to one worker. ``depth_window = 0``
keeps D fixed.

Bounded load: a worker with ``in_flight >= ceil(load_factor * (total + 1) / n)``
(above ``load_factor`` times the pool average, counting this request) passes the key
clockwise to the next acceptable worker; unavailable or retry-excluded workers are
skipped the same way. ``load_factor = 0`` turns the bound off. And no healthy worker
stays idle while the chosen one queues (all its running slots taken, or waiting
requests in its last polled load): the first idle worker clockwise takes the request
(``idle_takeover``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.key_depth import (
    DEFAULT_MAX_SHARE,
    DEFAULT_MAX_TOKENS,
    DEFAULT_WINDOW,
    KeyDepths,
)
from gateway.policies.ring import DEFAULT_VIRTUAL_NODES, HashRing
from gateway.policies.ring_policy import RingPolicy

DEFAULT_BLOCK_SIZE = 16
DEFAULT_DEPTH_TOKENS = 256
DEFAULT_LOAD_FACTOR = 1.5  # tuned with token-gateway bench policies tune
IDLE_REASON = "idle_worker"
DEFAULT_WARMUP_S = 30.0


def queues(w: WorkerView) -> bool:
    """The worker has requests waiting for a running slot (as far as the gateway can tell)."""
    if w.max_running_requests and w.in_flight >= w.max_running_requests:
        return True
    return w.loads is not None and w.loads.num_waiting_reqs > 0


class PrefixHashPolicy(RingPolicy):
    name: str = "prefix_hash"

    def __init__(
        self,
        block_size: int = DEFAULT_BLOCK_SIZE,
        depth_tokens: int = DEFAULT_DEPTH_TOKENS,
        virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        *,
        max_depth_tokens: int = DEFAULT_MAX_TOKENS,
        depth_window: int = DEFAULT_WINDOW,
        depth_max_share: float = DEFAULT_MAX_SHARE,
        idle_takeover: bool = True,
        warmup_s: float = DEFAULT_WARMUP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if block_size < 1 or depth_tokens < 1:
            raise ValueError("block_size and depth_tokens must be >= 1")
        if 0 < load_factor < 1:
            raise ValueError("load_factor must be 0 (off) or >= 1")
        super().__init__(virtual_nodes)
        self.block_size = block_size
        self.depth_tokens = depth_tokens
        self.load_factor = load_factor
        self.idle_takeover = idle_takeover
        self.warmup_s = warmup_s
        self._clock = clock
        self._known: set[str] | None = None  # the pool's workers so far (None: not seen yet)
        self._joined: dict[str, float] = {}  # workers that joined after the first look, and when
        self._settled = HashRing(virtual_nodes)  # the ring without the workers still warming up
        self.depths = KeyDepths(block_size, depth_tokens, max_depth_tokens, depth_window, depth_max_share)

    def key(self, request: RouteRequest, n_workers: int = 0) -> int:
        """The ring key of ``request`` at the depth the recent traffic makes informative
        (without ``n_workers``: at ``depth_tokens``)."""
        return self.depths.route(request.token_ids, n_workers)[-1]

    def _warm_ring(self) -> HashRing | None:
        """The ring without the workers that joined in the last ``warmup_s``, or None when
        none is warming up. A key the window has seen is a continuing conversation: during
        a new worker's warm-up it stays where its cache is, and the new worker takes the new
        keys of its arcs (its warm-up slice) until it is settled."""
        members = self.ring.members
        now = self._clock()
        if self._known is None:
            self._known = set(members)  # the pool as first seen: settled
        elif members != self._known:
            for wid in members - self._known:
                self._joined[wid] = now
            for wid in self._known - members:
                self._joined.pop(wid, None)
            self._known = set(members)
        for wid in [w for w, t in self._joined.items() if now - t >= self.warmup_s]:
            del self._joined[wid]
        if not self._joined or self.warmup_s <= 0:
            return None
        settled = members - self._joined.keys()
        if not settled:
            return None
        self._settled.set_workers(settled)
        return self._settled

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        walked = self.depths.route(request.token_ids, len(self.ring))
        key = walked[-1]
        warm = self._warm_ring()
        ring = warm if warm is not None and self.depths.seen(key) else None
        self.depths.record(walked)
        w, reason, _ = self.walk(key, cands, self.load_limit(cands, self.load_factor), ring)
        idle = self._idle_instead(w, key, cands)
        if idle is not None:
            return Decision(idle.worker_id, IDLE_REASON)
        return Decision(w.worker_id, reason)

    def _idle_instead(self, chosen: WorkerView, key: int, cands: list[WorkerView]) -> WorkerView | None:
        """The first idle worker clockwise from ``key`` if ``chosen`` queues, else None."""
        if not self.idle_takeover or not queues(chosen):
            return None
        by_id = {w.worker_id: w for w in cands}
        for wid in self.ring.walk(key):
            w = by_id.get(wid)
            if w is not None and w.in_flight == 0:
                return w
        return None

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        keys = self.depths.keys(request.token_ids)
        rung = self.depths.pick(keys, len(self.ring))
        key = keys[rung]
        limit = self.load_limit(cands, self.load_factor)
        warm = self._warm_ring()
        warming = warm is not None and self.depths.seen(key)
        w, reason, walked = self.walk(key, cands, limit, warm if warming else None)
        idle = self._idle_instead(w, key, cands)
        return {
            "choice": (idle or w).worker_id,
            "reason": IDLE_REASON if idle else reason,
            "ring_position": self._position_row(key),
            "walked": walked,
            "load_limit": limit,
            "block_size": self.block_size,
            "depth_tokens": min(self.depths.depths[rung], len(request.token_ids)),
            "warming_workers": sorted(self._joined),
            "kept_off_warming_workers": warming,
            "key_shares": {
                str(min(d, len(request.token_ids))): round(self.depths.share(k), 4)
                for d, k in zip(self.depths.depths, keys, strict=False)
            },
        }
