"""SubscribeKvEvents: stored/removed/cleared blocks with chained hashes, load records."""

from __future__ import annotations

import asyncio

import grpc

from gateway.proto import common_pb2
from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.radix_cache import block_hashes

from .conftest import PROMPT, address, by_index, cfg, collect, request


async def next_batch(call, timeout: float = 5.0) -> common_pb2.KvEventBatch:
    msg = await asyncio.wait_for(call.read(), timeout)
    assert msg is not grpc.aio.EOF
    return msg


async def next_event_batch(call) -> common_pb2.KvEventBatch:
    """The next batch that carries events (skipping load-only records)."""
    for _ in range(100):
        b = await next_batch(call)
        if not b.load.load_only:
            return b
    raise AssertionError("no event batch")


async def subscribe(stub: pb_grpc.SglangSchedulerStub, start: int = 0):
    """A subscription that is known to be live (its first load record arrived)."""
    call = stub.SubscribeKvEvents(
        common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start, load_records_before_first_batch=True
        )
    )
    first = await next_batch(call)
    assert first.load.load_only and first.sequence_number == 0 and first.load.sample == 1
    return call


def stored_blocks(batch: common_pb2.KvEventBatch) -> list[common_pb2.KvBlock]:
    return [b for e in batch.events if e.WhichOneof("data") == "stored" for b in e.stored.blocks]


async def test_stored_blocks_have_chained_hashes(stub: pb_grpc.SglangSchedulerStub) -> None:
    call = await subscribe(stub)
    out = by_index(await collect(stub, request(PROMPT, max_new=10)))[0].complete
    full = PROMPT + list(out.output_ids)  # 50 tokens: 3 whole pages
    expected = block_hashes(full, 16)

    prefill = await next_event_batch(call)  # the prompt's 2 whole pages, after prefill
    (ev,) = prefill.events
    assert not ev.stored.HasField("parent_block_hash")
    assert [b.block_hash for b in ev.stored.blocks] == expected[:2]
    assert [list(b.token_ids) for b in ev.stored.blocks] == [PROMPT[:16], PROMPT[16:32]]
    assert all(b.block_size == 16 for b in ev.stored.blocks)
    assert prefill.sequence_number == 1 and ev.event_id >= 1
    assert prefill.load.max_running_requests == 64 and not prefill.load.load_only

    finish = await next_event_batch(call)  # prompt + output: one more page
    (ev2,) = finish.events
    assert ev2.stored.parent_block_hash == expected[1]
    assert [b.block_hash for b in ev2.stored.blocks] == expected[2:3]
    assert list(ev2.stored.blocks[0].token_ids) == full[32:48]
    assert finish.sequence_number == 2 and finish.load.sample > prefill.load.sample
    call.cancel()


async def test_eviction_and_flush_events() -> None:
    async with SimFleet.start(1, cfg(kv_capacity_tokens=96, page_size=16)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            call = await subscribe(stub)
            stored: set[int] = set()
            removed: set[int] = set()
            for i in range(4):
                await collect(stub, request([i] * 40, max_new=4))
            # Each request stores 2 pages at prefill (and, for 44 tokens, none more);
            # the pool holds 96 tokens, so older prompts get evicted.
            for _ in range(100):
                if len(removed) >= 2 and len(stored) >= 8:
                    break
                b = await next_event_batch(call)
                for e in b.events:
                    kind = e.WhichOneof("data")
                    if kind == "stored":
                        stored.update(x.block_hash for x in e.stored.blocks)
                    elif kind == "removed":
                        removed.update(e.removed.block_hashes)
            assert removed and removed <= stored
            assert set(block_hashes([0] * 40, 16)) <= removed  # the least recently used went first
            assert fleet.workers[0].cache.evicted_tokens >= 32
            r = await stub.FlushCache(common_pb2.FlushCacheRequest())
            assert r.success
            b = await next_event_batch(call)
            assert [e.WhichOneof("data") for e in b.events] == ["cleared"]
            call.cancel()


async def test_load_heartbeats_and_resume() -> None:
    async with SimFleet.start(1, cfg(kv_events_load_interval_s=0.05)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            call = await subscribe(stub)
            beat = await next_batch(call)  # nothing happens: a heartbeat
            assert beat.load.load_only and beat.sequence_number == 0 and not beat.events
            assert beat.load.max_total_num_tokens == 65536 and beat.load.HasField("cache_hit_rate")
            await collect(stub, request(PROMPT, max_new=10))  # stores at prefill and at finish
            seqs = []
            for _ in range(100):
                b = await next_batch(call)
                if b.load.load_only:
                    assert b.sequence_number == (
                        seqs[-1] if seqs else 0
                    )  # repeats the last one sent
                else:
                    seqs.append(b.sequence_number)
                if len(seqs) == 2:
                    break
            assert seqs == [1, 2]
            call.cancel()
            # A late subscriber resuming from sequence 2 gets the kept batch first.
            late = stub.SubscribeKvEvents(
                common_pb2.SubscribeKvEventsRequest(start_sequence_number=2)
            )
            again = await next_batch(late)
            assert again.sequence_number == 2 and again.events
            late.cancel()


async def test_without_early_load_records_the_first_batch_comes_first() -> None:
    async with SimFleet.start(1, cfg(kv_events_load_interval_s=0.02)) as fleet:
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
            w = fleet.workers[0]
            for _ in range(200):  # bounded wait until the subscription is registered
                if w.kv_events.num_subscribers:
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)  # several heartbeat intervals pass silently
            await collect(stub, request(PROMPT, max_new=2))
            first = await next_batch(call)
            assert not first.load.load_only and first.sequence_number == 1
            call.cancel()
