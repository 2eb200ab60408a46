"""Decisions shared by the serving processes of one host through memory, with no bus hop.

In a burst each process of ``serve --processes N`` routes hundreds of requests before
its event loop gets to read the bus, so both place the first requests of a prefix
group blind and the group lands on two workers. So each process also writes every
decision's prompt into a ring of its own, a memory-mapped file in the set's run folder,
and just before each choice reads what its siblings wrote since it last looked and
applies it to the pool's policy like a bus decision. The bus still carries everything
else (loads, finishes, learned outputs, other hosts); a decision that arrives both ways
is inserted twice into the tree, which changes nothing. A ring decision carries no
prompt count, so the hot-prefix tracker counts it once, when the bus copy arrives.

One writer per ring: the writer clears the slot's sequence number, fills the slot, then
stamps the slot's sequence number, then the ring's head. A reader copies the slot and checks the stamp again, so a slot
overwritten while it was read is skipped (and counted), never applied torn. A reader
that fell more than a ring behind skips to the oldest slot still there. A restarted
writer starts a new epoch; its readers start over from its first slot.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.policies.base import Decision, RemoteDecision, RemoteEvent, RouteRequest
from gateway.policies.radix_tree import pack

SLOTS = 256  # decisions a ring keeps
SLOT_BYTES = 32 * 1024  # one decision: its header, names and up to ~8k tokens of prompt
_HEAD = struct.Struct("<QQ")  # epoch, head (decisions written)
_SLOT = struct.Struct("<QIH")  # sequence number, token bytes, name bytes
HEADER_BYTES = 64
RING_BYTES = HEADER_BYTES + SLOTS * SLOT_BYTES
MAX_NAME_BYTES = 1024
REOPEN_EVERY = 256  # polls between two attempts to open a sibling's ring not there yet


def ring_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"decisions-{index}.ring"


def _slot_at(n: int) -> int:
    return HEADER_BYTES + ((n - 1) % SLOTS) * SLOT_BYTES


@dataclass
class RingStats:
    written: int = 0
    applied: int = 0
    skipped: int = 0  # decisions for a worker, model or pool this process does not know (yet)
    overrun: int = 0  # decisions overwritten before this process read them
    truncated: int = 0  # prompts longer than a slot: their leading part went


class _Reader:
    """A sibling's ring as this process reads it: the mapping, its epoch and our cursor."""

    __slots__ = ("cursor", "epoch", "map")

    def __init__(self, m: mmap.mmap) -> None:
        self.map = m
        self.epoch = 0
        self.cursor = 0


RemoteTarget = Callable[[str, str, str], Callable[[RemoteEvent], object] | None]


class HostRing:
    """This process's ring (written at each dispatch) and its siblings' (read before each choice)."""

    def __init__(self, run_dir: Path, index: int, count: int, target: RemoteTarget) -> None:
        """``target(worker_id, model, pool)``: the pool policy's ``on_remote``, or None when
        this process does not know that worker in that model and pool."""
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.target = target
        self.stats = RingStats()
        self._map = self._create(ring_path(run_dir, index))
        self._epoch = secrets.randbits(63) | 1
        self._head = 0
        _HEAD.pack_into(self._map, 0, self._epoch, 0)
        self._readers: dict[int, _Reader] = {}
        self._polls = 0

    @staticmethod
    def _create(path: Path) -> mmap.mmap:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, RING_BYTES)
            return mmap.mmap(fd, RING_BYTES)
        finally:
            os.close(fd)

    # ------------------------------------------------------------ writing
    def dispatched(self, pool: str, request: RouteRequest, decision: Decision, packed: bytes | None = None) -> None:
        """A decision of this process: its prompt goes into the next slot of our ring."""
        tokens = packed if packed is not None else pack(request.token_ids)
        names = b"\0".join((decision.worker_id.encode(), request.model.encode(), pool.encode()))
        if len(names) > MAX_NAME_BYTES:
            return
        room = (SLOT_BYTES - _SLOT.size - len(names)) & ~3
        if len(tokens) > room:
            tokens = tokens[:room]
            self.stats.truncated += 1
        n = self._head + 1
        at = _slot_at(n)
        m = self._map
        _SLOT.pack_into(m, at, 0, 0, 0)  # unstamped first: a reader copying the old body sees it change
        body = at + _SLOT.size
        m[body : body + len(names)] = names
        m[body + len(names) : body + len(names) + len(tokens)] = tokens
        _SLOT.pack_into(m, at, n, len(tokens), len(names))
        self._head = n
        _HEAD.pack_into(m, 0, self._epoch, n)
        self.stats.written += 1

    def finished(self, pool: str, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None:
        """Finishes travel on the bus only."""

    def learned(
        self, pool: str, request: RouteRequest, worker_id: str, output_ids: Sequence[int], packed: bytes | None = None
    ) -> None:
        """Learned outputs travel on the bus only."""

    # ------------------------------------------------------------ reading
    def poll(self) -> int:
        """Apply every sibling decision written since the last poll; returns how many."""
        self._polls += 1
        if len(self._readers) < self.count - 1 and (self._polls - 1) % REOPEN_EVERY == 0:
            self._open_missing()
        applied = 0
        for reader in self._readers.values():
            applied += self._drain(reader)
        return applied

    def _open_missing(self) -> None:
        for i in range(self.count):
            if i == self.index or i in self._readers:
                continue
            path = ring_path(self.run_dir, i)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                if os.fstat(fd).st_size < RING_BYTES:
                    continue
                self._readers[i] = _Reader(mmap.mmap(fd, RING_BYTES, prot=mmap.PROT_READ))
            finally:
                os.close(fd)

    def _drain(self, reader: _Reader) -> int:
        m = reader.map
        epoch, head = _HEAD.unpack_from(m, 0)
        if epoch != reader.epoch:  # a new writer (restarted sibling): start over
            reader.epoch, reader.cursor = epoch, 0
        if head <= reader.cursor:
            return 0
        first = reader.cursor + 1
        if head - first >= SLOTS:
            self.stats.overrun += head - SLOTS + 1 - first
            first = head - SLOTS + 1
        applied = 0
        for n in range(first, head + 1):
            at = _slot_at(n)
            seq, ntok, nnames = _SLOT.unpack_from(m, at)
            body = at + _SLOT.size
            names = m[body : body + nnames]
            tokens = m[body + nnames : body + nnames + ntok]
            if seq != n or _SLOT.unpack_from(m, at)[0] != n or nnames > MAX_NAME_BYTES:
                self.stats.overrun += 1
                continue
            parts = names.split(b"\0")
            if len(parts) != 3 or not tokens:
                self.stats.overrun += 1
                continue
            wid, model, pool = (p.decode() for p in parts)
            target = self.target(wid, model, pool)
            if target is None:
                self.stats.skipped += 1
                continue
            target(RemoteDecision(wid, model, tokens))
            applied += 1
        reader.cursor = head
        self.stats.applied += applied
        return applied

    def close(self) -> None:
        for reader in self._readers.values():
            with contextlib.suppress(BufferError):
                reader.map.close()
        self._readers.clear()
        with contextlib.suppress(BufferError):
            self._map.close()
