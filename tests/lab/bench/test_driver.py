"""The load driver against a real HTTP server on loopback (the fake OpenAI streamer)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from gateway_lab.bench.driver import DriverConfig, run_workload
from gateway_lab.bench.workloads import (
    ChatConfig,
    GspConfig,
    RequestSpec,
    Vocab,
    Workload,
    gsp,
    multi_turn_chat,
)

from .fake_openai import FakeState, serve_fake

CFG = GspConfig(groups=3, prompts_per_group=4, system_tokens=30, question_tokens=5, output_tokens=4)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.from_tokenizer_dir()


async def test_gsp_run_collects_every_figure(vocab: Vocab) -> None:
    state = FakeState(token_delay_s=0.002)
    seen: list[int] = []
    async with serve_fake(state) as url:
        run = await run_workload(url, gsp(CFG, vocab), DriverConfig(concurrency=3), label="fake",
                                 on_result=lambda r: seen.append(r.index))
    assert run.label == "fake" and run.meta["model"] == "fake-model" and run.not_sent == 0
    assert sorted(seen) == list(range(12)) and [r.index for r in run.results] == list(range(12))
    assert state.max_in_flight <= 3
    for r in run.results:
        assert r.ok and r.error is None
        assert r.prompt_tokens == 35 and r.completion_tokens == 4
        assert 0 < r.ttft_s <= r.latency_s  # type: ignore[operator]
        assert r.worker_id in {"w0", "w1"}
        assert r.text.split() == [f"{r.worker_id}t{i}" for i in range(4)]
    assert sum(r.cached_tokens for r in run.results) > 0
    body = state.bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 4 and body["model"] == "fake-model"
    assert isinstance(body["prompt"], list) and len(body["prompt"]) == 35


async def test_chat_turns_resend_history_with_actual_replies(vocab: Vocab) -> None:
    state = FakeState()
    chat = multi_turn_chat(ChatConfig(conversations=2, turns=3, chat_system_tokens=4, user_tokens=3,
                                      reply_tokens=2), vocab)
    async with serve_fake(state) as url:
        run = await run_workload(url, chat, DriverConfig(concurrency=4, model="m"))
    assert all(r.ok for r in run.results) and len(run.results) == 6
    last = [r for r in run.results if len(r.messages) == 6]  # system, then u/a, u/a, u
    assert len(last) == 2
    def key(messages) -> str:
        return repr([sorted(m.items()) for m in messages])

    reply_to = {key(x.messages): x.text for x in run.results}
    for r in last:
        roles = [m["role"] for m in r.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        assert r.messages[4]["content"] == reply_to[key(r.messages[:4])]
        assert r.messages[2]["content"] == reply_to[key(r.messages[:2])]
    assert all(b["model"] == "m" for b in state.bodies)
    assert sum(r.cached_tokens for r in run.results) > 0  # later turns extend earlier prompts


async def test_errors_are_counted_and_the_run_goes_on() -> None:
    specs = (
        RequestSpec(endpoint="completions", max_tokens=3, prompt="fine prompt"),
        RequestSpec(endpoint="completions", max_tokens=3, prompt="please fail-http"),
        RequestSpec(endpoint="completions", max_tokens=3, prompt="please fail-stream"),
        RequestSpec(endpoint="completions", max_tokens=3, prompt="another fine prompt"),
    )
    async with serve_fake(FakeState()) as url:
        run = await run_workload(url, Workload("errs", specs), DriverConfig(concurrency=1))
    assert [r.ok for r in run.results] == [True, False, False, True]
    assert "HTTP 500" in run.results[1].error  # type: ignore[operator]
    assert run.results[2].error == "worker died"


async def test_bounded_by_request_count_and_wall_time(vocab: Vocab) -> None:
    w = gsp(CFG, vocab)
    async with serve_fake(FakeState()) as url:
        run = await run_workload(url, w, DriverConfig(concurrency=2, max_requests=5))
    assert run.planned == 5 and len(run.results) == 5 and run.not_sent == 0

    slow = FakeState(token_delay_s=0.5)
    async with serve_fake(slow) as url:
        t = time.perf_counter()
        run = await run_workload(url, w, DriverConfig(concurrency=2, duration_s=0.3))
        assert time.perf_counter() - t < 3
        for _ in range(100):  # the server sees the disconnects
            if slow.in_flight == 0:
                break
            await asyncio.sleep(0.02)
    assert len(run.results) == 2 and all(r.error == "cancelled" for r in run.results)
    assert run.not_sent == 10 and slow.in_flight == 0


async def test_cancelling_the_run_cancels_requests(vocab: Vocab) -> None:
    slow = FakeState(token_delay_s=0.5)
    async with serve_fake(slow) as url:
        task = asyncio.create_task(run_workload(url, gsp(CFG, vocab), DriverConfig(concurrency=3)))
        for _ in range(200):
            if slow.in_flight == 3:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if slow.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert slow.in_flight == 0


async def test_timed_arrivals_are_respected(vocab: Vocab) -> None:
    w = gsp(CFG, vocab).head(4)
    timed = Workload("timed", tuple(dataclasses.replace(s, arrival_s=0.05 * i) for i, s in enumerate(w)))
    async with serve_fake(FakeState()) as url:
        run = await run_workload(url, timed, DriverConfig(concurrency=8))
        poisson = await run_workload(url, w, DriverConfig(concurrency=8, request_rate=200.0))
    assert all(r.ok for r in run.results + poisson.results)
    for r in run.results:
        assert r.start_s >= 0.05 * r.index - 1e-3
    assert sorted(r.start_s for r in poisson.results) == [r.start_s for r in poisson.results]


async def test_request_ids_are_sent_and_the_start_is_kept(vocab: Vocab) -> None:
    """A request's id is its index through ``request_ids`` (joined later with the gateway's
    decision and the worker's timeline); without it no id is sent."""
    state = FakeState()
    before = time.perf_counter()
    async with serve_fake(state) as url:
        run = await run_workload(url, gsp(CFG, vocab), DriverConfig(concurrency=1), request_ids=lambda i: f"x-{i}")
        plain = await run_workload(url, gsp(CFG, vocab), DriverConfig(concurrency=1, max_requests=2))
    assert state.request_ids[:12] == [f"x-{i}" for i in range(12)]
    assert state.request_ids[12:] == [None, None]
    assert before <= run.meta["t0"] <= plain.meta["t0"] <= time.perf_counter()
