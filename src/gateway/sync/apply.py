"""What the others told us: remote decisions into policies, remote load into worker views.

Synchronous and I/O-free (the bus hands it each received ``Batch``), so it is tested
against fakes. A remote decision becomes ``policy.on_remote(RemoteDecision)``, which
``cache_aware`` applies to its tree exactly as a local dispatch; remote load is kept
per origin as the origin's absolute figures and summed into ``Worker.remote_load``,
which ``Worker.view()`` adds to the local load every policy reads, and the origins'
whole queued prompt tokens into ``Worker.peer_queued_prompt_tokens`` (what the worker's
polled waiting figure counts of their traffic) and their requests in flight into
``Worker.peer_in_flight`` (the prefill gate's free-slot check), except a same-host
sibling's, whose prefill ring gives them fresher (``host_set``). An origin that goes quiet
(``peer_timeout_s``) or says goodbye has its load forgotten.

Each origin's recent decisions are kept by number (a book handle and a short tail, not
the prompt) so that a learned output sent as an extension, or a finish naming its
decision, resolves without the prompt travelling again; one whose decision is unknown
here (joined late, batch lost, forgotten) is counted and dropped: the tree then misses
that output's pages until the worker's reported cache hits or KV events correct it.

KV-event batches another process read from an endpoint only it can bind are handed to
``on_kv_events`` (the KV-event feeder's ``relayed``), which applies them to the worker's
share where this process follows that endpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.policies.base import Policy, RemoteDecision, RemoteEvent, RemoteExtension, RemoteFinish
from gateway.proto import common_pb2, sync_pb2
from gateway.sync.outbox import native_tokens
from gateway.sync.prefix_book import PrefixBook
from gateway.workers.load import WorkerLoad
from gateway.workers.worker import Worker

log = logging.getLogger(__name__)

LAG_SAMPLES = 8192  # recent decision-to-tree lags kept for the benchmark
REFS_PER_PEER = 1 << 14  # decisions per origin a later extension or finish may refer to
REF_BYTES_PER_PEER = 8 << 20  # and the token bytes kept for them (only what the book cannot rebuild)


class PolicySource(Protocol):
    """The pipeline's router, as far as sync needs it (a Protocol: sync sits below pipeline)."""

    def policy(self, model: str, role: str) -> Policy: ...


class WorkerSource(Protocol):
    def get(self, worker_id: str) -> Worker | None: ...

    def all(self) -> list[Worker]: ...


# A remote decision as a later message of the same request refers to it: (worker, model,
# pool, tip, blocks, rest, mark): where it went, its tokens as the book's handle (the hash of
# its last full block and how many blocks that is) plus the tokens after them (all of them
# without a book), and what the policy returned for it (where its insert ended in the tree,
# so that the learned output continues from there). A plain tuple: cheap to make.
Known = tuple[str, str, str, int, int, bytes, object]


@dataclass
class Peer:
    """One remote origin: its last known per-worker load and sequence, and its recent
    decisions by number (oldest first out, bounded in count and in kept bytes)."""

    # worker -> (in flight, queued uncached prefill tokens, running decode tokens, queued prompt tokens)
    loads: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    sibling: bool = False  # of this process's same-host set: its queued prompts come through memory
    last_seq: int = 0
    last_seen: float = 0.0
    known: dict[int, Known] = field(default_factory=dict)
    known_bytes: int = 0

    def remember(self, decision_id: int, entry: Known) -> None:
        known = self.known
        if decision_id in known:  # a replay
            self.known_bytes -= len(known.pop(decision_id)[5])
        known[decision_id] = entry
        self.known_bytes += len(entry[5])
        while len(known) > REFS_PER_PEER or self.known_bytes > REF_BYTES_PER_PEER:
            self.known_bytes -= len(known.pop(next(iter(known)))[5])


@dataclass
class ApplyStats:
    batches: int = 0
    decisions: int = 0
    finishes: int = 0
    extensions: int = 0  # learned outputs applied as extensions of a known decision (also in decisions)
    skipped: int = 0  # decisions for workers this process does not know (yet)
    unresolved: int = 0  # decisions whose prefix reference (or extended decision) this process did not know
    unresolved_finishes: int = 0  # finishes of decisions this process did not know
    lost_batches: int = 0  # sequence gaps
    own: int = 0  # our own batches (the bus asks NATS for no echo; counted if one slips through)
    bad: int = 0  # undecodable messages
    kv_batches: int = 0  # KV-event batches other processes read from endpoints they bind


