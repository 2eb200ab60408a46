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
batch. Workers whose pool policy keeps no tree are not subscribed.

An engine with data-parallel ranks has one stream per engine (rank 0's only, on SGLang and
vLLM's servicer alike), so its ranks are not subscribed through it. An engine named in
``--kv-events-zmq`` (vLLM, SGLang) is read from its own publishers instead, one per rank
(``workers.zmq_kv_events``), each rank's batches applied to that rank's share. There a
batch from another rank is dropped and counted (``wrong_rank``; the rank's share kept:
those events describe another cache), and a frame that is not a batch is counted
(``malformed``) and resets the rank's share, as a gap does (its events are lost). A
publisher that restarts numbers from 0 again: a gap, so a reset. Where the entry names
vLLM's replay endpoint too, a gap is first asked of it (``workers.kv_replay``): the missed
batches applied in order keep the share, and only a replay that does not close the gap
(too wide, no longer kept, too slow) falls back to the reset.

With ``discover`` (``--kv-events-zmq auto``), a worker not named by an entry is read from
the publisher it reports in its server info (``workers.kv_event_discovery``) from the
moment it joins, and no longer once it leaves; a publisher the gateway cannot use is
logged and shown in ``GET /workers`` (``kv_events_problem``), and the worker keeps the feed
it would have had without one. An explicit entry wins over what the worker reports.

Where the gateway binds the rank's endpoint (vLLM connects out), only one process of a
``serve --processes N`` set can: the set shares (``share``) so that the one whose bind
succeeds hands every batch, as it applied it, to the others over the sync bus, and a
process whose bind finds the address in use follows it (``relayed``) rather than stopping.
A follower tries the bind again every ``bind_retry_s`` and takes the endpoint over when its
holder goes. A follower applies the same batches with the same numbering, so a batch lost
on the bus is a gap there too, and resets that process's share only. A batch too large for
one bus message comes in parts (``sync.kv_split``), applied in order as one batch.
A feed that starts following asks the reader for its share (``share_wanted`` there), which
answers with every page it holds under a reset, so a process that joins late holds them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import zmq
from google.protobuf.json_format import MessageToDict

from gateway.policies.base import Policy
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.kv_blocks import DEFAULT_MAX_BLOCKS, WorkerBlocks
from gateway.proto import common_pb2
from gateway.workers import kv_replay
from gateway.workers.kv_event_discovery import discover
from gateway.workers.registry import WorkerRegistry
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.worker import Worker, json_text
from gateway.workers.zmq_kv_events import (
    BadFrame,
    BadZmqSource,
    RankSubscriber,
    WrongRank,
    ZmqEndpoint,
    read_frame,
)

log = logging.getLogger(__name__)


class PolicySource(Protocol):
    """Where the feeder finds each pool's live policy (the pipeline's router); a
    Protocol so this layer does not import the pipeline above it."""

    def policy(self, model: str, role: str) -> Policy: ...


RETRY_S = 0.2  # first delay before reopening a broken stream (doubles up to RETRY_MAX_S)
RETRY_MAX_S = 5.0
BIND_RETRY_S = 1.0  # a follower's wait between two attempts to bind the endpoint another process holds
# The waits before a worker's report of its publisher, unanswered at its join, is asked again.
LATE_REPORT_WAITS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)

