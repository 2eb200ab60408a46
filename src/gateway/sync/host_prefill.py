"""Requests in prefill, shared by the serving processes of one host through memory.

The prefill gate (``pipeline.prefill_gate``) holds a request while another request
sharing its prefix is being prefilled on the chosen worker, so that the prefix is
computed once rather than once per request admitted into the same batch. Each process
of ``serve --processes N`` keeps its own gate, and in a burst each process sends the
first request of a prefix group it sees while its sibling's request of the same group
is still in prefill on that worker: the decision ring (``host_ring``) tells it where
the group went, not that its prefill is still under way. So each process also writes,
into a ring of its own, every request it sends (*sent*: its key, worker, the prompt
and the tokens predicted cached) and every end of a prefill (*done*: the key; its first
token, or any other ending); its siblings read the rings before each gate check, and
while a request waits on a sibling's request, and keep those in their gate as they
keep their own.

The ring is written as ``host_ring``'s: one writer, the slot's sequence number cleared,
the slot filled, the number stamped, then the head; a reader checks the stamp again
after copying. A reader that fell behind (records overwritten before it read them) or
sees a restarted writer (a new epoch) drops everything it kept of that sibling: a lost
*done* must not hold anyone (a lost *sent* only misses a hold). A sibling's request
still kept after ``max_age_s`` is dropped too (a request never ends in prefill longer
than the gate's longest hold without its holders timing out).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SLOTS = 1024  # records a ring keeps (a sent and a done per request)
SLOT_BYTES = 16 * 1024  # one record: its header, the worker's name and up to ~4k tokens of prompt
_HEAD = struct.Struct("<QQ")  # epoch, head (records written)
_SLOT = struct.Struct("<QQIIH")  # sequence number, key, tokens predicted cached, token bytes, name bytes
HEADER_BYTES = 64
RING_BYTES = HEADER_BYTES + SLOTS * SLOT_BYTES
MAX_NAME_BYTES = 1024
REOPEN_EVERY = 256  # polls between two attempts to open a sibling's ring not there yet
KEY_BITS = 40  # a sibling's key, within the remote key this process gives it


def prefill_ring_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"prefill-{index}.ring"


def _slot_at(n: int) -> int:
    return HEADER_BYTES + ((n - 1) % SLOTS) * SLOT_BYTES


@dataclass
class PrefillShareStats:
    sent: int = 0  # requests in prefill this process wrote
    heard: int = 0  # siblings' requests in prefill taken into this process's gate
    released: int = 0  # ... and released by their done
    dropped: int = 0  # ... and dropped unreleased (overrun, a restarted sibling, too old)
    overrun: int = 0  # records overwritten before this process read them


class _Reader:
    __slots__ = ("cursor", "epoch", "index", "kept", "map")

    def __init__(self, index: int, m: mmap.mmap) -> None:
        self.index = index
        self.map = m
        self.epoch = 0
        self.cursor = 0
        self.kept: dict[int, float] = {}  # remote key -> when heard (in the order heard)


class HostPrefill:
    """This process's ring of requests in prefill (written as they are sent and prefilled)
    and its siblings' (read by ``poll``), applied through two callbacks: ``on_sent(key,
    worker_id, prompt, cached)`` and ``on_done(key)``, with keys below zero (a sibling's
    request never takes a key of this process's own)."""

    def __init__(
        self, run_dir: Path, index: int, count: int, *, on_sent: Callable[[int, str, bytes, int], object],
        on_done: Callable[[int], object], max_age_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.on_sent = on_sent
        self.on_done = on_done
        self.max_age_s = max_age_s
        self._clock = clock
        self.stats = PrefillShareStats()
        self._map = self._create(prefill_ring_path(run_dir, index))
        self._epoch = secrets.randbits(63) | 1
        self._head = 0
        _HEAD.pack_into(self._map, 0, self._epoch, 0)
        self._readers: dict[int, _Reader] = {}
        self._polls = 0
        self._expired_at = clock()

    @staticmethod
    def _create(path: Path) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, RING_BYTES)
            return mmap.mmap(fd, RING_BYTES)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ writing
    def _write(self, key: int, cached: int, names: bytes, tokens: bytes) -> None:
        n = self._head + 1
        at = _slot_at(n)
        m = self._map
        _SLOT.pack_into(m, at, 0, 0, 0, 0, 0)  # unstamped first: a reader copying the old body sees it change
        body = at + _SLOT.size
        m[body : body + len(names)] = names
        m[body + len(names) : body + len(names) + len(tokens)] = tokens
        _SLOT.pack_into(m, at, n, key, cached, len(tokens), len(names))
        self._head = n
        _HEAD.pack_into(m, 0, self._epoch, n)

    def sent(self, key: int, worker_id: str, prompt: bytes, cached: int) -> None:
        """This process's request ``key`` (above zero) was sent to ``worker_id``: in prefill."""
        names = worker_id.encode()
        if not 0 < key < 1 << KEY_BITS or not names or len(names) > MAX_NAME_BYTES:
            return
        room = (SLOT_BYTES - _SLOT.size - len(names)) & ~3
        self._write(key, max(0, min(cached, 0xFFFFFFFF)), names, prompt[:room])
        self.stats.sent += 1

    def done(self, key: int) -> None:
        """This process's request ``key`` got its first token or ended: no longer in prefill."""
        if 0 < key < 1 << KEY_BITS:
            self._write(key, 0, b"", b"")

    # ------------------------------------------------------------ reading
    def remote_key(self, sibling: int, key: int) -> int:
        return -(((sibling + 1) << KEY_BITS) | key)

    def poll(self) -> int:
        """Take every sibling record written since the last poll; returns how many."""
        self._polls += 1
        if len(self._readers) < self.count - 1 and (self._polls - 1) % REOPEN_EVERY == 0:
            self._open_missing()
        taken = 0
        for reader in self._readers.values():
            taken += self._drain(reader)
        if taken or self._clock() - self._expired_at >= 1.0:
            self._expire()
        return taken

    def _open_missing(self) -> None:
        for i in range(self.count):
            if i == self.index or i in self._readers:
                continue
            try:
                fd = os.open(prefill_ring_path(self.run_dir, i), os.O_RDONLY)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_size < RING_BYTES:
                    continue
                self._readers[i] = _Reader(i, mmap.mmap(fd, RING_BYTES, prot=mmap.PROT_READ))
            finally:
                os.close(fd)

    def _drop_all(self, reader: _Reader) -> None:
        for key in reader.kept:
            self.on_done(key)
        self.stats.dropped += len(reader.kept)
        reader.kept.clear()

    def _drain(self, reader: _Reader) -> int:
        m = reader.map
        epoch, head = _HEAD.unpack_from(m, 0)
        if epoch != reader.epoch:  # a new writer (restarted sibling): what it had in prefill is gone
            self._drop_all(reader)
            reader.epoch, reader.cursor = epoch, 0
        if head <= reader.cursor:
            return 0
        first = reader.cursor + 1
        if head - first >= SLOTS:  # fell behind: a done may be lost, so nothing kept can be trusted
            self.stats.overrun += head - SLOTS + 1 - first
            first = head - SLOTS + 1
            self._drop_all(reader)
        taken = 0
        now = self._clock()
        for n in range(first, head + 1):
            at = _slot_at(n)
            seq, key, cached, ntok, nnames = _SLOT.unpack_from(m, at)
            body = at + _SLOT.size
            names = m[body : body + nnames]
            tokens = m[body + nnames : body + nnames + ntok]
            if seq != n or _SLOT.unpack_from(m, at)[0] != n or nnames > MAX_NAME_BYTES:
                self.stats.overrun += 1  # rewritten while read: it may have been a done
                self._drop_all(reader)
                continue
            rkey = self.remote_key(reader.index, key)
            if nnames == 0:
                if reader.kept.pop(rkey, None) is not None:
                    self.on_done(rkey)
                    self.stats.released += 1
            elif tokens:
                reader.kept[rkey] = now
                self.on_sent(rkey, names.decode(errors="replace"), tokens, cached)
                self.stats.heard += 1
            taken += 1
        reader.cursor = head
        return taken

    def _expire(self) -> None:
        now = self._expired_at = self._clock()
        cutoff = now - self.max_age_s
        for reader in self._readers.values():
            old = []
            for rkey, heard in reader.kept.items():  # oldest first
                if heard > cutoff:
                    break
                old.append(rkey)
            for rkey in old:
                del reader.kept[rkey]
                self.on_done(rkey)
            self.stats.dropped += len(old)

    @property
    def kept(self) -> int:
        """Siblings' requests in prefill this process keeps now."""
        return sum(len(r.kept) for r in self._readers.values())

    def close(self) -> None:
        for reader in self._readers.values():
            with contextlib.suppress(BufferError):
                reader.map.close()
        self._readers.clear()
        with contextlib.suppress(BufferError):
            self._map.close()
