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

The ring's mechanism (one writer, stamped slots, overruns, restarts) is ``mmap_ring``'s;
a record here is the names' length, the names (worker, model, pool) and the packed prompt.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.policies.base import Decision, RemoteDecision, RemoteEvent, RouteRequest
from gateway.policies.radix_tree import pack
from gateway.sync.mmap_ring import RingWriter, SiblingRings

SLOTS = 256  # decisions a ring keeps
SLOT_BYTES = 32 * 1024  # one decision: its header, names and up to ~8k tokens of prompt
_RECORD = struct.Struct("<H")  # name bytes
MAX_NAME_BYTES = 1024


def ring_path(run_dir: Path, index: int) -> Path:
    return run_dir / f"decisions-{index}.ring"


@dataclass
class RingStats:
    written: int = 0
    applied: int = 0
    skipped: int = 0  # decisions for a worker, model or pool this process does not know (yet)
    overrun: int = 0  # decisions overwritten before this process read them
    truncated: int = 0  # prompts longer than a slot: their leading part went


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
        self._ring = RingWriter.create(ring_path(run_dir, index), SLOTS, SLOT_BYTES)
        self._siblings = SiblingRings(lambda i: ring_path(run_dir, i), index, count, SLOTS, SLOT_BYTES)

    # ------------------------------------------------------------ writing
    def dispatched(self, pool: str, request: RouteRequest, decision: Decision, packed: bytes | None = None) -> None:
        """A decision of this process: its prompt goes into the next slot of our ring."""
        tokens = packed if packed is not None else pack(request.token_ids)
        names = b"\0".join((decision.worker_id.encode(), request.model.encode(), pool.encode()))
        if len(names) > MAX_NAME_BYTES:
            return
        room = (self._ring.room - _RECORD.size - len(names)) & ~3
        if len(tokens) > room:
            tokens = tokens[:room]
            self.stats.truncated += 1
        self._ring.write(_RECORD.pack(len(names)), names, tokens)
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
        before = self.stats.applied
        for _, reader in self._siblings.readers():
            reader.drain(self._apply, self._lost, _no_restart)
        return self.stats.applied - before

    def _lost(self, count: int) -> None:
        self.stats.overrun += count

    def _apply(self, data: bytes) -> None:
        if len(data) < _RECORD.size:
            self.stats.overrun += 1
            return
        (nnames,) = _RECORD.unpack_from(data, 0)
        names = data[_RECORD.size : _RECORD.size + nnames]
        tokens = data[_RECORD.size + nnames :]
        parts = names.split(b"\0")
        if nnames > MAX_NAME_BYTES or len(parts) != 3 or not tokens:
            self.stats.overrun += 1
            return
        wid, model, pool = (p.decode() for p in parts)
        target = self.target(wid, model, pool)
        if target is None:
            self.stats.skipped += 1
            return
        target(RemoteDecision(wid, model, tokens))
        self.stats.applied += 1

    def close(self) -> None:
        self._siblings.close()
        self._ring.close()


def _no_restart() -> None:
    """A restarted sibling's decisions stand: its new ones are read from its first slot."""