# (worker id, batch, reset first): a batch this process read from an endpoint it binds, for the others
Relay = Callable[[str, common_pb2.KvEventBatch, bool], object]


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
    source: str = "SubscribeKvEvents"  # or the ZMQ address of the rank's publisher
    malformed: int = 0  # frames that were not an event batch (ZMQ feeds)
    wrong_rank: int = 0  # batches of another rank, dropped (ZMQ feeds)
    follower: bool = False  # another process binds the endpoint: its batches come over the sync bus
    relayed: int = 0  # batches handed to the other processes (the binder) or taken from the binder (a follower)
    replay_source: str = ""  # the rank's replay socket, when the entry names one
    replays: int = 0  # gaps asked of the replay socket
    replays_filled: int = 0  # ... closed by what it gave back (no reset)
    replayed: int = 0  # batches applied from replays
    sharing: bool = False  # this process reads an endpoint it binds and hands the batches to the set
    parts_left: int = 0  # a relayed batch cut into parts (too large for one bus message): parts still to come
    endpoint_from: str = ""  # a ZMQ feed's endpoint: "--kv-events-zmq" (an entry) or "server_info" (the worker's report)

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
            "source": self.source,
            "malformed": self.malformed,
            "wrong_rank": self.wrong_rank,
            "follower": self.follower,
            "relayed": self.relayed,
            "replay_source": self.replay_source or None,
            "replays": self.replays,
            "replays_filled": self.replays_filled,
            "replayed": self.replayed,
            "endpoint_from": self.endpoint_from or None,
            "blocks": len(self.blocks),
            "stored_blocks": st.stored_blocks,
            "removed_blocks": st.removed_blocks,
            "orphan_blocks": st.orphan_blocks,
            "inserted_tokens": st.inserted_tokens,
            "removed_tokens": st.removed_tokens,
            "clears": st.clears,
            "resets": st.resets,
        }


def apply_batch(feed: FeedState, batch: common_pb2.KvEventBatch, *, numbered: bool = False) -> None:
    """Apply one batch's events in order; a sequence gap first resets the worker's share.
    ``numbered``: every batch takes a number (a ZMQ publisher's), so one left with no events
    (an offloading connector's copies, left out) still moves the sequence on; otherwise a
    batch without events is a load-only record."""
    if not batch.events and not numbered:
        return
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


def _log_often(count: int, message: str, *args: object) -> None:
    """A warning on the 1st, 2nd, 4th, 8th... time (a misconfigured publisher repeats
    itself every step), debug otherwise."""
    log.log(logging.WARNING if count & (count - 1) == 0 else logging.DEBUG, message, *args)


