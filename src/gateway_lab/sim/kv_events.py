"""KV-event publishing: cache events become numbered KvEventBatch messages.

The cache records raw events only once somebody subscribed (before that there
is nothing to pay for). After each scheduler step the worker calls
:meth:`KvEventHub.publish`, which numbers the step's events as one batch, keeps
it in a bounded history (for subscribers resuming by sequence number) and
wakes every subscriber. Each subscriber's stream attaches the worker's load at
send time, and sends a load-only batch (``load.load_only``, repeating the last
sequence number it sent) when the load changed without KV events and as a
heartbeat while nothing happens.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from gateway.proto import common_pb2
from gateway_lab.sim.radix_cache import (
    CacheEvent,
    ClearedEvent,
    RadixCache,
    RemovedEvent,
    StoredEvent,
)

LoadFn = Callable[[bool], common_pb2.EngineLoad]


class _Subscriber:
    __slots__ = ("batches", "event", "load_dirty")

    def __init__(self) -> None:
        self.batches: deque[tuple[int, float, list[common_pb2.KvCacheEvent]]] = deque()
        self.event = asyncio.Event()
        self.load_dirty = False


class KvEventHub:
    """Numbers a worker's KV events and fans them out to subscribers."""

    def __init__(self, cache: RadixCache, history: int) -> None:
        self.cache = cache
        self.sequence = 0
        self.batches_published = 0
        self._event_id = 0
        self._history: deque[tuple[int, float, list[common_pb2.KvCacheEvent]]] = deque(
            maxlen=max(1, history)
        )
        self._subscribers: set[_Subscriber] = set()

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self) -> None:
        """Turn the cache's pending events into one batch (call after each step)."""
        raw = self.cache.drain_events()
        if not raw:
            return
        events = [self._to_proto(e) for e in raw]
        self.sequence += 1
        self.batches_published += 1
        batch = (self.sequence, time.time(), events)
        self._history.append(batch)
        for sub in self._subscribers:
            sub.batches.append(batch)
            sub.event.set()

    def notify_load(self) -> None:
        """The load changed without a KV event (an admission, a completion)."""
        for sub in self._subscribers:
            sub.load_dirty = True
            sub.event.set()

    def _to_proto(self, e: CacheEvent) -> common_pb2.KvCacheEvent:
        self._event_id += 1
        if isinstance(e, StoredEvent):
            ps = self.cache.page_size
            stored = common_pb2.KvBlocksStored(
                blocks=[
                    common_pb2.KvBlock(block_hash=h, token_ids=t, block_size=ps)
                    for h, t in e.blocks
                ]
            )
            if e.parent_hash is not None:
                stored.parent_block_hash = e.parent_hash
            return common_pb2.KvCacheEvent(event_id=self._event_id, stored=stored)
        if isinstance(e, RemovedEvent):
            return common_pb2.KvCacheEvent(
                event_id=self._event_id, removed=common_pb2.KvBlocksRemoved(block_hashes=e.hashes)
            )
        assert isinstance(e, ClearedEvent)
        return common_pb2.KvCacheEvent(event_id=self._event_id, cleared=common_pb2.KvCacheCleared())

    async def subscribe(
        self, request: common_pb2.SubscribeKvEventsRequest, load: LoadFn, heartbeat_s: float
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        """One subscriber's stream of batches (ends when the caller stops iterating)."""
        self.cache.enable_events()
        sub = _Subscriber()
        start = request.start_sequence_number
        if start > 0:
            sub.batches.extend(b for b in self._history if b[0] >= start)
        self._subscribers.add(sub)
        last_sent = 0
        sample = 0
        # Load-only batches come after the first real batch, or from the
        # start when the subscriber asks for load records before it.
        loads_allowed = request.load_records_before_first_batch
        try:
            if loads_allowed:
                sample += 1
                yield self._load_only(last_sent, load, sample)
            while True:
                if not sub.batches and not sub.load_dirty:
                    try:
                        await asyncio.wait_for(sub.event.wait(), timeout=heartbeat_s)
                    except TimeoutError:
                        pass
                sub.event.clear()
                if sub.batches:
                    first = sample == 0
                    while sub.batches:
                        seq, ts, events = sub.batches.popleft()
                        sample += 1
                        record = load(first)
                        record.sample = sample
                        first = False
                        yield common_pb2.KvEventBatch(
                            sequence_number=seq, timestamp=ts, events=events, dp_rank=0, load=record
                        )
                        last_sent = seq
                    sub.load_dirty = False
                    loads_allowed = True
                elif loads_allowed:
                    sub.load_dirty = False
                    sample += 1
                    yield self._load_only(last_sent, load, sample)
                else:
                    sub.load_dirty = False
        finally:
            self._subscribers.discard(sub)

    @staticmethod
    def _load_only(last_sent: int, load: LoadFn, sample: int) -> common_pb2.KvEventBatch:
        record = load(True)
        record.sample = sample
        record.load_only = True
        return common_pb2.KvEventBatch(
            sequence_number=last_sent, timestamp=time.time(), dp_rank=0, load=record
        )
