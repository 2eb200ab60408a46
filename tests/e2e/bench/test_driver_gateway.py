"""The driver through the real gateway (in-process uvicorn) over in-process simulated workers.

The figures the driver collects from usage must agree with what the simulated workers
counted themselves: that is what makes the benchmark's hit rate the workers' own word.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn

from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.app import create_app
from gateway.server.state import GatewayState
from gateway_lab.bench.driver import DriverConfig, RunResult, run_workload
from gateway_lab.bench.report import summarize
from gateway_lab.bench.workloads import (
    ChatConfig,
    GspConfig,
    Vocab,
    gsp,
    ideal_hit_rate,
    multi_turn_chat,
)
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet

FREE = SimConfig(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0, page_size=4)


@pytest.fixture
async def gateway(tmp_path) -> AsyncIterator[tuple[str, SimFleet]]:
    async with SimFleet.start(2, FREE) as fleet:
        config = GatewayConfig(server=ServerConfig(worker_urls=fleet.urls, tokenizer_cache_dir=str(tmp_path)))
        config.policy.policy = "cache_aware"
        state = GatewayState(config)
        await state.start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(state, manage_lifecycle=False),
                                               log_level="warning", lifespan="off", loop="none"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            for _ in range(500):
                if server.started:
                    break
                await asyncio.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}", fleet
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)
            await state.stop()


def _sim_totals(fleet: SimFleet) -> tuple[int, int, int]:
    stats = fleet.stats()
    return (sum(s["prompt_tokens"] for s in stats), sum(s["cached_tokens"] for s in stats),
            sum(s["requests"] for s in stats))


async def test_gsp_through_the_gateway_matches_the_workers_counts(gateway) -> None:
    url, fleet = gateway
    cfg = GspConfig(groups=3, prompts_per_group=4, system_tokens=64, question_tokens=8, output_tokens=5)
    workload = gsp(cfg, Vocab.from_tokenizer_dir())
    run = await run_workload(url, workload, DriverConfig(concurrency=4))
    assert all(r.ok for r in run.results), [r.error for r in run.results if not r.ok]
    for r in run.results:
        assert r.prompt_tokens == 72 and r.completion_tokens == 5  # exact lengths, ignore_eos
        assert r.worker_id and 0 < r.ttft_s <= r.latency_s  # type: ignore[operator]
    prompt, cached, requests = _sim_totals(fleet)
    assert (prompt, requests) == (12 * 72, 12)
    assert cached == sum(r.cached_tokens for r in run.results) > 0
    summary = summarize(run, ideal_hit_rate=ideal_hit_rate(workload, page_size=4))
    assert 0 < summary.hit_rate <= summary.ideal_hit_rate  # type: ignore[operator]
    assert summary.spread is not None and sum(summary.spread.per_worker.values()) == 12


async def test_text_prompts_and_chat_turns_through_the_gateway(gateway) -> None:
    url, _ = gateway
    vocab = Vocab.from_tokenizer_dir()
    text = gsp(GspConfig(groups=1, prompts_per_group=2, system_tokens=40, question_tokens=6,
                         output_tokens=3, text_prompts=True), vocab)
    run: RunResult = await run_workload(url, text, DriverConfig(concurrency=1))
    assert all(r.ok and r.prompt_tokens == 46 and r.completion_tokens == 3 for r in run.results)

    chat = multi_turn_chat(ChatConfig(conversations=2, turns=3, chat_system_tokens=30, user_tokens=5,
                                      reply_tokens=4), vocab)
    run = await run_workload(url, chat, DriverConfig(concurrency=2))
    assert all(r.ok for r in run.results), [r.error for r in run.results if not r.ok]
    assert all(r.completion_tokens == 4 and r.text for r in run.results)
    last_turns = [r for r in run.results if len(r.messages) == 6]
    assert len(last_turns) == 2
    by_sent = {repr(r.messages): r.text for r in run.results}
    for r in last_turns:
        assert r.messages[4] == {"role": "assistant", "content": by_sent[repr(r.messages[:4])]}
        assert r.cached_tokens > 0  # the conversation so far was cached by its worker
