"""Why each cache miss happened: the prefill tokens a pool paid, counted by cause.

An achieved hit rate below the ideal says routing lost something, not what. Each
dispatched prompt's blocks (chained hashes, ``hashing.chained_hashes``) are classified
when it is sent, from what the gateway itself saw before, and the tokens the worker then
reports as not cached are charged to those causes:

* ``first_sight``: no request of the pool ever carried this prefix (no router avoids it);
* ``in_prefill``: a request with this prefix was on the same worker and had not finished
  (it was most likely still computing the prefix: a duplicate prefill);
* ``evicted``: this worker served the prefix before and no longer holds it (evicted,
  flushed or restarted);
* ``new_worker``: another worker holds it and this one joined the pool in the last
  ``new_worker_s`` (its cache is still cold: the price of growing the pool);
* ``spilled_for_load``: another worker holds it and the policy chose this one for load;
* ``held_elsewhere``: another worker holds it and the policy did not send it there
  (a cache-blind policy, a ring change, another gateway replica's placement).

The prompt's last token is never a miss: a worker always computes it. A request is also
counted once, under the cause of its first missed block. Memory is bounded (per-worker
and pool-wide LRU sets of block hashes); a block forgotten by them reads as first sight.
Pure and synchronous; the router calls it off the request's path.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.policies.hashing import chained_hashes

CAUSES = ("first_sight", "in_prefill", "evicted", "new_worker", "spilled_for_load", "held_elsewhere")
# decision reasons that mean "the policy knew better places but chose this one for load"
SPILL_REASONS = frozenset({
    "load_balanced", "load_bounded", "idle_worker", "hot_prefix", "hot_prefix_new_replica", "hot_prefix_overflow",
})  # fmt: skip
DEFAULT_BLOCK_TOKENS = 16
DEFAULT_WORKER_BLOCKS = 1 << 16  # per worker: ~1M tokens of 16-token blocks
DEFAULT_POOL_BLOCKS = 1 << 18
DEFAULT_NEW_WORKER_S = 60.0


@dataclass(slots=True)
class MissTicket:
    """One dispatch, as the miss ledger follows it (created on the request path, cheap)."""

    worker_id: str
    tokens: Sequence[int]
    reason: str
    blocks: list[int] | None = None  # chained block hashes, computed off the request path
    runs: list[tuple[int, str]] = field(default_factory=list)  # (end block, cause) from block 0 on
    done: bool = False
    packed: bytes = b""  # ``tokens`` packed as native uint32, when the policy packed them already


@dataclass(slots=True)
class CauseCount:
    requests: int = 0
    tokens: int = 0


class MissCauses:
    """The ledger of one (model, pool): what each worker was seen to hold, and misses by cause."""

    def __init__(
        self,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        *,
        worker_blocks: int = DEFAULT_WORKER_BLOCKS,
        pool_blocks: int = DEFAULT_POOL_BLOCKS,
        new_worker_s: float = DEFAULT_NEW_WORKER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if block_tokens < 1 or worker_blocks < 1 or pool_blocks < 1:
            raise ValueError("block and set sizes must be >= 1")
        self.block_tokens = block_tokens
        self.worker_blocks = worker_blocks
        self.pool_blocks = pool_blocks
        self.new_worker_s = new_worker_s
        self._clock = clock
        self._held: dict[str, OrderedDict[int, None]] = {}
        self._prefilling: dict[str, dict[int, int]] = {}  # worker -> block -> requests in flight with it
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._joined: dict[str, float] = {}
        self.counts: dict[str, CauseCount] = {c: CauseCount() for c in CAUSES}
        self.missed_requests = 0
        self.requests = 0

    # ------------------------------------------------------------ the request's life

    def dispatched(self, ticket: MissTicket) -> None:
        """Classify the prompt's blocks from what was seen so far, and mark them in flight."""
        w = ticket.worker_id
        joined = self._joined.get(w)
        new = joined is not None and self._clock() - joined < self.new_worker_s
        hashes = chained_hashes(ticket.packed or ticket.tokens, self.block_tokens)
        prefilling = self._prefilling.get(w)
        if prefilling is None:
            prefilling = self._prefilling[w] = {}
        held = self._held.get(w)
        seen = self._seen
        runs: list[tuple[int, str]] = []
        for i, h in enumerate(hashes):
            if h in prefilling:
                cause = "in_prefill"
            elif held is not None and h in held:
                cause = "evicted"
            elif h in seen:
                cause = "new_worker" if new else "spilled_for_load" if ticket.reason in SPILL_REASONS else "held_elsewhere"
            else:  # chained: nothing deeper was seen either
                runs.append((len(hashes), "first_sight"))
                break
            if runs and runs[-1][1] == cause:
                runs[-1] = (i + 1, cause)
            else:
                runs.append((i + 1, cause))
        for h in hashes:
            prefilling[h] = prefilling.get(h, 0) + 1
        ticket.blocks = hashes
        ticket.runs = runs

    def finished(self, ticket: MissTicket, cached_tokens: int, success: bool) -> None:
        """The stream ended: charge the tokens the worker did not have, learn what it holds now."""
        if ticket.blocks is None or ticket.done:
            return
        ticket.done = True
        w = ticket.worker_id
        prefilling = self._prefilling.get(w)
        if prefilling is not None:
            for h in ticket.blocks:
                left = prefilling.get(h, 0) - 1
                if left > 0:
                    prefilling[h] = left
                else:
                    prefilling.pop(h, None)
        if not success:
            return
        self.requests += 1
        self._charge(ticket, cached_tokens)
        held = self._held.setdefault(w, OrderedDict())
        seen = self._seen
        for h in ticket.blocks:
            held[h] = None
            held.move_to_end(h)
            seen[h] = None
            seen.move_to_end(h)
        while len(held) > self.worker_blocks:
            held.popitem(last=False)
        while len(seen) > self.pool_blocks:
            seen.popitem(last=False)

    def _charge(self, ticket: MissTicket, cached_tokens: int) -> None:
        last = len(ticket.tokens) - 1  # always computed by the worker: never a miss
        start = cached_tokens if cached_tokens > 0 else 0
        if start >= last:
            return
        b = self.block_tokens
        counts = self.counts
        first: str | None = None
        begin = 0
        for end_block, cause in ticket.runs:  # (bounds by comparison: no min/max call per run)
            lo = begin * b if begin * b > start else start
            hi = end_block * b if end_block * b < last else last
            if hi > lo:
                counts[cause].tokens += hi - lo
                first = first or cause
            begin = end_block
        covered = begin * b
        tail = covered if covered > start else start
        if last > tail:  # the partial tail block: new unless its whole prefix was known
            tail_cause = ticket.runs[-1][1] if ticket.runs else "first_sight"
            counts[tail_cause].tokens += last - tail
            first = first or tail_cause
        if first is not None:
            self.counts[first].requests += 1
            self.missed_requests += 1

    def abandoned(self, ticket: MissTicket) -> None:
        """The request ended before the worker's first output: nothing to charge."""
        self.finished(ticket, 0, False)

    def joined(self, worker_id: str) -> None:
        """The worker was added to the pool now (the pool's first workers never are: not new)."""
        self._joined[worker_id] = self._clock()

    def forget_worker(self, worker_id: str) -> None:
        """The worker left the pool: what it held is gone."""
        self._held.pop(worker_id, None)
        self._prefilling.pop(worker_id, None)
        self._joined.pop(worker_id, None)

    # ------------------------------------------------------------ figures

    def snapshot(self) -> dict[str, Any]:
        return {
            cause: {"requests": c.requests, "tokens": c.tokens} for cause, c in self.counts.items()
        } | {"_requests": self.requests, "_missed_requests": self.missed_requests}
