"""Requests in prefill, shared by the serving processes of one host through memory.

The prefill gate (``pipeline.prefill_gate``) holds a request while another request
sharing its prefix is being prefilled on the chosen worker, so that the prefix is
computed once rather than once per request admitted into the same batch. Each process
of ``serve --processes N`` keeps its own gate, and in a burst each process sends the
first request of a prefix group it sees while its sibling's request of the same group
is still in prefill on that worker: the decision ring (``host_ring``) tells it where
the group went, not that its prefill is still under way. So each process also writes,
into a ring of its own, every request it sends (*sent*: its key, worker, the prompt
and the tokens predicted cached), every end of a prefill (*done*: the key; its first
token, or any other ending) and every end on the worker (*ended*: the key, when the
request's lease ends); its siblings read the rings before each gate check, and while a
request waits on a sibling's request, and keep those in their gate as they keep their
own.

The ring's mechanism is ``mmap_ring``'s, as for ``host_ring``; a record here is its kind,
the key, the tokens predicted cached, the prompt's length, the worker's name length, the
name and the packed prompt (a *done* and an *ended* have no name). A reader that lost
records (overwritten before it read them, or rewritten while read) or sees a restarted
writer drops everything it kept of that sibling: a lost *done* must not hold anyone (a
lost *sent* only misses a hold). A sibling's request still kept in prefill after
``max_age_s`` is dropped too (a request never ends in prefill longer than the gate's
longest hold without its holders timing out), and one still counted on its worker after
``max_flight_s`` (no worker call outlives its deadline).

What is kept is also summed per worker (``on_queued(worker_id, prompt tokens)`` at each
change): the whole prompt tokens the siblings have sent each worker with no first token
yet, which the routing cost subtracts from the worker's polled waiting figure as traffic
the set sent (``WorkerView.remote_queued_prompt_tokens``). And the siblings' requests on
each worker, sent and not ended, are counted (``on_in_flight(worker_id, requests)``): the
prefill gate's free-slot check needs the requests *on* the worker, and the bus's in-flight
figure also counts the requests a sibling holds in its own gate, which are not there yet
(counted as sent, they made a worker look full and let a follower go into its blocker's
batch). The bus carries the siblings' load too, but late in a burst; this is as fresh as
the last poll.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.sync.mmap_ring import RingReader, RingWriter, SiblingRings

SLOTS = 1024  # records a ring keeps (a sent, a done and an ended per request)
SLOT_BYTES = 16 * 1024  # one record: its header, the worker's name and up to ~4k tokens of prompt
_RECORD = struct.Struct("<BQIIH")  # kind, key, tokens predicted cached, prompt tokens, name bytes
SENT, DONE, ENDED = 1, 2, 3
MAX_NAME_BYTES = 1024
KEY_BITS = 40  # a sibling's key, within the remote key this process gives it


def prefill_ring_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"prefill-{index}.ring"


def host_set_id(run_dir: Path) -> str:
    """What the processes sharing ``run_dir``'s rings put on the bus to know each other
    (``Batch.host_set``): their queued prompts reach each other through the rings, fresher,
    and must not be counted again from the bus. The host and the folder, hashed: a run
    folder belongs to one set at a time."""
    key = f"{socket.gethostname()}\0{run_dir.resolve()}".encode()
    return hashlib.blake2b(key, digest_size=8).hexdigest()


@dataclass
class PrefillShareStats:
    sent: int = 0  # requests in prefill this process wrote
    heard: int = 0  # siblings' requests in prefill taken into this process's gate
    released: int = 0  # ... and released by their done
    dropped: int = 0  # ... and dropped unreleased (overrun, a restarted sibling, too old)
    overrun: int = 0  # records overwritten before this process read them
    ended: int = 0  # siblings' requests counted on their worker until their end was heard


class HostPrefill:
    """This process's ring of requests in prefill (written as they are sent and prefilled)
    and its siblings' (read by ``poll``), applied through two callbacks: ``on_sent(key,
    worker_id, prompt, cached)`` and ``on_done(key)``, with keys below zero (a sibling's
    request never takes a key of this process's own); the sums per worker through
    ``on_queued`` and ``on_in_flight``."""

    def __init__(
        self, run_dir: Path, index: int, count: int, *, on_sent: Callable[[int, str, bytes, int], object],
        on_done: Callable[[int], object], max_age_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
        on_queued: Callable[[str, int], object] = lambda worker_id, tokens: None,
        on_in_flight: Callable[[str, int], object] = lambda worker_id, requests: None, max_flight_s: float = 600.0,
    ) -> None:
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.on_sent = on_sent
        self.on_done = on_done
        self.on_queued = on_queued
        self.on_in_flight = on_in_flight
        self.max_age_s = max_age_s
        self.max_flight_s = max_flight_s
        self._clock = clock
        self.stats = PrefillShareStats()
        self._ring = RingWriter.create(prefill_ring_path(run_dir, index), SLOTS, SLOT_BYTES)
        self._siblings = SiblingRings(lambda i: prefill_ring_path(run_dir, i), index, count, SLOTS, SLOT_BYTES)
        # sibling -> remote key -> (when heard, worker, prompt tokens), in the order heard
        self._kept: dict[int, dict[int, tuple[float, str, int]]] = {}
        self._queued: dict[str, int] = {}  # worker -> prompt tokens of the kept requests on it
        # sibling -> remote key -> (when heard, worker) of every request sent and not ended, in the order heard
        self._flying: dict[int, dict[int, tuple[float, str]]] = {}
        self._in_flight: dict[str, int] = {}  # worker -> the siblings' requests on it
        self._expired_at = clock()

    def sent(self, key: int, worker_id: str, prompt: bytes, cached: int) -> None:
        """This process's request ``key`` (above zero) was sent to ``worker_id``: in prefill."""
        names = worker_id.encode()
        if not 0 < key < 1 << KEY_BITS or not names or len(names) > MAX_NAME_BYTES:
            return
        room = (self._ring.room - _RECORD.size - len(names)) & ~3
        tokens = min(len(prompt) >> 2, 0xFFFFFFFF)
        self._ring.write(_RECORD.pack(SENT, key, max(0, min(cached, 0xFFFFFFFF)), tokens, len(names)), names, prompt[:room])
        self.stats.sent += 1

    def done(self, key: int) -> None:
        """This process's request ``key`` got its first token or ended: no longer in prefill."""
        if 0 < key < 1 << KEY_BITS:
            self._ring.write(_RECORD.pack(DONE, key, 0, 0, 0))

    def ended(self, key: int) -> None:
        """This process's request ``key`` is no longer on its worker (its lease ended)."""
        if 0 < key < 1 << KEY_BITS:
            self._ring.write(_RECORD.pack(ENDED, key, 0, 0, 0))

    # ------------------------------------------------------------ reading
    def remote_key(self, sibling: int, key: int) -> int:
        return -(((sibling + 1) << KEY_BITS) | key)

    def poll(self) -> int:
        """Take every sibling record written since the last poll; returns how many."""
        taken = 0
        for index, reader in self._siblings.readers():
            taken += self._drain(index, reader)
        if taken or self._clock() - self._expired_at >= 1.0:
            self._expire()
        return taken

    def _drain(self, index: int, reader: RingReader) -> int:
        kept = self._kept.setdefault(index, {})
        flying = self._flying.setdefault(index, {})
        now = self._clock()

        def drop_all() -> None:
            for key, entry in kept.items():
                self._unqueue(entry)
                self.on_done(key)
            self.stats.dropped += len(kept)
            kept.clear()
            for _, wid in flying.values():
                self._fly(wid, -1)
            flying.clear()

        def lost(count: int) -> None:  # a lost record may have been a done: nothing kept can be trusted
            self.stats.overrun += count
            drop_all()

        def take(data: bytes) -> None:
            if len(data) < _RECORD.size:
                lost(1)
                return
            kind, key, cached, prompt_tokens, nnames = _RECORD.unpack_from(data, 0)
            rkey = self.remote_key(index, key)
            if kind == ENDED:
                gone = flying.pop(rkey, None)
                if gone is not None:
                    self._fly(gone[1], -1)
                    self.stats.ended += 1
                return
            if kind == DONE:
                entry = kept.pop(rkey, None)
                if entry is not None:
                    self._unqueue(entry)
                    self.on_done(rkey)
                    self.stats.released += 1
                return
            if kind != SENT:
                lost(1)
                return
            names = data[_RECORD.size : _RECORD.size + nnames]
            tokens = data[_RECORD.size + nnames :]
            if nnames > MAX_NAME_BYTES or len(names) != nnames:
                lost(1)
            elif tokens:
                wid = names.decode(errors="replace")
                old = kept.pop(rkey, None)
                if old is not None:
                    self._unqueue(old)
                entry = kept[rkey] = (now, wid, prompt_tokens)
                self._queue(entry, 1)
                was = flying.pop(rkey, None)
                if was is not None:
                    self._fly(was[1], -1)
                flying[rkey] = (now, wid)
                self._fly(wid, 1)
                self.on_sent(rkey, wid, tokens, cached)
                self.stats.heard += 1

        return reader.drain(take, lost, drop_all)

    def _queue(self, entry: tuple[float, str, int], sign: int) -> None:
        wid = entry[1]
        total = self._queued.get(wid, 0) + sign * entry[2]
        if total > 0:
            self._queued[wid] = total
        else:
            self._queued.pop(wid, None)
            total = 0
        self.on_queued(wid, total)

    def _unqueue(self, entry: tuple[float, str, int]) -> None:
        self._queue(entry, -1)

    def _fly(self, wid: str, sign: int) -> None:
        total = self._in_flight.get(wid, 0) + sign
        if total > 0:
            self._in_flight[wid] = total
        else:
            self._in_flight.pop(wid, None)
            total = 0
        self.on_in_flight(wid, total)

    def in_flight(self, worker_id: str) -> int:
        """The siblings' requests on ``worker_id``: sent and not ended (as last polled)."""
        return self._in_flight.get(worker_id, 0)

    def queued_prompt_tokens(self, worker_id: str) -> int:
        """Whole prompt tokens the siblings have in prefill on ``worker_id`` (as last polled)."""
        return self._queued.get(worker_id, 0)

    def _expire(self) -> None:
        now = self._expired_at = self._clock()
        cutoff = now - self.max_age_s
        for kept in self._kept.values():
            old = []
            for rkey, entry in kept.items():  # oldest first
                if entry[0] > cutoff:
                    break
                old.append(rkey)
            for rkey in old:
                self._unqueue(kept.pop(rkey))
                self.on_done(rkey)
            self.stats.dropped += len(old)
        cutoff = now - self.max_flight_s
        for flying in self._flying.values():
            old = []
            for rkey, (heard, _) in flying.items():  # oldest first
                if heard > cutoff:
                    break
                old.append(rkey)
            for rkey in old:
                self._fly(flying.pop(rkey)[1], -1)

    @property
    def kept(self) -> int:
        """Siblings' requests in prefill this process keeps now."""
        return sum(len(k) for k in self._kept.values())

    def close(self) -> None:
        self._siblings.close()
        self._ring.close()
