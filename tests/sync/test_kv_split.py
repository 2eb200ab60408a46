"""Relayed KV-event batches packed into bus messages within a payload limit (sync/kv_split.py):
small ones grouped whole, a batch too large alone cut into numbered parts whose events, applied
in order, store and remove exactly what the whole batch does (a run's parent chain kept)."""

from __future__ import annotations

import pytest

from gateway.proto import common_pb2, sync_pb2
from gateway.sync.kv_split import cut, pack


def _batch(seq: int, blocks: int, *, size: int = 16, removed: int = 0) -> common_pb2.KvEventBatch:
    b = common_pb2.KvEventBatch(sequence_number=seq, timestamp=2.5, dp_rank=1)
    st = b.events.add(event_id=7).stored
    st.parent_block_hash = -5
    st.medium = "GPU"
    for i in range(blocks):
        st.blocks.add(block_hash=1000 + i, token_ids=[20_000 + i * size + j for j in range(size)], block_size=size)
    b.events.add().cleared.SetInParent()
    if removed:
        b.events.add().removed.block_hashes.extend(range(-removed, 0))
    return b


def _flat(parts: list[sync_pb2.KvEvents]) -> tuple[list[tuple[int | None, int]], list[int], int]:
    """(parent, block) of every stored block in order; removed hashes; clears, over all parts."""
    stored: list[tuple[int | None, int]] = []
    removed: list[int] = []
    clears = 0
    for p in parts:
        for ev in p.batch.events:
            kind = ev.WhichOneof("data")
            if kind == "stored":
                parent = ev.stored.parent_block_hash if ev.stored.HasField("parent_block_hash") else None
                for blk in ev.stored.blocks:
                    stored.append((parent, blk.block_hash))
                    parent = blk.block_hash
                assert ev.stored.medium == "GPU" and ev.event_id == 7
            elif kind == "removed":
                removed.extend(ev.removed.block_hashes)
            else:
                clears += 1
    return stored, removed, clears


def test_a_batch_too_large_is_cut_into_parts_that_add_up_to_it() -> None:
    whole = sync_pb2.KvEvents(worker_id="h:1@1", batch=_batch(9, 400, removed=3000), reset=True)
    limit = 8 << 10
    parts = cut(whole, limit)
    assert len(parts) > 2 and all(p.ByteSize() <= limit for p in parts)
    assert [p.part for p in parts] == list(range(len(parts))) and {p.parts for p in parts} == {len(parts)}
    assert [p.reset for p in parts] == [True] + [False] * (len(parts) - 1)
    assert {(p.worker_id, p.batch.sequence_number, p.batch.dp_rank, p.batch.timestamp) for p in parts} == {("h:1@1", 9, 1, 2.5)}
    assert _flat(parts) == _flat([whole])
    # Every block keeps its tokens.
    tokens = [t for p in parts for ev in p.batch.events if ev.HasField("stored") for blk in ev.stored.blocks for t in blk.token_ids]
    assert tokens == [t for blk in whole.batch.events[0].stored.blocks for t in blk.token_ids]


def test_small_batches_go_whole_grouped_within_the_limit() -> None:
    items = [sync_pb2.KvEvents(worker_id=f"w{i}", batch=_batch(i + 1, 20)) for i in range(10)]
    big = sync_pb2.KvEvents(worker_id="big", batch=_batch(1, 300))
    limit = 6 << 10
    groups = pack([*items[:5], big, *items[5:]], limit)
    flat = [kv for g in groups for kv in g]
    assert [kv.worker_id for kv in flat if kv.worker_id != "big"] == [kv.worker_id for kv in items]  # order kept
    assert all(kv.parts == 0 for kv in flat if kv.worker_id != "big")
    assert all(sum(kv.ByteSize() + 16 for kv in g) <= limit for g in groups)
    assert all(len(g) == 1 for g in groups if g[0].worker_id == "big") and len([kv for kv in flat if kv.worker_id == "big"]) > 1
    assert len(groups) < len(flat)  # whole ones share messages


def test_a_single_block_larger_than_the_limit_is_an_error() -> None:
    one = sync_pb2.KvEvents(worker_id="w", batch=_batch(1, 1, size=2000))
    with pytest.raises(ValueError, match="does not fit"):
        cut(one, 1024)


async def test_a_follower_older_than_parts_loses_that_share_and_believes_nothing_false() -> None:
    """Mixed versions (a process that predates parts follows one that cuts them): the older one
    takes each continuation as its batch's number again, a gap, and resets its share; a
    continuation's runs hang from pages it no longer holds and are not placed. No error, and
    every page it still holds is one the worker has; the next batch follows with no gap. A
    process of this version, given the same messages with their part numbers, holds them all."""
    from gateway.policies.cache_aware import CacheAwarePolicy
    from gateway.policies.kv_blocks import WorkerBlocks
    from gateway.workers.kv_events import FeedState, KvEventFeeder
    from tests.fake_transport import FakeTransport, fleet

    size, blocks = 16, 400
    first = common_pb2.KvEventBatch(sequence_number=1)
    first.events.add().stored.blocks.add(block_hash=1, token_ids=list(range(size)), block_size=size)
    big = common_pb2.KvEventBatch(sequence_number=2)
    run = big.events.add().stored
    run.parent_block_hash = 1
    for i in range(blocks):
        run.blocks.add(block_hash=100 + i, token_ids=[size + i * size + j for j in range(size)], block_size=size)
    parts = cut(sync_pb2.KvEvents(worker_id="w", batch=big), 8 << 10)
    after = common_pb2.KvEventBatch(sequence_number=3)
    after.events.add().stored.blocks.add(block_hash=2, token_ids=[9] * size, block_size=size)
    assert len(parts) > 2
    held = {}
    for older in (True, False):
        f = await fleet(FakeTransport("grpc://127.0.0.1:1", server_args={"page_size": size}), policy="cache_aware")
        worker = f.registry.all()[0]
        policy = f.router.policy(worker.model, worker.role)
        assert isinstance(policy, CacheAwarePolicy)
        feeder = KvEventFeeder(f.registry, f.router)
        feed = feeder.feeds[worker.id] = FeedState(WorkerBlocks(policy.tree(worker.model), worker.id), follower=True)
        feeder.relayed(worker.id, first, False)
        for p in parts:
            if older:  # as its applier called it: (worker, batch, reset), the part fields unknown to it
                feeder.relayed(worker.id, p.batch, p.reset)
            else:
                feeder.relayed(worker.id, p.batch, p.reset, p.part, p.parts)
        resets = feed.blocks.stats.resets
        feeder.relayed(worker.id, after, False)
        assert feed.blocks.stats.resets == resets and feed.last_sequence == 3 and feed.errors == 0
        held[older] = (resets, set(feed.blocks._blocks))
    assert held[False] == (0, {1, 2, *range(100, 100 + blocks)})
    resets, pages = held[True]
    assert resets == len(parts) - 1 and pages == {2}  # the batch's pages and the one before it lost, none invented
