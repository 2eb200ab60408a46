"""Feed workers' KV-cache events into the ``cache_aware`` radix trees (``serve --kv-events``).

Without events the tree only knows what the gateway itself routed, and guesses
evictions from its own LRU budget. With them it also learns about cache it did not
cause (requests sent straight to a worker, another gateway replica, a chat turn's
output kept by the worker) and forgets what the worker really evicted or flushed.

One task per worker holds a ``SubscribeKvEvents`` stream and applies each batch to
that worker's ``policies.kv_blocks.WorkerBlocks`` on the event loop (the tree's own
lock covers the background evictor). A broken stream is reopened with exponential
backoff, resuming after the last sequence number seen; a gap or a restarted worker
(a sequence number other than the next one) resets that worker's share of the tree,
since events were lost. When the pool's policy is replaced (a flush through the
gateway makes fresh ones), the feed moves to the new policy's tree before its next
batch. Workers whose pool policy keeps no tree are not subscribed, nor engines with
data-parallel ranks (one stream per engine, rank 0's only on SGLang).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.policies.base import Policy
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.kv_blocks import DEFAULT_MAX_BLOCKS, WorkerBlocks
from gateway.proto import common_pb2
from gateway.workers.registry import WorkerRegistry
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.worker import Worker

log = logging.getLogger(__name__)


class PolicySource(Protocol):
    """Where the feeder finds each pool's live policy (the pipeline's router); a
    Protocol so this layer does not import the pipeline above it."""

    def policy(self, model: str, role: str) -> Policy: ...


RETRY_S = 0.2  # first delay before reopening a broken stream (doubles up to RETRY_MAX_S)
RETRY_MAX_S = 5.0


@dataclass(slots=True)
class FeedState:
    """One worker's subscription, for tests and the admin API."""

    blocks: WorkerBlocks
    last_sequence: int = 0
    batches: int = 0
    connects: int = 0
    errors: int = 0
    connected: bool = False
    rebinds: int = 0  # times the pool's policy was replaced and the feed moved to its tree
    stopped: bool = False  # the worker does not serve KV events: no more attempts
    last_error: str = ""

    def describe(self) -> dict[str, Any]:
        st = self.blocks.stats
        return {
            "connected": self.connected,
            "stopped": self.stopped,
            "last_sequence": self.last_sequence,
            "batches": self.batches,
            "connects": self.connects,
            "errors": self.errors,
            "rebinds": self.rebinds,
            "last_error": self.last_error,
            "blocks": len(self.blocks),
            "stored_blocks": st.stored_blocks,
            "removed_blocks": st.removed_blocks,
            "orphan_blocks": st.orphan_blocks,
            "inserted_tokens": st.inserted_tokens,
            "removed_tokens": st.removed_tokens,
            "clears": st.clears,
            "resets": st.resets,
        }


def apply_batch(feed: FeedState, batch: common_pb2.KvEventBatch) -> None:
    """Apply one batch's events in order; a sequence gap first resets the worker's share."""
    if not batch.events:
        return  # a load-only record
    seq = batch.sequence_number
    if feed.last_sequence and seq != feed.last_sequence + 1:
        log.info("kv events of %s: sequence %d after %d, resetting its tree share", feed.blocks.worker, seq, feed.last_sequence)
        feed.blocks.reset()
    blocks = feed.blocks
    for ev in batch.events:
        kind = ev.WhichOneof("data")
        if kind == "stored":
            st = ev.stored
            parent = st.parent_block_hash if st.HasField("parent_block_hash") else None
            blocks.stored(parent, [(b.block_hash, b.token_ids) for b in st.blocks])
        elif kind == "removed":
            blocks.removed(ev.removed.block_hashes)
        elif kind == "cleared":
            blocks.cleared()
    feed.last_sequence = seq
    feed.batches += 1


def learn_page_size(worker: Worker, batch: common_pb2.KvEventBatch) -> None:
    """A worker that reported no page size (SGLang's default leaves the argument null)
    tells it in every stored block: the policies' page alignment follows it."""
    for ev in batch.events:
        if ev.WhichOneof("data") == "stored" and ev.stored.blocks:
            size = ev.stored.blocks[0].block_size
            if worker.info.learn_page_size(size):
                log.info("worker %s: page size %d learned from its KV events", worker.url, size)
            return


