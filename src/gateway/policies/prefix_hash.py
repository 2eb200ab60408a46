"""``prefix_hash``: a stateless token-prefix policy on a consistent-hash ring.

The key is the chained xxh3 hash (``hashing.prefix_key``) of the prompt's first
``depth_tokens`` tokens in blocks of ``block_size`` (capped by the prompt length; a
prompt shorter than one block is hashed whole). Prompts that share that prefix get
the same key, hence the same worker, in every gateway replica with no coordination.

Bounded load: a worker with ``in_flight >= ceil(load_factor * (total + 1) / n)``
(above ``load_factor`` times the pool average, counting this request) passes the key
clockwise to the next acceptable worker; unavailable or retry-excluded workers are
skipped the same way. ``load_factor = 0`` turns the bound off.
"""

from __future__ import annotations

from typing import Any

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.hashing import prefix_key
from gateway.policies.ring import DEFAULT_VIRTUAL_NODES
from gateway.policies.ring_policy import RingPolicy

DEFAULT_BLOCK_SIZE = 16
DEFAULT_DEPTH_TOKENS = 256
DEFAULT_LOAD_FACTOR = 1.5  # tuned with token-gateway bench policies tune


class PrefixHashPolicy(RingPolicy):
    name: str = "prefix_hash"

    def __init__(
        self,
        block_size: int = DEFAULT_BLOCK_SIZE,
        depth_tokens: int = DEFAULT_DEPTH_TOKENS,
        virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
        load_factor: float = DEFAULT_LOAD_FACTOR,
    ) -> None:
        if block_size < 1 or depth_tokens < 1:
            raise ValueError("block_size and depth_tokens must be >= 1")
        if 0 < load_factor < 1:
            raise ValueError("load_factor must be 0 (off) or >= 1")
        super().__init__(virtual_nodes)
        self.block_size = block_size
        self.depth_tokens = depth_tokens
        self.load_factor = load_factor

    def key(self, request: RouteRequest) -> int:
        """The ring key of ``request`` (depends only on its first ``depth_tokens`` tokens)."""
        return prefix_key(request.token_ids, self.block_size, self.depth_tokens)

    def _choose(self, request: RouteRequest, cands: list[WorkerView]) -> Decision:
        w, reason, _ = self.walk(self.key(request), cands, self.load_limit(cands, self.load_factor))
        return Decision(w.worker_id, reason)

    def _explain_candidates(self, request: RouteRequest, cands: list[WorkerView]) -> dict[str, Any]:
        key = self.key(request)
        limit = self.load_limit(cands, self.load_factor)
        w, reason, walked = self.walk(key, cands, limit)
        return {
            "choice": w.worker_id,
            "reason": reason,
            "ring_position": self._position_row(key),
            "walked": walked,
            "load_limit": limit,
            "block_size": self.block_size,
            "depth_tokens": min(self.depth_tokens, len(request.token_ids)),
        }