class Applier:
    def __init__(
        self,
        origin: str,
        router: PolicySource,
        workers: WorkerSource,
        *,
        peer_timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        clock_ns: Callable[[], int] = time.time_ns,
        on_lag: Callable[[list[float]], None] = lambda seconds: None,
        book: PrefixBook | None = None,
        host_set: str = "",
    ) -> None:
        """``book``: resolves prefix references (shared with this process's outbox);
        ``on_lag``: the decision-to-tree lags of one batch's decisions, in seconds;
        ``host_set``: this process's same-host set (empty outside one), whose members'
        queued prompt tokens are not summed here."""
        self.book = book
        self.host_set = host_set
        self.origin = origin
        self.router = router
        self.workers = workers
        self.peer_timeout_s = peer_timeout_s
        self._clock = clock
        self._clock_ns = clock_ns
        self._on_lag = on_lag
        self.peers: dict[str, Peer] = {}
        self.stats = ApplyStats()
        # (worker id, batch, reset): another process's KV events for a worker (set by the server)
        self.on_kv_events: Callable[[str, common_pb2.KvEventBatch, bool, int, int], object] | None = None
        self.on_kv_share_wanted: Callable[[str], object] | None = None  # a follower asks for a worker's share

    def apply_bytes(self, data: bytes) -> None:
        try:
            batch = sync_pb2.Batch.FromString(data)
        except Exception:  # a foreign or corrupt message on our subject must not stop the feed
            self.stats.bad += 1
            return
        self.apply(batch)

    def apply(self, batch: sync_pb2.Batch) -> None:
        st = self.stats
        if batch.origin == self.origin:
            st.own += 1
            return
        st.batches += 1
        peer = self.peers.get(batch.origin)
        if peer is None:
            peer = self.peers[batch.origin] = Peer()
            if self.book is not None:
                self.book.new_epoch()  # the newcomer may lack blocks we would refer to
        elif peer.last_seq and batch.seq > peer.last_seq + 1:
            st.lost_batches += batch.seq - peer.last_seq - 1
        if batch.seq:  # replays are unnumbered
            peer.last_seq = batch.seq
        peer.sibling = bool(self.host_set) and batch.host_set == self.host_set
        peer.last_seen = self._clock()
        stamps: list[int] | None = None if batch.replay else []
        for d in batch.decisions:
            if d.extends:  # extensions are not decisions of their own: no lag
                self._extension(d, peer)
            else:
                self._decision(d, peer)
                if stamps is not None and d.decided_unix_ns:
                    stamps.append(d.decided_unix_ns)
        if stamps:
            now = self._clock_ns()
            self._on_lag([max(0, now - t) / 1e9 for t in stamps])
        for kv in batch.kv_events:
            st.kv_batches += 1
            if kv.want_share:
                if self.on_kv_share_wanted is not None:
                    self.on_kv_share_wanted(kv.worker_id)
            elif self.on_kv_events is not None:
                self.on_kv_events(kv.worker_id, kv.batch, kv.reset, kv.part, kv.parts)
        for f in batch.finishes:
            if f.decision:
                k = peer.known.get(f.decision)
                if k is None:
                    st.unresolved_finishes += 1
                    continue
                wid, model, pool = k[0], k[1], k[2]
            else:
                wid, model, pool = f.worker_id, f.model, f.pool
            st.finishes += 1
            if not self.router.policy(model, pool).remote_finishes:
                continue  # the pool's policy learns nothing from them: no event built
            self._event(wid, model, pool, RemoteFinish(wid, model, f.cached_tokens, f.success))
        touched: set[str] = set()
        if batch.goodbye:
            touched.update(peer.loads)
            peer.loads.clear()
        elif batch.full_loads:
            touched.update(peer.loads)
            peer.loads = {lo.worker_id: _figures(lo) for lo in batch.loads}
            touched.update(peer.loads)
        else:
            for lo in batch.loads:
                touched.add(lo.worker_id)
                f = _figures(lo)
                if any(f):
                    peer.loads[lo.worker_id] = f
                else:
                    peer.loads.pop(lo.worker_id, None)
        if batch.goodbye:
            del self.peers[batch.origin]
        self._resum(touched)

    def _decision(self, d: sync_pb2.Decision, peer: Peer) -> None:
        wire = d.tokens
        book = self.book
        tip = blocks = 0
        if book is None:
            if d.prefix_blocks:
                self.stats.unresolved += 1
                return
        else:
            out = book.decode_tip(d.prefix_hash, d.prefix_blocks, wire, d.block_tokens or book.block_tokens)  # learns its blocks
            if out is None:
                self.stats.unresolved += 1
                return
            wire, tip, blocks = out
        wid, model, pool = d.worker_id, d.model, d.pool
        target = self._target(wid, model, pool)
        mark = None
        if target is None:
            self.stats.skipped += 1
        else:
            self.stats.decisions += 1
            mark = target(RemoteDecision(wid, model, native_tokens(wire), d.prompt_tokens, d.predicted_cached))
        if d.id:
            rest = wire[4 * book.block_tokens * blocks :] if book is not None else wire
            peer.remember(d.id, (wid, model, pool, tip, blocks, rest, mark))

    def _extension(self, d: sync_pb2.Decision, peer: Peer) -> None:
        """A learned output of a decision we know: its sequence continued by ``d.tokens``,
        inserted from where the decision's insert ended (its mark) when the policy can."""
        k = peer.known.get(d.extends)
        book = self.book
        wire: bytes | None
        more = d.tokens
        if k is None:
            wire = None
        elif book is None:
            wire = k[5] + more
        else:  # rebuilt from the book, which learns the output's blocks as the sender's did
            wire = book.decode(k[3], k[4], k[5] + more, book.block_tokens)
        if k is None or wire is None:
            self.stats.unresolved += 1
            return
        self.stats.extensions += 1
        target = self._target(k[0], k[1], k[2])
        if target is None:
            self.stats.skipped += 1
            return
        self.stats.decisions += 1
        target(RemoteExtension(k[0], k[1], k[6], native_tokens(more), native_tokens(wire)))

    def _target(self, worker_id: str, model: str, pool: str) -> Callable[[RemoteEvent], object] | None:
        """The pool policy's ``on_remote`` for an event on ``worker_id``, or None when this
        process does not know the worker (yet) in that model and pool (skipped)."""
        worker = self.workers.get(worker_id)
        if worker is None or worker.model != model or worker.role != pool:
            return None
        return self.router.policy(model, pool).on_remote

    target = _target  # public: same-host decisions (``host_ring``) are applied through it too

    def _event(self, worker_id: str, model: str, pool: str, event: RemoteEvent) -> bool:
        target = self._target(worker_id, model, pool)
        if target is None:
            return False
        target(event)
        return True

    def _resum(self, worker_ids: set[str]) -> None:
        for wid in worker_ids:
            worker = self.workers.get(wid)
            if worker is None:
                continue
            total = WorkerLoad()
            prompts = flying = 0
            for peer in self.peers.values():
                lo = peer.loads.get(wid)
                if lo is not None:
                    total.in_flight += lo[0]
                    total.queued_prefill_tokens += lo[1]
                    total.running_decode_tokens += lo[2]
                    if not peer.sibling:
                        prompts += lo[3]
                        flying += lo[0]
            worker.remote_load = total
            worker.peer_queued_prompt_tokens = prompts
            worker.peer_in_flight = flying

    def expire(self) -> list[str]:
        """Forget peers not heard from within ``peer_timeout_s``; returns their origins."""
        cutoff = self._clock() - self.peer_timeout_s
        gone = [o for o, p in self.peers.items() if p.last_seen < cutoff]
        touched: set[str] = set()
        for origin in gone:
            touched.update(self.peers.pop(origin).loads)
        self._resum(touched)
        return gone

    def forget_all(self) -> None:
        """The bus is gone: route on local knowledge only (remote load back to zero)."""
        touched = {w for p in self.peers.values() for w in p.loads}
        self.peers.clear()
        self._resum(touched)

    def remote_in_flight(self) -> int:
        return sum(lo[0] for p in self.peers.values() for lo in p.loads.values())


def _figures(lo: sync_pb2.WorkerLoad) -> tuple[int, int, int, int]:
    return (lo.in_flight, lo.queued_uncached_prefill_tokens, lo.running_decode_tokens, lo.queued_prompt_tokens)
