"""What this process tells the others: decisions, finishes and its own load, one batch per tick.

The outbox is synchronous and does no I/O: ``policy_tap.TappedPolicy`` feeds it from
the request path (a few appends), and ``bus.SyncBus`` drains it into one NATS message
per event-loop tick. Loads are absolute figures of this process's own work, read at
drain time, so a lost batch is healed by the next one for the same worker (or the
heartbeat's full list).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable

from gateway.policies.base import Decision, RouteRequest
from gateway.policies.radix_tree import pack
from gateway.proto import sync_pb2
from gateway.workers.load import WorkerLoad

_SWAP = sys.byteorder != "little"  # the wire carries little-endian uint32 token ids


def wire_tokens(packed: bytes) -> bytes:
    """Native uint32 bytes (the tree's format) -> little-endian wire bytes (a no-op on x86/arm)."""
    if not _SWAP:
        return packed
    from array import array

    a = array("I", packed)
    a.byteswap()
    return a.tobytes()


native_tokens = wire_tokens  # the swap is its own inverse


def page_aligned(packed: bytes, page_size: int) -> bytes:
    """The prompt cut to whole KV pages: the part a worker's prefix cache can hold."""
    n = len(packed) >> 2
    if page_size > 1:
        n -= n % page_size
    return packed[: 4 * n]


class Outbox:
    """Pending events of the current tick; ``take`` turns them into one ``Batch``."""

    def __init__(
        self,
        origin: str,
        loads: Callable[[str], WorkerLoad | None],
        page_size: Callable[[str], int],
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        on_pending: Callable[[], None] = lambda: None,
    ) -> None:
        """``loads(worker_id)`` is this process's own load on a worker (None: gone);
        ``on_pending`` is called when the first event of a tick arrives (the bus wakes)."""
        self.origin = origin
        self._loads = loads
        self._page_size = page_size
        self._clock_ns = clock_ns
        self._on_pending = on_pending
        self._seq = 0
        self._decisions: list[sync_pb2.Decision] = []
        self._finishes: list[sync_pb2.Finish] = []
        self._dirty: set[str] = set()
        self._known: set[str] = set()  # workers whose last published load was non-zero

    def __bool__(self) -> bool:
        return bool(self._decisions or self._finishes or self._dirty)

    def _wake(self) -> None:
        if not self:
            self._on_pending()

    def dispatched(self, pool: str, request: RouteRequest, decision: Decision) -> None:
        self._wake()
        wid = decision.worker_id
        tokens = page_aligned(pack(request.token_ids), self._page_size(wid))
        self._decisions.append(sync_pb2.Decision(
            worker_id=wid, model=request.model, pool=pool, tokens=wire_tokens(tokens),
            prompt_tokens=len(request.token_ids), predicted_cached=decision.predicted_cached_tokens,
            decided_unix_ns=self._clock_ns(),
        ))
        self._dirty.add(wid)

    def finished(self, pool: str, model: str, worker_id: str, cached_tokens: int, success: bool) -> None:
        self._wake()
        self._finishes.append(sync_pb2.Finish(
            worker_id=worker_id, model=model, pool=pool, cached_tokens=max(0, cached_tokens), success=success,
        ))
        self._dirty.add(worker_id)

    def load_changed(self, worker_id: str) -> None:
        self._wake()
        self._dirty.add(worker_id)

    def take(self, *, full: Iterable[str] | None = None, goodbye: bool = False) -> sync_pb2.Batch | None:
        """The tick's batch (None if there is nothing to say). ``full``: every worker id,
        for a heartbeat that restates this process's whole load."""
        if not self and full is None and not goodbye:
            return None
        self._seq += 1
        batch = sync_pb2.Batch(origin=self.origin, seq=self._seq, sent_unix_ns=self._clock_ns(), goodbye=goodbye)
        batch.decisions.extend(self._decisions)
        batch.finishes.extend(self._finishes)
        ids = set(self._dirty) if full is None else set(full) | self._dirty
        for wid in sorted(ids):
            load = self._loads(wid)
            if load is None or not (load.in_flight or load.queued_prefill_tokens or load.running_decode_tokens):
                if full is not None or wid not in self._known:
                    continue  # a full list implies 0 for workers left out; an unknown one is 0 already
                self._known.discard(wid)
                batch.loads.add(worker_id=wid)
                continue
            self._known.add(wid)
            batch.loads.add(
                worker_id=wid, in_flight=max(0, load.in_flight),
                queued_prefill_tokens=max(0, load.queued_prefill_tokens),
                running_decode_tokens=max(0, load.running_decode_tokens),
            )
        if full is not None:
            batch.full_loads = True
            self._known = {lo.worker_id for lo in batch.loads}
        self._decisions = []
        self._finishes = []
        self._dirty = set()
        return batch
