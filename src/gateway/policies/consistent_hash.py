"""``consistent_hash``: sticky routing on a client-supplied routing key.

The key is ``xxh3_64`` of ``RouteRequest.routing_key`` (the ``X-SMG-Routing-Key`` /
``x-routing-key`` header) placed on the same kind of ring as ``prefix_hash``; the
first available worker clockwise wins. There is no load bound: a client that sends a
routing key asks for affinity (session stickiness) and gets it while the worker is up.

When a request has no routing key, ``fallback`` decides: ``"prefix"`` (default) uses
the prompt's prefix hash on the same ring, so keyless traffic still lands where its
prefix lives; ``"round_robin"`` spreads keyless traffic in turn.
"""

from __future__ import annotations

from typing import Any

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.hashing import prefix_key, string_key
from gateway.policies.prefix_hash import DEFAULT_BLOCK_SIZE, DEFAULT_DEPTH_TOKENS
from gateway.policies.ring import DEFAULT_VIRTUAL_NODES
from gateway.policies.ring_policy import RingPolicy

FALLBACKS = ("prefix", "round_robin")


class ConsistentHashPolicy(RingPolicy):
    name: str = "consistent_hash"

    def __init__(
        self,
        virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
        fallback: str = "prefix",
        block_size: int = DEFAULT_BLOCK_SIZE,
        depth_tokens: int = DEFAULT_DEPTH_TOKENS,
    ) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, not {fallback!r}")
        super().__init__(virtual_nodes)
        self.fallback = fallback
        self.block_size = block_size
        self.depth_tokens = depth_tokens
        self._next = 0

    def key(self, request: RouteRequest) -> int | None:
        """The ring key, or None when keyless traffic falls back to round robin."""
        if request.routing_key:
            return string_key(request.routing_key)
        if self.fallback == "prefix":
            return prefix_key(request.token_ids, self.block_size, self.depth_tokens)
        return None

    def _reason(self, request: RouteRequest) -> str:
        return "routing_key" if request.routing_key else f"{self.fallback}_fallback"

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        key = self.key(request)
        if key is None:
            w = cands[self._next % len(cands)]
            self._next += 1
            return Decision(w.worker_id, "round_robin_fallback")
        w, _, _ = self.walk(key, cands, None)
        return Decision(w.worker_id, self._reason(request))

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        key = self.key(request)
        if key is None:
            return {"choice": cands[self._next % len(cands)].worker_id, "reason": "round_robin_fallback"}
        w, _, walked = self.walk(key, cands, None)
        return {
            "choice": w.worker_id,
            "reason": self._reason(request),
            "ring_position": self._position_row(key),
            "walked": walked,
        }
