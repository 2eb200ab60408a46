"""One writer's ring of records in a memory-mapped file, read by the other processes of one host.

The serving processes of ``serve --processes N`` share what must reach a sibling before
its next choice (decisions, requests in prefill) through memory rather than the bus. This
module owns the mechanism; what a record means belongs to its user (``host_ring``,
``host_prefill``).

One writer per ring: the writer clears the slot's sequence number, fills the slot, then
stamps the slot's sequence number, then the ring's head. A reader copies the slot and
checks the stamp again, so a slot overwritten while it was read is reported lost, never
delivered torn. A reader that fell more than a ring behind reports what it missed and
skips to the oldest slot still there. A restarted writer starts a new epoch; its readers
report the restart and start over from its first slot.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
from collections.abc import Callable, ItemsView
from pathlib import Path

_HEAD = struct.Struct("<QQ")  # epoch, head (records written)
_STAMP = struct.Struct("<QI")  # sequence number, record bytes
HEADER_BYTES = 64
REOPEN_EVERY = 256  # polls between two attempts to open a sibling's ring not there yet


Buffer = mmap.mmap | bytearray  # a ring's memory: the mapped file, or any buffer in tests and tools


def ring_bytes(slots: int, slot_bytes: int) -> int:
    return HEADER_BYTES + slots * slot_bytes


def _close(memory: Buffer) -> None:
    if isinstance(memory, mmap.mmap):
        with contextlib.suppress(BufferError):
            memory.close()


class RingWriter:
    """This process's ring: ``write`` puts one record into the next slot of ``memory``
    (the mapped file ``create`` makes, or any writable buffer of ``ring_bytes``)."""

    def __init__(self, memory: Buffer, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.room = slot_bytes - _STAMP.size  # the longest record a slot holds
        self._map = memory
        self._epoch = secrets.randbits(63) | 1
        self.head = 0
        _HEAD.pack_into(self._map, 0, self._epoch, 0)

    @classmethod
    def create(cls, path: Path, slots: int, slot_bytes: int) -> RingWriter:
        """A ring in the file at ``path`` (made, or taken over from a previous writer)."""
        size = ring_bytes(slots, slot_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            return cls(mmap.mmap(fd, size), slots, slot_bytes)
        finally:
            os.close(fd)

    def slot_at(self, n: int) -> int:
        """Where record ``n`` (counted from 1) lives in the file."""
        return HEADER_BYTES + ((n - 1) % self.slots) * self.slot_bytes

    def write(self, *parts: bytes) -> None:
        """One record, the parts back to back; together at most ``room`` bytes."""
        size = sum(len(p) for p in parts)
        if size > self.room:
            raise ValueError(f"a record of {size} bytes does not fit a slot of {self.room}")
        n = self.head + 1
        at = self.slot_at(n)
        m = self._map
        _STAMP.pack_into(m, at, 0, 0)  # unstamped first: a reader copying the old body sees it change
        pos = at + _STAMP.size
        for part in parts:
            m[pos : pos + len(part)] = part
            pos += len(part)
        _STAMP.pack_into(m, at, n, size)
        self.head = n
        _HEAD.pack_into(m, 0, self._epoch, n)

    def close(self) -> None:
        _close(self._map)


class RingReader:
    """A sibling's ring as this process reads it: the mapping, its epoch and our cursor."""

    __slots__ = ("cursor", "epoch", "map", "room", "slot_bytes", "slots")

    def __init__(self, memory: Buffer, slots: int, slot_bytes: int) -> None:
        self.map = memory
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.room = slot_bytes - _STAMP.size
        self.epoch = 0
        self.cursor = 0

    @classmethod
    def open(cls, path: Path, slots: int, slot_bytes: int) -> RingReader | None:
        """The ring at ``path``, or None while its writer has not made it yet."""
        size = ring_bytes(slots, slot_bytes)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < size:
                return None
            return cls(mmap.mmap(fd, size, prot=mmap.PROT_READ), slots, slot_bytes)
        finally:
            os.close(fd)

    def drain(
        self, record: Callable[[bytes], object], lost: Callable[[int], object], restarted: Callable[[], object]
    ) -> int:
        """Deliver every record written since the last drain, in order, to ``record``;
        ``lost(k)`` where k records went unread (overwritten first, or rewritten while
        read), ``restarted()`` when the writer started a new epoch. Returns the records
        delivered."""
        m = self.map
        epoch, head = _HEAD.unpack_from(m, 0)
        if epoch != self.epoch:
            if self.epoch:
                restarted()
            self.epoch, self.cursor = epoch, 0
        if head <= self.cursor:
            return 0
        first = self.cursor + 1
        if head - first >= self.slots:
            lost(head - self.slots + 1 - first)
            first = head - self.slots + 1
        delivered = 0
        for n in range(first, head + 1):
            at = HEADER_BYTES + ((n - 1) % self.slots) * self.slot_bytes
            seq, size = _STAMP.unpack_from(m, at)
            body = at + _STAMP.size
            data = bytes(m[body : body + min(size, self.room)])
            if seq != n or _STAMP.unpack_from(m, at)[0] != n or size > self.room:
                lost(1)
                continue
            record(data)
            delivered += 1
        self.cursor = head
        return delivered

    def close(self) -> None:
        _close(self.map)


class SiblingRings:
    """The rings of one kind that this process's siblings write, opened as they appear."""

    def __init__(self, path_of: Callable[[int], Path], index: int, count: int, slots: int, slot_bytes: int) -> None:
        self.path_of = path_of
        self.index = index
        self.count = count
        self.slots = slots
        self.slot_bytes = slot_bytes
        self._readers: dict[int, RingReader] = {}
        self._polls = 0

    def readers(self) -> ItemsView[int, RingReader]:
        """The siblings' rings open now (by sibling index); looks for missing ones every
        ``REOPEN_EVERY`` calls, from the first."""
        self._polls += 1
        if len(self._readers) < self.count - 1 and (self._polls - 1) % REOPEN_EVERY == 0:
            for i in range(self.count):
                if i != self.index and i not in self._readers:
                    reader = RingReader.open(self.path_of(i), self.slots, self.slot_bytes)
                    if reader is not None:
                        self._readers[i] = reader
        return self._readers.items()

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
