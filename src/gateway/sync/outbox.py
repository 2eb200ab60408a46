"""What this process tells the others: decisions, finishes and its own load, one batch per tick.

The outbox is synchronous and does no I/O: ``policy_tap.TappedPolicy`` feeds it from
the request path (a few appends), and ``bus.SyncBus`` drains it into one NATS message
per event-loop tick. Loads are absolute figures of this process's own work, read at
drain time, so a lost batch is healed by the next one for the same worker (or the
heartbeat's full list), and a request that starts and ends within one batch adds
nothing to its loads.

Every decision is numbered; what follows it for the same request refers to that number
instead of repeating it. A learned output (prompt + output, whole pages) is appended to
its decision when that is still in the pending batch (one message, one tree insert on
the other side) and otherwise sent as an extension: the decision's number and the
output's pages only. A finish names the decision it ends. Without a known decision
(tracking overflowed, sync started mid-request) both go out in full, as standalone
messages. KV events a process reads from an endpoint only it can bind go out as it applied
them, for its siblings' feeds of the same worker (``workers.kv_events``).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gateway.policies.base import Decision, RouteRequest
from gateway.policies.radix_tree import pack
from gateway.proto import common_pb2, sync_pb2
from gateway.sync.prefix_book import PrefixBook
from gateway.workers.load import WorkerLoad

REPLAY_DECISIONS = 256  # recent decisions kept to re-announce after a reconnect

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


_MAX_TRACKED = 1 << 16  # in-flight requests remembered for the uncached-prefill estimate
_MAX_REFS = 1 << 14  # recent decisions a learned output or finish can still refer to
Figures = tuple[int, int, int, int]  # in flight, queued uncached prefill tokens, running decode tokens, queued prompt tokens
_ZERO: Figures = (0, 0, 0, 0)


class _Ref:
    """A published decision a later message of the same request can refer to."""

    __slots__ = ("finished", "gen", "id", "index", "learned", "record", "tokens", "worker_id")

    def __init__(self, decision_id: int, worker_id: str, tokens: int, gen: int, index: int, record: list[Any]) -> None:
        self.id = decision_id
        self.worker_id = worker_id
        self.tokens = tokens  # tokens the decision (and any output merged into it) carries
        self.gen = gen  # the batch it is pending in (``Outbox._gen`` at the time)
        self.index = index  # its place in that batch's decisions
        self.record = record  # its entry in ``Outbox.recent`` (what a replay sends)
        self.learned = False
        self.finished = False


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
        book: PrefixBook | None = None,
        host_set: str = "",
    ) -> None:
        """``loads(worker_id)`` is this process's own load on a worker (None: gone);
        ``on_pending`` is called when the first event of a tick arrives (the bus wakes);
        ``book``: send shared prefixes by reference (``--sync-encoding blocks``);
        ``host_set``: the same-host set whose siblings read this process's queued prompts
        from memory (``Batch.host_set``; empty outside one)."""
        self.origin = origin
        self.host_set = host_set
        self.book = book
        # [worker, model, pool, wire tokens, prompt tokens, predicted cached, id] of recent decisions
        self.recent: deque[list[Any]] = deque(maxlen=REPLAY_DECISIONS)
        self._loads = loads
        self._page_size = page_size
        self._clock_ns = clock_ns
        self._on_pending = on_pending
        self._seq = 0
        self._gen = 0  # batches taken so far: a _Ref with this gen is still pending
        self._next_id = 0
        self._refs: dict[object, _Ref] = {}  # request key -> its decision (insertion order: oldest first)
        self._batch = sync_pb2.Batch()  # the tick's decisions and finishes, built in place
        self._dirty: set[str] = set()
        self._sent: dict[str, Figures] = {}  # last figures published per worker (absent: zero)
        self._flight: dict[object, tuple[str, int, int]] = {}  # request -> (worker, prompt, predicted cached)
        self._sums: dict[str, list[int]] = {}  # worker -> [prompt, predicted cached] of its in-flight requests

    def __bool__(self) -> bool:
        b = self._batch
        return bool(b.decisions or b.finishes or b.kv_events or self._dirty)

    def _wake(self) -> None:
        if not self:
            self._on_pending()

    def _add(self, batch: sync_pb2.Batch, record: list[Any]) -> None:
        """One decision into ``batch``: its leading blocks by reference when the book has them."""
        wid, model, pool, wire, prompt, predicted, did = record
        book = self.book
        if book is not None:
            ref, count, tail = book.encode(wire)
            if count:
                batch.decisions.add(
                    worker_id=wid, model=model, pool=pool, tokens=tail, prompt_tokens=prompt, predicted_cached=predicted,
                    decided_unix_ns=self._clock_ns(), id=did, prefix_hash=ref, prefix_blocks=count, block_tokens=book.block_tokens,
                )
                return
        batch.decisions.add(
            worker_id=wid, model=model, pool=pool, tokens=wire, prompt_tokens=prompt, predicted_cached=predicted,
            decided_unix_ns=self._clock_ns(), id=did,
        )

    def dispatched(self, pool: str, request: RouteRequest, decision: Decision, packed: bytes | None = None) -> None:
        """``packed``: the prompt as the policy packed it (saves packing it again)."""
        self._wake()
        wid = decision.worker_id
        tokens = page_aligned(pack(request.token_ids) if packed is None else packed, self._page_size(wid))
        self._next_id += 1
        record = [wid, request.model, pool, wire_tokens(tokens), len(request.token_ids), decision.predicted_cached_tokens, self._next_id]
        self.recent.append(record)
        key = request.request_id or id(request)
        refs = self._refs
        refs.pop(key, None)
        refs[key] = _Ref(self._next_id, wid, len(tokens) >> 2, self._gen, len(self._batch.decisions), record)
        if len(refs) > _MAX_REFS:
            del refs[next(iter(refs))]
        self._add(self._batch, record)
        self._dirty.add(wid)
        self._untrack(key)
        prompt = len(request.token_ids)
        entry = (wid, prompt, min(prompt, decision.predicted_cached_tokens))
        self._flight[key] = entry
        s = self._sums.setdefault(wid, [0, 0])
        s[0] += entry[1]
        s[1] += entry[2]
        if len(self._flight) > _MAX_TRACKED:
            self._untrack(next(iter(self._flight)))

    def learned(
        self, pool: str, request: RouteRequest, worker_id: str, output_ids: Sequence[int], packed: bytes | None = None
    ) -> None:
        """What a worker now caches beyond a prompt (prompt + output, learned on finish), so
        the others' trees also count the output in the worker's share (its budget and
        evictions follow the worker's real cache). Not tracked as in-flight load; nothing is
        sent when the output completes no page beyond the prompt (the prompt went out with
        its decision). Merged into the decision while that is pending, else an extension of
        it; standalone (the whole sequence, no prompt count) when the decision is unknown."""
        prompt_tokens = len(request.token_ids)
        page = self._page_size(worker_id)
        n = (prompt_tokens + len(output_ids)) // page * page
        if n <= prompt_tokens:
            return
        self._wake()
        tokens = (pack(request.token_ids) if packed is None else packed) + pack(output_ids[: n - prompt_tokens])
        key = request.request_id or id(request)
        ref = self._refs.get(key)
        if ref is None or ref.worker_id != worker_id or ref.learned or ref.record[1] != request.model or n <= ref.tokens:
            record = [worker_id, request.model, pool, wire_tokens(tokens), 0, 0, 0]
            self.recent.append(record)
            self._add(self._batch, record)
            return
        ref.learned = True
        wire = wire_tokens(tokens)
        more = wire[ref.tokens << 2 :]
        if self.book is not None:
            self.book.learn(wire)  # its pages are on the bus now, wherever they went
        ref.record[3] = wire  # replays carry the whole sequence
        if ref.gen == self._gen:
            self._batch.decisions[ref.index].tokens += more
        else:
            self._batch.decisions.add(extends=ref.id, tokens=more)
        ref.tokens = n
        if ref.finished:
            del self._refs[key]

    def _untrack(self, key: object) -> None:
        entry = self._flight.pop(key, None)
        if entry is not None:
            s = self._sums[entry[0]]
            s[0] -= entry[1]
            s[1] -= entry[2]
            if s[0] <= 0:
                del self._sums[entry[0]]

    def replay(self) -> sync_pb2.Batch | None:
        """The recent decisions again (after a reconnect), in a fresh epoch of the book so
        that whoever missed the originals can resolve them."""
        if not self.recent:
            return None
        if self.book is not None:
            self.book.new_epoch()
        batch = sync_pb2.Batch(origin=self.origin, replay=True, sent_unix_ns=self._clock_ns())
        for record in self.recent:
            self._add(batch, record)
        return batch

    def finished(self, pool: str, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None:
        self._wake()
        key = request.request_id or id(request)
        self._untrack(key)
        ref = self._refs.get(key)
        if ref is not None and ref.worker_id == worker_id:
            self._batch.finishes.add(decision=ref.id, cached_tokens=max(0, cached_tokens), success=success)
            ref.finished = True
            if ref.learned:
                del self._refs[key]
        else:
            self._batch.finishes.add(
                worker_id=worker_id, model=request.model, pool=pool, cached_tokens=max(0, cached_tokens), success=success,
            )
        self._dirty.add(worker_id)

    def kv_events(self, worker_id: str, batch: common_pb2.KvEventBatch, reset: bool) -> None:
        """A worker's KV-event batch as this process applied it (``reset``: its share reset
        first), for the processes that follow the endpoint this one binds."""
        self._wake()
        self._batch.kv_events.add(worker_id=worker_id, batch=batch, reset=reset)

    def kv_share_wanted(self, worker_id: str) -> None:
        """This process starts following the endpoint of ``worker_id`` that another reads: ask
        that one for the worker's share as it holds it."""
        self._wake()
        self._batch.kv_events.add(worker_id=worker_id, want_share=True)

    def load_changed(self, worker_id: str) -> None:
        self._wake()
        self._dirty.add(worker_id)

    def figures(self, worker_id: str) -> Figures:
        """This process's load on a worker as published: the queued prefill scaled by the
        uncached share of its in-flight prompts (what the others' cost formula adds), and
        whole (what the worker's polled waiting figure counts of it, which the others take
        out of that figure)."""
        load = self._loads(worker_id)
        if load is None:
            return _ZERO
        whole = queued = max(0, load.queued_prefill_tokens)
        s = self._sums.get(worker_id)
        if queued and s is not None and s[0] > 0:
            queued = round(queued * (1.0 - s[1] / s[0]))
        return (max(0, load.in_flight), queued, max(0, load.running_decode_tokens), whole)

    def envelope(self) -> sync_pb2.Batch:
        """A numbered batch with nothing in it yet: what a tick's batch was too large to carry
        goes in these, after it (the relayed KV events, ``sync.kv_split``)."""
        self._seq += 1
        return sync_pb2.Batch(origin=self.origin, seq=self._seq, sent_unix_ns=self._clock_ns(), host_set=self.host_set)

    def take(
        self, *, scan: Iterable[str] | None = None, full: Iterable[str] | None = None, goodbye: bool = False
    ) -> sync_pb2.Batch | None:
        """The tick's batch, or None if there is nothing to say. Loads are published when
        they differ from what was last sent. ``scan``: also look at these workers (a
        heartbeat; the batch is sent even if empty, to say this process is alive);
        ``full``: restate every non-zero figure (absent workers mean zero)."""
        if not self and scan is None and full is None and not goodbye:
            return None
        self._seq += 1
        batch, self._batch = self._batch, sync_pb2.Batch()
        batch.origin = self.origin
        batch.seq = self._seq
        batch.sent_unix_ns = self._clock_ns()
        batch.goodbye = goodbye
        batch.host_set = self.host_set
        if full is not None:
            self._sent = {}
            for wid in sorted(set(full) | self._dirty):
                f = self.figures(wid)
                if any(f):
                    self._sent[wid] = f
                    _add_load(batch, wid, f)
            batch.full_loads = True
        else:
            ids = self._dirty if scan is None else self._dirty | set(scan)
            for wid in sorted(ids):
                f = self.figures(wid)
                if f == self._sent.get(wid, _ZERO):
                    continue
                if any(f):
                    self._sent[wid] = f
                else:
                    self._sent.pop(wid, None)
                _add_load(batch, wid, f)
        self._dirty = set()
        self._gen += 1
        return batch


def _add_load(batch: sync_pb2.Batch, worker_id: str, f: Figures) -> None:
    batch.loads.add(
        worker_id=worker_id, in_flight=f[0], queued_uncached_prefill_tokens=f[1], running_decode_tokens=f[2],
        queued_prompt_tokens=f[3],
    )
