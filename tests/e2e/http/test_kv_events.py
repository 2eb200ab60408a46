"""``serve --kv-events``: the cache_aware tree learns cache the gateway did not route, and evictions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.worker import Worker
from gateway_lab.sim.worker import SimWorker
from tests.e2e.http.conftest import Stack, StackOptions, start_stack

KV = {"kv_events": True}


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def held(stack: Stack, worker: Worker, ids: list[int]) -> int:
    policy = stack.state.router.policy(worker.model, "regular")
    assert isinstance(policy, CacheAwarePolicy)
    return policy.tree(worker.model).match(ids).per_worker.get(worker.id, 0)


async def direct(worker: Worker, ids: list[int], rid: str) -> None:
    """Generate on the worker over gRPC, bypassing the gateway's routing."""
    req = pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=pb.SamplingParams(temperature=0.0, max_new_tokens=1, n=1),
    )
    async for _ in worker.client.generate(req, timeout=10):
        pass


def prompt(seed: int, n: int = 200) -> list[int]:
    return [1000 + (seed * 7919 + i * 31) % 50000 for i in range(n)]


@pytest.mark.stack(workers=2, policy="cache_aware", server=KV, sim={"kv_capacity_tokens": 1024, "page_size": 16})
async def test_tree_learns_direct_requests_and_forgets_evictions(stack: Stack) -> None:
    a, b = sorted(stack.state.registry.all(), key=lambda w: w.id)
    await eventually(lambda: all(f.connected for f in stack.state.kv_events.feeds.values()) if stack.state.kv_events else False)
    p = prompt(1)
    await direct(b, p, "direct-1")
    # the tree now knows b holds p, though the gateway never routed it there
    await eventually(lambda: held(stack, b, p) == 192)
    assert held(stack, a, p) == 0

    # so the gateway sends p there, and the worker confirms the hit
    r = await stack.http.post("/generate", json={"input_ids": p, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200 and r.headers["x-worker-id"] == b.id
    assert r.json()["meta_info"]["cached_tokens"] == 192

    # other prompts sent straight to b push p out of its 1024-token cache: the tree forgets
    for i in range(2, 8):
        await direct(b, prompt(i, 300), f"direct-{i}")
    await eventually(lambda: held(stack, b, p) == 0)
    # p's removal and the last prompt's store are separate events: the store may come later
    await eventually(lambda: held(stack, b, prompt(7, 300)) == 288)
    feed = stack.state.kv_events.feeds[b.id]  # type: ignore[union-attr]
    assert feed.blocks.stats.removed_blocks > 0 and feed.blocks.stats.resets == 0

    # a flush clears b's share
    await b.client.flush_cache()
    await eventually(lambda: held(stack, b, prompt(7, 300)) == 0)
    assert feed.blocks.stats.clears == 1


@pytest.mark.stack(workers=1, policy="cache_aware", server=KV)
async def test_events_after_a_flush_through_the_gateway_still_teach_the_tree(stack: Stack) -> None:
    """POST /flush_cache makes fresh policies: the stream's later events reach the new tree."""
    (w,) = stack.state.registry.all()
    feeds = stack.state.kv_events.feeds  # type: ignore[union-attr]
    await eventually(lambda: feeds[w.id].connected)
    p, q = prompt(21), prompt(22)
    await direct(w, p, "before-flush")
    await eventually(lambda: held(stack, w, p) == 192)
    flushed = await stack.http.post("/flush_cache")
    assert flushed.status_code == 200 and flushed.json()["success"] is True
    await eventually(lambda: feeds[w.id].blocks.stats.clears == 1)
    assert held(stack, w, p) == 0
    await direct(w, q, "after-flush")
    await eventually(lambda: held(stack, w, q) == 192)
    assert held(stack, w, p) == 0 and feeds[w.id].rebinds == 1


@pytest.mark.stack(workers=1, policy="cache_aware", server=KV)
async def test_subscription_reconnects_to_a_restarted_worker(stack: Stack) -> None:
    (w,) = stack.state.registry.all()
    feeds = stack.state.kv_events.feeds  # type: ignore[union-attr]
    await eventually(lambda: feeds[w.id].connected)
    p, q = prompt(11), prompt(12)
    await direct(w, p, "before")
    await eventually(lambda: held(stack, w, p) == 192)

    old = stack.fleet.workers[0]
    port = old.port
    await old.kill()
    await eventually(lambda: not feeds[w.id].connected)
    fresh = SimWorker(old.config)
    await fresh.start("127.0.0.1", port)
    try:
        stack.fleet.workers[0] = fresh
        # the new worker has an empty cache: once its events arrive (sequence restarts
        # at 1) the old share is dropped and the new cache learned
        await eventually(lambda: feeds[w.id].connected, timeout=15)
        await direct(w, q, "after")
        await eventually(lambda: held(stack, w, q) == 192)
        assert held(stack, w, p) == 0
        assert feeds[w.id].blocks.stats.resets == 1 and feeds[w.id].connects >= 2
    finally:
        await fresh.stop()


@pytest.mark.stack(workers=2, policy="round_robin", server=KV)
async def test_no_subscription_without_a_tree(stack: Stack) -> None:
    assert stack.state.kv_events is not None and stack.state.kv_events.feeds == {}
    r = await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=1)
    assert r.choices


async def test_worker_without_kv_events_is_left_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gateway_lab.sim.servicer import SimServicer

    calls = 0

    async def unimplemented(self: SimServicer, request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
        nonlocal calls
        calls += 1
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "kv events are not configured")
        yield  # an async generator, like the real handler

    monkeypatch.setattr(SimServicer, "SubscribeKvEvents", unimplemented)
    opts = StackOptions(workers=1, policy="cache_aware", server=KV)
    async with start_stack(opts, tmp_path) as stack:
        feeder = stack.state.kv_events
        assert feeder is not None
        (w,) = stack.state.registry.all()
        feed = feeder.feeds[w.id]
        await eventually(lambda f=feed: f.stopped)  # type: ignore[misc]
        assert calls == 1 and "UNIMPLEMENTED" in feed.last_error
        r = await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=1)
        assert r.choices
