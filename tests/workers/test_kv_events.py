"""Workers' KV-cache events into the cache_aware trees (workers/kv_events.py): batches
applied in order, a sequence gap resets the worker's share, the page size learned from
stored blocks, one subscription per cache_aware worker, the feed following its pool's
policy when a flush replaces it, and a worker without the RPC left alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.kv_blocks import WorkerBlocks
from gateway.proto import common_pb2
from gateway.workers.kv_events import FeedState, KvEventFeeder, apply_batch, learn_page_size
from gateway.workers.transport import CallCode, WorkerCallError
from gateway.workers.worker import PAGE_SIZE_UNKNOWN
from tests.fake_transport import MODEL, FakeTransport, fleet


def _stored(seq: int, *blocks: tuple[int, list[int]], parent: int | None = None, size: int = 2) -> common_pb2.KvEventBatch:
    stored: dict[str, Any] = {"blocks": [{"block_hash": h, "token_ids": ids, "block_size": size} for h, ids in blocks]}
    if parent is not None:
        stored["parent_block_hash"] = parent
    return common_pb2.KvEventBatch(sequence_number=seq, events=[{"stored": stored}])


def _removed(seq: int, *hashes: int) -> common_pb2.KvEventBatch:
    return common_pb2.KvEventBatch(sequence_number=seq, events=[{"removed": {"block_hashes": list(hashes)}}])


def _feed() -> FeedState:
    policy = CacheAwarePolicy()
    return FeedState(WorkerBlocks(policy.tree(MODEL), "w1"))


def test_batches_store_and_remove_blocks_in_order() -> None:
    feed = _feed()
    apply_batch(feed, _stored(1, (11, [1, 2]), (12, [3, 4])))
    apply_batch(feed, _stored(2, (13, [5, 6]), parent=12))
    assert len(feed.blocks) == 3 and (feed.last_sequence, feed.batches) == (2, 2)
    apply_batch(feed, _removed(3, 13))
    assert len(feed.blocks) == 2 and feed.blocks.stats.removed_blocks == 1
    apply_batch(feed, common_pb2.KvEventBatch(sequence_number=4, events=[{"cleared": {}}]))
    assert len(feed.blocks) == 0 and feed.blocks.stats.clears == 1
    apply_batch(feed, common_pb2.KvEventBatch(sequence_number=99))  # a load-only record: nothing applied
    assert feed.last_sequence == 4 and feed.batches == 4


def test_a_numbered_batch_left_without_events_still_moves_the_sequence_on() -> None:
    """A ZMQ publisher numbers every batch, also one whose events were all another medium's
    (left out): the next batch is no gap, so no reset."""
    feed = _feed()
    apply_batch(feed, _stored(1, (11, [1, 2])), numbered=True)
    apply_batch(feed, common_pb2.KvEventBatch(sequence_number=2), numbered=True)
    apply_batch(feed, _stored(3, (12, [3, 4]), parent=11), numbered=True)
    assert feed.blocks.stats.resets == 0 and len(feed.blocks) == 2 and feed.last_sequence == 3
    apply_batch(feed, common_pb2.KvEventBatch(sequence_number=7), numbered=True)  # 4-6 lost: the gap is seen
    assert feed.blocks.stats.resets == 1 and len(feed.blocks) == 0 and feed.last_sequence == 7


def test_a_sequence_gap_resets_the_workers_share_first() -> None:
    feed = _feed()
    apply_batch(feed, _stored(1, (11, [1, 2])))
    apply_batch(feed, _stored(5, (21, [7, 8])))  # 2-4 were lost
    assert feed.blocks.stats.resets == 1 and len(feed.blocks) == 1
    described = feed.describe()
    assert described["last_sequence"] == 5 and described["resets"] == 1 and described["blocks"] == 1


async def test_the_page_size_is_learned_only_when_the_worker_did_not_say() -> None:
    f = await fleet(FakeTransport("grpc://w1:1"))
    worker = f.worker("w1:1")
    worker.info.page_size_source = PAGE_SIZE_UNKNOWN
    learn_page_size(worker, common_pb2.KvEventBatch(events=[{"removed": {"block_hashes": [1]}}]))
    assert worker.info.page_size_source == PAGE_SIZE_UNKNOWN
    learn_page_size(worker, _stored(1, (11, [1] * 16), size=16))
    assert (worker.info.page_size, worker.info.page_size_source) == (16, "kv_events")
    worker.info.page_size_source = "server_args"
    learn_page_size(worker, _stored(2, (12, [1] * 32), size=32))
    assert worker.info.page_size == 16  # a reported page size is kept


async def test_the_feeder_subscribes_cache_aware_workers_and_follows_the_registry() -> None:
    served = asyncio.Event()
    t1, t2 = FakeTransport("grpc://w1:1"), FakeTransport("grpc://w2:1")
    starts: list[int] = []

    def events(start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        starts.append(start_sequence_number)

        async def stream() -> AsyncIterator[common_pb2.KvEventBatch]:
            yield _stored(1, (11, [1, 2]))
            yield _stored(2, (12, [3, 4]), parent=11)
            served.set()
            await asyncio.Event().wait()  # the stream stays open until cancelled

        return stream()

    def unimplemented(start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        async def stream() -> AsyncIterator[common_pb2.KvEventBatch]:
            raise WorkerCallError(CallCode.UNIMPLEMENTED, "no kv events")
            yield common_pb2.KvEventBatch()  # pragma: no cover

        return stream()

    t1.subscribe_kv_events = events  # type: ignore[method-assign]
    t2.subscribe_kv_events = unimplemented  # type: ignore[method-assign]
    f = await fleet(t1, t2, policy="cache_aware")
    feeder = KvEventFeeder(f.registry, f.router, retry_s=0.001)
    feeder.start()
    feeder.start()  # idempotent
    try:
        await asyncio.wait_for(served.wait(), 5)
        for _ in range(20):
            if feeder.feeds["w2:1"].stopped:
                break
            await asyncio.sleep(0)
        one, two = feeder.feeds["w1:1"], feeder.feeds["w2:1"]
        assert one.connected and one.last_sequence == 2 and len(one.blocks) == 2 and starts == [0]
        assert two.stopped and not two.connected and two.last_error == "UNIMPLEMENTED: no kv events"
        await f.registry.remove("w1:1", drain_timeout_s=0)
        assert "w1:1" not in feeder.feeds
    finally:
        await feeder.close()


async def test_events_after_the_policies_are_replaced_reach_the_new_tree() -> None:
    """A flush through the gateway makes fresh policies (Router.reset_policies): the events
    that follow, on the same stream, must teach the new policy's tree, not the old one's."""
    t = FakeTransport("grpc://w1:1")
    batches: asyncio.Queue[common_pb2.KvEventBatch] = asyncio.Queue()
    applied = asyncio.Event()

    def events(start_sequence_number: int = 0) -> AsyncIterator[common_pb2.KvEventBatch]:
        async def stream() -> AsyncIterator[common_pb2.KvEventBatch]:
            while True:
                yield await batches.get()
                applied.set()

        return stream()

    async def send(batch: common_pb2.KvEventBatch) -> None:
        applied.clear()
        await batches.put(batch)
        await asyncio.wait_for(applied.wait(), 5)
        await asyncio.sleep(0)  # the batch is applied before the stream asks for the next

    def held(ids: list[int]) -> int:
        policy = f.router.policy(MODEL, "regular")
        assert isinstance(policy, CacheAwarePolicy)
        return policy.tree(MODEL).match(ids).per_worker.get("w1:1", 0)

    t.subscribe_kv_events = events  # type: ignore[method-assign]
    f = await fleet(t, policy="cache_aware")
    feeder = KvEventFeeder(f.registry, f.router, retry_s=0.001)
    feeder.start()
    try:
        await send(_stored(1, (11, [1, 2]), (12, [3, 4])))
        assert held([1, 2, 3, 4]) == 4
        f.router.reset_policies()  # what POST /flush_cache does once every worker flushed
        await send(common_pb2.KvEventBatch(sequence_number=2, events=[{"cleared": {}}]))
        await send(_stored(3, (21, [5, 6]), (22, [7, 8])))
        assert held([5, 6, 7, 8]) == 4 and held([1, 2, 3, 4]) == 0
        assert feeder.feeds["w1:1"].rebinds == 1 and feeder.feeds["w1:1"].describe()["rebinds"] == 1
    finally:
        await feeder.close()


async def test_no_subscription_where_the_policy_keeps_no_tree() -> None:
    t = FakeTransport("grpc://w1:1")
    f = await fleet(t, policy="round_robin")
    feeder = KvEventFeeder(f.registry, f.router)
    feeder.start()
    assert feeder.feeds == {}
    await feeder.close()


async def test_no_subscription_for_an_engine_with_dp_ranks() -> None:
    t = FakeTransport("grpc://w1:1", server_args={"dp_size": 2})
    f = await fleet(t, policy="cache_aware")
    feeder = KvEventFeeder(f.registry, f.router)
    feeder.start()
    assert feeder.feeds == {} and len(f.registry.all()) == 2  # one stream per engine cannot feed two ranks' shares
    await feeder.close()
