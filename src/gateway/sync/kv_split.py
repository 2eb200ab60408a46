"""Relayed KV-event batches packed into bus messages no larger than the bus takes.

The process that reads an engine's publisher hands every batch to its siblings over the
sync bus (``workers.kv_events``). NATS refuses a message above its server's payload limit
(1 MiB by default), and one engine step storing a long prefill's pages is larger than that:
sent in the tick's message, it was dropped with everything else in it. So a tick whose
message would be too large carries its KV events in messages of their own, packed whole
where they fit; a batch that alone does not fit is cut into parts (``KvEvents.part`` of
``parts``), each a valid batch with the same number: a stored run's blocks cut between two
blocks (the second run's parent the first's last block), a removal's hashes cut anywhere.
The follower applies the parts in order as one batch (``KvEventFeeder.relayed``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.proto import common_pb2, sync_pb2

# What a message's envelope and each repeated entry's own framing may add to the sizes counted.
_ENTRY_OVERHEAD = 16
_EVENT = 48  # an event's own fields (its id, a run's parent, medium and tier), at most
_HASH = 11  # one removed block's hash, as a varint at most


def pack(items: Iterable[sync_pb2.KvEvents], limit: int) -> list[list[sync_pb2.KvEvents]]:
    """``items`` in order, in groups whose encoded size stays within ``limit`` bytes each;
    an item larger than that on its own is cut into parts (``parts`` > 1), each alone."""
    if limit < 256:
        raise ValueError(f"a bus message limit of {limit} bytes cannot carry a KV-event batch")
    groups: list[list[sync_pb2.KvEvents]] = []
    current: list[sync_pb2.KvEvents] = []
    used = 0
    for item in items:
        size = item.ByteSize() + _ENTRY_OVERHEAD
        if size > limit:
            if current:
                groups.append(current)
                current, used = [], 0
            groups.extend([part] for part in cut(item, limit))
            continue
        if used + size > limit and current:
            groups.append(current)
            current, used = [], 0
        current.append(item)
        used += size
    if current:
        groups.append(current)
    return groups


def cut(item: sync_pb2.KvEvents, limit: int) -> list[sync_pb2.KvEvents]:
    """One relayed batch as parts of at most ``limit`` bytes, in order, each numbered as the batch."""
    budget = limit - _ENTRY_OVERHEAD - len(item.worker_id) - 64  # the part's header: id, number, timestamp, rank
    src = item.batch
    parts: list[common_pb2.KvEventBatch] = []
    cur = _empty(src)
    used = 0

    def close() -> None:
        nonlocal cur, used
        parts.append(cur)
        cur, used = _empty(src), 0

    for ev in src.events:
        kind = ev.WhichOneof("data")
        if kind == "cleared":
            if used + _EVENT > budget:
                close()
            cur.events.add().CopyFrom(ev)
            used += _EVENT
            continue
        head = common_pb2.KvCacheEvent()  # the event's other fields, carried by each of its pieces
        head.CopyFrom(ev)
        if kind == "stored":
            del head.stored.blocks[:]
            parent: int | None = ev.stored.parent_block_hash if ev.stored.HasField("parent_block_hash") else None
            run: common_pb2.KvBlocksStored | None = None
            for block in ev.stored.blocks:
                size = block.ByteSize() + _ENTRY_OVERHEAD
                if size + _EVENT > budget:
                    raise ValueError(f"one KV block of {block.block_size} tokens does not fit a bus message of {limit} bytes")
                if used + size > budget or run is None:
                    if used + size + _EVENT > budget:
                        close()
                    piece = cur.events.add()
                    piece.CopyFrom(head)
                    run = piece.stored
                    if parent is not None:
                        run.parent_block_hash = parent
                    used += _EVENT
                run.blocks.add().CopyFrom(block)
                used += size
                parent = block.block_hash
        elif kind == "removed":
            del head.removed.block_hashes[:]
            gone: common_pb2.KvBlocksRemoved | None = None
            for h in ev.removed.block_hashes:
                if used + _HASH > budget or gone is None:
                    if used + _HASH + _EVENT > budget:
                        close()
                    piece = cur.events.add()
                    piece.CopyFrom(head)
                    gone = piece.removed
                    used += _EVENT
                gone.block_hashes.append(h)
                used += _HASH
    if cur.events or not parts:
        parts.append(cur)
    n = len(parts)
    return [
        sync_pb2.KvEvents(worker_id=item.worker_id, batch=p, reset=item.reset and i == 0, parts=n if n > 1 else 0, part=i)
        for i, p in enumerate(parts)
    ]


def _empty(src: common_pb2.KvEventBatch) -> common_pb2.KvEventBatch:
    return common_pb2.KvEventBatch(sequence_number=src.sequence_number, timestamp=src.timestamp, dp_rank=src.dp_rank)


__all__ = ["cut", "pack"]