class KvEventFeeder:
    """Keeps one KV-event subscription per worker whose pool policy is ``cache_aware``."""

    def __init__(
        self, registry: WorkerRegistry, router: PolicySource, *, retry_s: float = RETRY_S, retry_max_s: float = RETRY_MAX_S
    ) -> None:
        self.registry = registry
        self.router = router
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.feeds: dict[str, FeedState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False

    def start(self) -> None:
        """Subscribe to every current worker and to the ones that join later."""
        if self._started:
            return
        self._started = True
        self.registry.subscribe(self._on_change)
        for worker in self.registry.all():
            if not worker.draining:
                self._start(worker)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _on_change(self, event: str, worker: Worker) -> None:
        if event == "added":
            self._start(worker)
        elif event == "removed":
            task = self._tasks.pop(worker.id, None)
            if task is not None:
                task.cancel()
            self.feeds.pop(worker.id, None)

    def _start(self, worker: Worker) -> None:
        if not self._started or worker.id in self._tasks:
            return
        if worker.dp_rank is not None:
            # One stream per engine, and under DP attention SGLang's covers rank 0 only: a
            # rank's share of the tree learns from routing alone (GET /workers says so).
            log.info("kv events: %s has data-parallel ranks; its ranks' trees learn from routing, not events", worker.url)
            return
        policy = self.router.policy(worker.model, worker.role)
        if not isinstance(policy, CacheAwarePolicy):
            log.info("kv events: %s pool policy %s keeps no tree; not subscribing to %s", worker.role, policy.name, worker.url)
            return
        tree = policy.tree(worker.model)
        page = max(1, worker.info.page_size)
        cap = worker.info.kv_capacity_tokens
        max_blocks = 2 * (cap // page) + 1024 if cap > 0 else DEFAULT_MAX_BLOCKS
        feed = FeedState(WorkerBlocks(tree, worker.id, max_blocks=max_blocks))
        self.feeds[worker.id] = feed
        self._tasks[worker.id] = asyncio.create_task(self._run(worker, feed), name=f"kv-events-{worker.id}")

    def _follow_policy(self, worker: Worker, feed: FeedState) -> None:
        """Move the feed to the pool's live tree: a flush through the gateway replaces the
        policies, and events applied to the old tree would reach no routing decision."""
        policy = self.router.policy(worker.model, worker.role)
        if isinstance(policy, CacheAwarePolicy):
            tree = policy.tree(worker.model)
            if tree is not feed.blocks.tree:
                feed.blocks.rebind(tree)
                feed.rebinds += 1

    async def _run(self, worker: Worker, feed: FeedState) -> None:
        delay = self.retry_s
        while True:
            start = feed.last_sequence + 1 if feed.last_sequence else 0
            call: Any = worker.client.subscribe_kv_events(start)
            try:
                feed.connects += 1
                async for batch in call:
                    if not feed.connected:
                        feed.connected = True
                        delay = self.retry_s
                    learn_page_size(worker, batch)
                    self._follow_policy(worker, feed)
                    apply_batch(feed, batch)
                feed.last_error = "stream ended"
            except asyncio.CancelledError:
                await call.aclose()  # ends the worker's stream too
                raise
            except WorkerCallError as exc:
                feed.errors += 1
                feed.last_error = f"{exc.code.name}: {exc.message}"
                if exc.code is CallCode.UNIMPLEMENTED:
                    log.warning("kv events: %s does not serve SubscribeKvEvents; not subscribing", worker.url)
                    feed.connected = False
                    feed.stopped = True
                    return
                log.debug("kv events of %s: %s", worker.url, feed.last_error)
            except Exception as exc:  # a malformed batch must not kill the subscription for good
                feed.errors += 1
                feed.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("kv events of %s failed: %s", worker.url, feed.last_error)
            feed.connected = False
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)
