"""The official openai client -> gateway -> simulated SGLang *HTTP* workers (``http://``).

The same checks the gRPC fleet passes: chat and completions, whole and streamed,
usage with cached tokens, cache-aware routing on the token ids the worker caches,
and a worker that fails or dies mid-stream (the stream resumes elsewhere)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from gateway.server.config import GatewayConfig, ServerConfig
from gateway.server.http.app import create_app
from gateway.server.http.guard import http_server_config
from gateway.server.state import GatewayState
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.http_server import SimHttpWorker, http_fleet
from tests.e2e.push_spy import record_pushes

ZERO_COST = dict(step_base_s=0.0, prefill_token_s=0.0, decode_seq_s=0.0, time_scale=0.0)


@dataclass
class HttpStack:
    workers: list[SimHttpWorker]
    state: GatewayState
    client: openai.AsyncOpenAI
    http: httpx.AsyncClient

    @property
    def model(self) -> str:
        return self.state.catalog.names()[0]


@contextlib.asynccontextmanager
async def http_stack(tmp_path: Any, *, workers: int = 2, policy: str = "round_robin",
                     sim: dict[str, Any] | None = None, api: str = "sglang",
                     stall_timeout_s: float | None = None) -> AsyncIterator[HttpStack]:
    async with http_fleet(workers, SimConfig(**{**ZERO_COST, **(sim or {})}), api=api) as fleet:
        # vLLM's server does not say where its tokenizer is (SGLang's does): give it, as operators do.
        tokenizer = str(fleet[0].worker.vocab.path) if api == "vllm" else None
        config = GatewayConfig(server=ServerConfig(
            worker_urls=[w.url for w in fleet], tokenizer_cache_dir=str(tmp_path / "tok"), tokenizer_path=tokenizer,
        ))
        config.policy.policy = policy
        if stall_timeout_s is not None:
            config.dispatch.stall_timeout_s = stall_timeout_s
        state = GatewayState(config)
        await state.start()
        app = create_app(state, manage_lifecycle=False)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        server = uvicorn.Server(http_server_config(app, state.config.http))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
        http = httpx.AsyncClient(base_url=url, timeout=30)
        try:
            yield HttpStack(fleet, state, client, http)
        finally:
            await client.close()
            await http.aclose()
            server.should_exit = True
            await task
            await state.stop()


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def idle(stack: HttpStack) -> bool:
    return all(w.load.in_flight == 0 for w in stack.state.registry.all())


async def test_workers_report_their_kind_and_serve_chat_whole_and_streamed(tmp_path: Any) -> None:
    async with http_stack(tmp_path) as stack:
        listed = (await stack.http.get("/workers")).json()
        rows = listed["workers"] if isinstance(listed, dict) else listed
        assert {row["kind"] for row in rows} == {"sglang/http"}
        assert all(row["token_ids"] for row in rows)

        whole = await stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=12,
            extra_body={"ignore_eos": True},
        )
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage is not None and whole.usage.completion_tokens == 12
        assert whole.choices[0].message.content

        stream = await stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
        assert finish == "length" and text
        assert usage is not None and usage.completion_tokens == 12
        assert usage.prompt_tokens == whole.usage.prompt_tokens
        assert idle(stack)


async def test_completions_report_the_workers_cached_tokens(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=1) as stack:
        prompt = "a long shared preamble about routing on tokens " * 8
        first = await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=4)
        second = await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=4)
        assert first.usage is not None and second.usage is not None
        assert second.usage.prompt_tokens == first.usage.prompt_tokens
        details = second.usage.prompt_tokens_details
        assert details is not None and details.cached_tokens
        page = stack.workers[0].worker.config.page_size
        # the worker cached the whole prompt but the last partial page
        assert details.cached_tokens >= (second.usage.prompt_tokens // page - 1) * page

        streamed = await stack.client.completions.create(
            model=stack.model, prompt=prompt, max_tokens=4, stream=True, stream_options={"include_usage": True},
        )
        usage = None
        async for chunk in streamed:
            usage = chunk.usage or usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == details.cached_tokens


async def _hit_rate(tmp_path: Any, policy: str) -> float:
    """Three shared prefixes, four requests each, over two workers: the share of prompt
    tokens the workers served from their own caches."""
    async with http_stack(tmp_path / policy, workers=2, policy=policy) as stack:
        groups = [f"system prompt number {g}: " + "you are a careful assistant. " * 20 for g in range(3)]
        for rep in range(4):
            for g, system in enumerate(groups):
                await stack.client.completions.create(
                    model=stack.model, prompt=system + f"question {rep} of group {g}", max_tokens=2,
                )
        counters = [w.worker.counters for w in stack.workers]
        return sum(c.cached_tokens for c in counters) / sum(c.prompt_tokens for c in counters)


async def test_cache_aware_routing_sends_a_shared_prefix_to_the_worker_that_holds_it(tmp_path: Any) -> None:
    # cache_aware misses each prefix once (3 of 12 requests); round robin over two workers
    # meets each prefix cold on both (6 of 12): the workers' own counters tell them apart.
    cache_aware = await _hit_rate(tmp_path, "cache_aware")
    round_robin = await _hit_rate(tmp_path, "round_robin")
    assert cache_aware > 0.6, cache_aware
    assert cache_aware > round_robin + 0.15, (cache_aware, round_robin)


async def test_a_worker_failing_mid_stream_is_resumed_on_another(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=2) as stack:
        stack.workers[0].worker.faults.fail_after_tokens = 4
        for _ in range(2):  # round robin: one of the two lands on the failing worker
            stream = await stack.client.completions.create(
                model=stack.model, prompt="hello there", max_tokens=20, stream=True,
                extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
            )
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            assert usage is not None and usage.completion_tokens == 20
        await eventually(lambda: idle(stack))


async def test_a_worker_killed_mid_stream_leaves_a_whole_answer_or_a_clean_error(tmp_path: Any) -> None:
    slow = dict(step_base_s=0.01, time_scale=1.0)
    async with http_stack(tmp_path, workers=2, sim=slow) as stack:
        stream = await stack.client.completions.create(
            model=stack.model, prompt="tell me a long story", max_tokens=60, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
        )
        got, usage = 0, None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                got += 1
                if got == 3:
                    victim = next(w for w in stack.workers if w.worker.scheduler.num_running)
                    await victim.kill()
            usage = chunk.usage or usage
        assert usage is not None and usage.completion_tokens == 60
        await eventually(lambda: idle(stack))
        other = await stack.client.completions.create(model=stack.model, prompt="still up?", max_tokens=3)
        assert other.usage is not None and other.usage.completion_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_the_worker_refuses_is_a_clean_400(tmp_path: Any, stream: bool) -> None:
    async with http_stack(tmp_path, workers=1, sim={"context_length": 64}) as stack:
        with pytest.raises(openai.BadRequestError):
            created = await stack.client.completions.create(
                model=stack.model, prompt="word " * 200, max_tokens=4, stream=stream,
            )
            if stream:
                async for _ in created:  # type: ignore[union-attr]
                    pass
        ok = await stack.client.completions.create(model=stack.model, prompt="short", max_tokens=2)
        assert ok.usage is not None and ok.usage.completion_tokens == 2


async def test_one_model_on_a_mixed_fleet_of_grpc_and_http_workers(tmp_path: Any) -> None:
    from gateway_lab.sim.fleet import SimFleet

    sim = SimConfig(**ZERO_COST)
    async with SimFleet.start(1, sim) as grpc_fleet, http_fleet(1, sim) as http_workers:
        config = GatewayConfig(server=ServerConfig(
            worker_urls=[grpc_fleet.urls[0], http_workers[0].url], tokenizer_cache_dir=str(tmp_path / "tok"),
        ))
        config.policy.policy = "round_robin"
        state = GatewayState(config)
        await state.start()
        try:
            assert sorted(w.client.kind for w in state.registry.all()) == ["sglang/grpc", "sglang/http"]
            assert len({w.model for w in state.registry.all()}) == 1
            model = state.catalog.names()[0]
            app = create_app(state, manage_lifecycle=False)
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            server = uvicorn.Server(http_server_config(app, state.config.http))
            task = asyncio.create_task(server.serve(sockets=[sock]))
            for _ in range(500):
                if server.started:
                    break
                await asyncio.sleep(0.01)
            client = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="none", max_retries=0, timeout=30,
            )
            try:
                for _ in range(4):
                    done = await client.completions.create(model=model, prompt="same model, two kinds", max_tokens=3)
                    assert done.usage is not None and done.usage.completion_tokens == 3
            finally:
                await client.close()
                server.should_exit = True
                await task
            assert grpc_fleet.workers[0].counters.requests == 2
            assert http_workers[0].worker.counters.requests == 2
        finally:
            await state.stop()


async def test_the_admin_api_adds_http_workers_with_or_without_naming_the_engine(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=1) as stack, http_fleet(2, SimConfig(**ZERO_COST)) as extra:
        named = await stack.http.post("/workers", json={"url": extra[0].url, "engine": "sglang"})
        assert named.status_code in (200, 201), named.text
        assert named.json()["kind"] == "sglang/http"
        wrong = await stack.http.post("/workers", json={"url": extra[1].url, "engine": "vllm"})
        assert wrong.status_code >= 400 and "registration failed" in wrong.text
        bad = await stack.http.post("/workers", json={"url": extra[1].url, "engine": "tgi"})
        assert bad.status_code == 400
        assert len(stack.state.registry.all()) == 2
        done = await stack.client.completions.create(model=stack.model, prompt="still serving", max_tokens=2)
        assert done.usage is not None and done.usage.completion_tokens == 2


async def test_a_worker_stalling_mid_stream_is_left_and_the_stream_resumes(tmp_path: Any) -> None:
    async with http_stack(tmp_path, workers=2, stall_timeout_s=0.3) as stack:
        stalling = stack.workers[0].worker.faults
        stalling.stall_s = 30.0
        stalling.stall_after_tokens = 3
        started = time.monotonic()
        for _ in range(2):  # round robin: one of the two lands on the stalling worker
            stream = await stack.client.completions.create(
                model=stack.model, prompt="hello there", max_tokens=20, stream=True,
                extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
            )
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            assert usage is not None and usage.completion_tokens == 20
        assert time.monotonic() - started < 15  # left after the stall timeout, not after the stall
        await eventually(lambda: idle(stack))


@pytest.mark.parametrize("api", ["sglang", "vllm"])
async def test_a_paced_streams_tokens_go_to_the_client_from_the_worker_answer(
    tmp_path: Any, api: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On HTTP workers too, the plain text path's tokens after the first event are written
    as the worker's answer brings them (``Generation.push_to``), and the client reads what
    it reads without: the whole answer's text, one finish, the usage."""
    pushed = record_pushes(monkeypatch)
    async with http_stack(tmp_path, workers=1, api=api, sim={"step_base_s": 0.002, "time_scale": 1.0}) as stack:
        messages = [{"role": "user", "content": "Tell me something."}]
        whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=24, seed=5)
        stream = await stack.client.chat.completions.create(
            model=stack.model, messages=messages, max_tokens=24, seed=5, stream=True,
            stream_options={"include_usage": True},
        )
        texts, finishes, usage = [], [], None
        async for chunk in stream:
            for choice in chunk.choices:
                texts.append(choice.delta.content or "")
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
            usage = chunk.usage or usage
        assert "".join(texts) == whole.choices[0].message.content and finishes == [whole.choices[0].finish_reason]
        assert usage is not None and whole.usage is not None and usage.completion_tokens == whole.usage.completion_tokens
        assert pushed and "".join("".join(p) for p in pushed) in "".join(texts)
        assert idle(stack)