class KvEventFeeder:
    """Keeps one KV-event subscription per worker whose pool policy is ``cache_aware``."""

    def __init__(
        self, registry: WorkerRegistry, router: PolicySource, *, retry_s: float = RETRY_S, retry_max_s: float = RETRY_MAX_S,
        zmq_sources: Mapping[str, ZmqEndpoint] | None = None, bind_retry_s: float = BIND_RETRY_S,
        replay_timeout_s: float = kv_replay.TIMEOUT_S, discover: bool = False,
    ) -> None:
        self.registry = registry
        self.router = router
        self.zmq_sources = dict(zmq_sources or {})  # engine id -> its publishers' endpoint (vLLM)
        self.discover = discover  # read a worker's publisher from its server info when no entry names it
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.bind_retry_s = bind_retry_s
        self.replay_timeout_s = replay_timeout_s
        self._relay: Relay | None = None
        self._ask: Callable[[str], object] | None = None
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

    def share(self, relay: Relay, ask: Callable[[str], object] | None = None) -> None:
        """Join a set of processes on one sync bus: what this process reads from an endpoint
        it binds goes to ``relay`` as applied, and an endpoint another process binds is
        followed through ``relayed`` instead of stopping the feed; a feed that starts
        following asks (``ask``) for the share the reader holds (``share_wanted`` there)."""
        self._relay = relay
        self._ask = ask

    def share_wanted(self, worker_id: str) -> None:
        """A process started following this worker's endpoint: where this one reads it, every
        page of its share goes to the set as stored events under a reset, numbered as the
        last batch applied, so the newcomer holds what this process holds."""
        feed = self.feeds.get(worker_id)
        worker = self.registry.get(worker_id)
        if feed is None or worker is None or not feed.sharing or not feed.last_sequence:
            return
        batch = common_pb2.KvEventBatch(sequence_number=feed.last_sequence)
        for parent, block_hash, tokens in feed.blocks.pages():
            stored = batch.events.add().stored
            if parent is not None:
                stored.parent_block_hash = parent
            stored.blocks.add(block_hash=block_hash, token_ids=tokens, block_size=len(tokens))
        self._pass_on(worker, feed, batch, True)

    def relayed(self, worker_id: str, batch: common_pb2.KvEventBatch, reset: bool, part: int = 0, parts: int = 0) -> None:
        """A batch another process read from an endpoint it binds, as it applied it; taken by
        this process's feed of that worker only while it follows that endpoint. A batch too
        large for one bus message comes as ``parts`` messages with the same number (``part``
        from 0): applied in order as one batch; a part missing resets the worker's share."""
        feed = self.feeds.get(worker_id)
        worker = self.registry.get(worker_id)
        if feed is None or worker is None or not feed.follower:
            return
        feed.relayed += 1
        if part or feed.parts_left:
            if not self._take_part(worker, feed, batch, part, parts):
                return
        elif parts > 1:
            feed.parts_left = parts - 1
        if reset:
            self._follow_policy(worker, feed)
            feed.blocks.reset()
            feed.last_sequence = batch.sequence_number
            if not batch.events:
                return
            feed.last_sequence -= 1  # a share: its pages applied as the batch of that number
        try:
            self._apply(worker, feed, batch, numbered=True)
        except Exception as exc:  # as for a batch read directly: the share reset, the feed goes on
            feed.errors += 1
            feed.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("kv events of %s (relayed) failed: %s; its tree share reset", worker_id, feed.last_error)
            feed.blocks.reset()

    def _take_part(self, worker: Worker, feed: FeedState, batch: common_pb2.KvEventBatch, part: int, parts: int) -> bool:
        """Whether this message goes on to be applied. A continuation in its place is applied
        as the rest of the batch (same number, no gap); one out of place, or a new batch while
        parts of the last are missing, resets the share first (those events are lost here)."""
        expected = part > 0 and feed.parts_left == parts - part and feed.last_sequence == batch.sequence_number
        if expected:
            feed.parts_left -= 1
            self._follow_policy(worker, feed)
            feed.last_sequence = batch.sequence_number - 1  # the rest of the batch just applied: no gap
            return True
        feed.errors += 1
        feed.last_error = f"a part of relayed batch {feed.last_sequence} did not arrive"
        log.info("kv events of %s (relayed): %s; its tree share reset", worker.id, feed.last_error)
        self._follow_policy(worker, feed)
        feed.blocks.reset()
        feed.parts_left = 0
        if part:  # the rest of a batch whose start was lost: skipped, the next batch follows on
            feed.last_sequence = batch.sequence_number
            return False
        feed.last_sequence = 0  # a new batch: applied from an empty share, with no gap check
        if parts > 1:
            feed.parts_left = parts - 1
        return True

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
        zmq_source, endpoint_from = self._zmq_source(worker)
        if worker.dp_rank is not None and zmq_source is None:
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
        if zmq_source is None:
            late = self.discover and getattr(worker.client, "kv_events_report_pending", False)
            run = self._discover_later(worker, feed) if late else self._run(worker, feed)
        else:
            try:
                sub = RankSubscriber(zmq_source, worker.dp_rank or 0, worker.client.address.host)
                if zmq_source.replay is not None:
                    feed.replay_source = zmq_source.replay.for_rank(sub.rank, worker.client.address.host)
            except BadZmqSource as exc:
                feed.stopped, feed.last_error = True, str(exc)
                if endpoint_from == "server_info":
                    worker.kv_events_problem = f"the publisher it reports is not used: {exc}"
                log.error("kv events of %s: %s", worker.id, exc)
                return
            feed.source, feed.endpoint_from = sub.address, endpoint_from
            run = self._run_zmq(worker, feed, sub)
        worker.kv_events_source = feed.source
        self._tasks[worker.id] = asyncio.create_task(run, name=f"kv-events-{worker.id}")

    async def _discover_later(self, worker: Worker, feed: FeedState) -> None:
        """A worker whose report of its publisher was asked and not answered in time when it
        joined (vLLM collects its host's environment on that route's first call, and goes on
        and keeps it): its server info is asked again, apart from the join, and the feed starts
        again from the answer; never answered, the worker keeps what it has without ``auto``."""
        for delay in LATE_REPORT_WAITS_S:
            await asyncio.sleep(delay)
            try:
                info = await worker.client.server_info()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # asked again at the next wait
                log.debug("kv events of %s: server info: %s", worker.id, exc)
                continue
            if getattr(worker.client, "kv_events_report_pending", False):
                continue
            args = MessageToDict(info.server_args) if info.HasField("server_args") else {}
            worker.info.kv_events_config = json_text(args.get("kv_events_config"))
            log.info("kv events of %s: its report of its publisher answered late; reading it", worker.id)
            self._tasks.pop(worker.id, None)
            self.feeds.pop(worker.id, None)
            self._start(worker)
            return
        await self._run(worker, feed)

    def _zmq_source(self, worker: Worker) -> tuple[ZmqEndpoint | None, str]:
        """The worker's publisher and where it was named: an entry, or (with ``discover``) the
        worker's own report; a report the gateway cannot use is the worker's problem to show."""
        explicit = self.zmq_sources.get(worker.engine_id)
        if explicit is not None or not self.discover:
            return explicit, "--kv-events-zmq" if explicit is not None else ""
        try:
            # SGLang binds a 0.0.0.0 endpoint; vLLM connects to it.
            found = discover(worker.info.kv_events_config, binds_unspecified=not worker.client.kind.startswith("vllm/"))
        except BadZmqSource as exc:
            worker.kv_events_problem = f"the publisher it reports is not used: {exc}"
            log.warning("kv events of %s: %s", worker.id, worker.kv_events_problem)
            return None, ""
        return found, "server_info" if found is not None else ""

    def _follow_policy(self, worker: Worker, feed: FeedState) -> None:
        """Move the feed to the pool's live tree: a flush through the gateway replaces the
        policies, and events applied to the old tree would reach no routing decision."""
        policy = self.router.policy(worker.model, worker.role)
        if isinstance(policy, CacheAwarePolicy):
            tree = policy.tree(worker.model)
            if tree is not feed.blocks.tree:
                feed.blocks.rebind(tree)
                feed.rebinds += 1

    def _apply(self, worker: Worker, feed: FeedState, batch: common_pb2.KvEventBatch, *, numbered: bool = False) -> None:
        learn_page_size(worker, batch)
        self._follow_policy(worker, feed)
        apply_batch(feed, batch, numbered=numbered)

    def _pass_on(self, worker: Worker, feed: FeedState, batch: common_pb2.KvEventBatch, reset: bool) -> None:
        """Hand what this process applied from an endpoint it binds to the processes that follow it."""
        if self._relay is not None:
            self._relay(worker.id, batch, reset)
            feed.relayed += 1

    async def _open(self, worker: Worker, feed: FeedState, sub: RankSubscriber) -> bool:
        """Bind or connect. Where another process of the set binds the address, follow it and
        try again every ``bind_retry_s`` (taking the endpoint over when it goes); anything
        else that fails (an address not this host's, a port another program holds with no
        set to share) stops the feed, logged, and returns False."""
        while True:
            try:
                sub.open()
            except zmq.ZMQError as exc:
                if self._relay is not None and sub.binds and exc.errno == zmq.EADDRINUSE:
                    if not feed.follower:
                        feed.follower, feed.last_error = True, f"ZMQError: {exc}"
                        log.info("kv events of %s: %s is bound by another process; following it over the sync bus",
                                 worker.id, sub.address)
                        if self._ask is not None:
                            self._ask(worker.id)
                    await asyncio.sleep(self.bind_retry_s)
                    continue
                feed.stopped, feed.last_error = True, f"ZMQError: {exc}"
            except Exception as exc:
                feed.stopped, feed.last_error = True, f"{type(exc).__name__}: {exc}"
            if feed.stopped:
                log.error("kv events of %s: cannot %s %s: %s", worker.id, "bind" if sub.binds else "connect", sub.address,
                          feed.last_error)
                return False
            if feed.follower:
                feed.follower = False
                log.info("kv events of %s: took %s over from the process that held it", worker.id, sub.address)
            return True

    async def _run_zmq(self, worker: Worker, feed: FeedState, sub: RankSubscriber) -> None:
        """One rank's publisher: frames read and applied until cancelled (and, where this
        process binds the endpoint, passed on to the set). ZMQ reconnects by itself."""
        if not await self._open(worker, feed, sub):
            return
        feed.connects += 1
        feed.connected = True
        log.info("kv events of %s: %s the engine's publisher at %s", worker.id, "bound for" if sub.binds else "connected to", sub.address)
        shares = sub.binds  # where vLLM binds, every process connects and reads for itself
        feed.sharing = shares and self._relay is not None
        try:
            async for frames in sub.frames():
                try:
                    batch = read_frame(frames, sub.rank)
                    if feed.replay_source and feed.last_sequence and batch.sequence_number > feed.last_sequence + 1:
                        await self._replay(worker, feed, sub.rank, batch.sequence_number, shares)
                    self._apply(worker, feed, batch, numbered=True)
                    if shares:
                        self._pass_on(worker, feed, batch, False)
                except WrongRank as exc:
                    feed.wrong_rank += 1
                    feed.last_error = str(exc)
                    _log_often(feed.wrong_rank, "kv events of %s: %s; dropped (check the ports of --kv-events-zmq)", worker.id, exc)
                    continue
                except BadFrame as exc:
                    feed.malformed += 1
                    feed.errors += 1
                    feed.last_error = str(exc)
                    _log_often(feed.malformed, "kv events of %s: not an event batch (%s); its tree share reset", worker.id, exc)
                    self._follow_policy(worker, feed)
                    feed.blocks.reset()
                    if exc.sequence is not None:
                        feed.last_sequence = exc.sequence + 1  # numbered as read_frame numbers batches
                    if shares:
                        self._pass_on(worker, feed, common_pb2.KvEventBatch(sequence_number=feed.last_sequence), True)
                except Exception as exc:  # a batch the tree could not take must not end the feed
                    feed.errors += 1
                    feed.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("kv events of %s failed: %s; its tree share reset", worker.id, feed.last_error)
                    feed.blocks.reset()
                    if shares:  # the followers reset too and take the next batch without a gap check
                        self._pass_on(worker, feed, common_pb2.KvEventBatch(), True)
        finally:
            feed.connected = feed.sharing = False
            sub.close()

    async def _replay(self, worker: Worker, feed: FeedState, rank: int, upto: int, shares: bool) -> None:
        """Ask the rank's replay socket for the batches between the last applied and ``upto``
        (the feed's numbers: the publisher's + 1) and apply them when they close the gap; else
        leave the gap to the reset that applying the next batch makes."""
        first, last = feed.last_sequence, upto - 2  # the publisher's numbers of the missed batches
        feed.replays += 1
        got = await kv_replay.fetch(feed.replay_source, first, last, timeout_s=self.replay_timeout_s)
        if [seq for seq, _ in got] != list(range(first, last + 1)):
            log.info("kv events of %s: the replay gave %d of batches %d-%d; its tree share reset", worker.id, len(got), first, last)
            return
        try:
            batches = [read_frame([b"", seq.to_bytes(8, "big"), payload], rank) for seq, payload in got]
        except (BadFrame, WrongRank) as exc:
            log.info("kv events of %s: a replayed batch is not one (%s); its tree share reset", worker.id, exc)
            return
        for batch in batches:
            self._apply(worker, feed, batch, numbered=True)
            if shares:
                self._pass_on(worker, feed, batch, False)
        feed.replays_filled += 1
        feed.replayed += len(batches)

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
                    self._apply(worker, feed, batch)
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
