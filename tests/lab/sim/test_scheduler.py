"""Continuous batching in simulated time: step costs, chunked prefill, caps, KV admission."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from gateway.proto import sglang_scheduler_pb2_grpc as pb_grpc
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.worker import SimWorker

from .conftest import PROMPT, address, by_index, cfg, collect, request


async def run_requests(
    worker_config, prompts: list[list[int]], max_new: int
) -> tuple[SimWorker, list, dict]:
    """Send all prompts at once; return the worker, the completes and observed peaks."""
    async with SimFleet.start(1, worker_config) as fleet:
        w = fleet.workers[0]
        peaks = {"running": 0, "used": 0}
        inner = w.scheduler.after_step

        def observe() -> None:
            peaks["running"] = max(peaks["running"], w.scheduler.num_running)
            peaks["used"] = max(peaks["used"], w.cache.used_tokens)
            w.cache.check_invariants()
            assert inner is not None
            inner()

        w.scheduler.after_step = observe
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            results = await asyncio.gather(
                *(
                    collect(stub, request(p, rid=f"r{i}", max_new=max_new))
                    for i, p in enumerate(prompts)
                )
            )
        completes = [by_index(r)[0].complete for r in results]
        return w, completes, peaks


async def test_step_costs_add_up_in_simulated_time() -> None:
    # time_scale 0: the simulated clock runs, nothing sleeps.
    config = cfg(step_base_s=0.002, prefill_token_s=0.001, decode_seq_s=0.0005, time_scale=0.0)
    w, (c,), _ = await run_requests(config, [PROMPT], max_new=5)
    assert c.completion_tokens == 5
    # Step 1 prefills 40 tokens and emits token 1; steps 2-5 decode one sequence each.
    assert w.counters.steps == 5
    assert w.counters.busy_seconds == pytest.approx(5 * 0.002 + 40 * 0.001 + 4 * 0.0005)


async def test_time_scale_sleeps_the_step_cost() -> None:
    config = cfg(step_base_s=0.02, time_scale=1.0)
    t0 = time.monotonic()
    w, _, _ = await run_requests(config, [PROMPT], max_new=5)
    wall = time.monotonic() - t0
    assert w.counters.busy_seconds == pytest.approx(0.1)
    assert wall >= 0.095  # at least the simulated time was slept


async def test_chunked_prefill_budget() -> None:
    config = cfg(chunked_prefill_size=16, prefill_token_s=0.001, time_scale=0.0)
    prompt = list(range(3000, 3100))  # 100 tokens: 7 steps at 16 per step
    w, (c,), _ = await run_requests(config, [prompt], max_new=1)
    assert w.counters.steps == 7 and w.counters.prefill_tokens == 100
    assert w.counters.busy_seconds == pytest.approx(0.1)
    assert c.completion_tokens == 1


async def test_prefix_cache_saves_prefill_time() -> None:
    config = cfg(prefill_token_s=0.001, time_scale=0.0)
    async with SimFleet.start(1, config) as fleet:
        w = fleet.workers[0]
        async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
            stub = pb_grpc.SglangSchedulerStub(ch)
            prompt = list(range(3000, 3200))
            await collect(stub, request(prompt, max_new=1))
            first = w.counters.busy_seconds
            await collect(stub, request(prompt, max_new=1))
            second = w.counters.busy_seconds - first
    assert first == pytest.approx(0.2)
    assert second == pytest.approx((200 - 192) * 0.001)  # 12 whole pages were cached


async def test_max_running_requests_caps_the_batch() -> None:
    prompts = [[i, *PROMPT] for i in range(6)]
    # 3 ms steps so that the requests overlap however the arrivals are spread.
    w, completes, peaks = await run_requests(
        cfg(max_running_requests=2, step_base_s=0.003), prompts, max_new=30
    )
    assert peaks["running"] == 2
    assert all(c.completion_tokens == 30 for c in completes)
    assert w.counters.finished == 6


async def test_admission_waits_for_kv_capacity_and_evicts() -> None:
    # Each request needs 100 prompt + 60 output slots; the pool holds 256 tokens.
    config = cfg(kv_capacity_tokens=256, page_size=16)
    prompts = [list(range(5000 + 1000 * i, 5100 + 1000 * i)) for i in range(5)]
    w, completes, peaks = await run_requests(config, prompts, max_new=60)
    assert peaks["running"] == 1 and peaks["used"] <= 256
    assert all(c.completion_tokens == 60 for c in completes)
    assert w.cache.evicted_tokens > 0
    assert (
        w.cache.protected_tokens == 0 and w.cache.private_tokens == 0 and w.scheduler.reserved == 0
    )
    w.cache.check_invariants()


async def test_zero_cost_worker_keeps_many_streams_going() -> None:
    prompts = [[i, *PROMPT] for i in range(40)]
    w, completes, _ = await run_requests(cfg(), prompts, max_new=50)
    assert sum(c.completion_tokens for c in completes) == 2000 == w.counters.generated_tokens


async def test_free_steps_give_what_step_by_step_running_gives() -> None:
    """A worker whose steps cost nothing runs them back to back (decoding each sequence to
    its end in one go); its outputs, finishes, cache hits, KV state and token counts are
    those of the same worker stepping one token at a time (a simulated cost, not slept)."""
    prompts = [[i % 3, *PROMPT, i] for i in range(12)]  # three shared prefixes
    mixed = dict(eos_probability=0.2, kv_capacity_tokens=1024)  # early stops, evictions

    async def run(config) -> tuple[SimWorker, list, list]:
        async with SimFleet.start(1, config) as fleet:
            w = fleet.workers[0]
            async with grpc.aio.insecure_channel(address(fleet.urls[0])) as ch:
                stub = pb_grpc.SglangSchedulerStub(ch)
                first = [by_index(await collect(stub, request(p, rid=f"a{i}", max_new=40)))[0].complete
                         for i, p in enumerate(prompts)]  # fmt: skip
                # then all at once: the sequences share steps
                streams = await asyncio.gather(*(
                    collect(stub, request(p, rid=f"b{i}", max_new=40, stream=True)) for i, p in enumerate(prompts)
                ))  # fmt: skip
                w.cache.check_invariants()
            return w, first, [by_index(s)[0] for s in streams]

    free, free_first, free_streams = await run(cfg(**mixed))
    assert free.scheduler.free_steps
    stepped, step_first, step_streams = await run(cfg(decode_seq_s=1e-6, **mixed))
    assert not stepped.scheduler.free_steps
    for a, b in zip(free_first, step_first, strict=True):
        assert (list(a.output_ids), a.finish_reason, a.cached_tokens, a.prompt_tokens) == (
            list(b.output_ids), b.finish_reason, b.cached_tokens, b.prompt_tokens)  # fmt: skip
    assert any(c.finish_reason == "stop" for c in free_first) and any(c.cached_tokens for c in free_first)
    for a, b in zip(free_streams, step_streams, strict=True):
        assert a.streamed_ids == b.streamed_ids and a.complete is not None and b.complete is not None
        assert a.complete.finish_reason == b.complete.finish_reason
        assert a.complete.completion_tokens == b.complete.completion_tokens
    for key in ("generated_tokens", "finished", "prompt_tokens"):
        assert getattr(free.counters, key) == getattr(stepped.counters, key), key
    assert free.cache.private_tokens == 0 and free.scheduler.reserved == 0
