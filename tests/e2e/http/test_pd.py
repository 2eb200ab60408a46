"""Prefill/decode disaggregation end to end: official openai client -> gateway -> sim PD pairs.

The simulated decode worker only produces output after meeting its prefill partner
at the bootstrap host:port and room named in its request, so every successful
answer here proves the gateway paired the right workers with the same room.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from gateway.pipeline.pd import (
    ROOM_LIMIT,
    PdConfig,
    PdFlagError,
    RoomAllocator,
    parse_pool_flags,
    pool_policy_config,
    room_for_rank,
)
from gateway.policies.factory import PolicyConfig
from gateway.server.serve import add_arguments, config_from_args
from gateway.workers.worker import Worker, one_per_engine
from gateway_lab.sim.worker import SimWorker
from tests.e2e.http.conftest import Stack, StackOptions, start_stack

PD2 = ["prefill", "prefill", "decode", "decode"]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def _sims(stack: Stack, role: str) -> list[SimWorker]:
    return [w for w in stack.fleet.workers if w.config.role == role]


def _gw(stack: Stack, role: str) -> list[Worker]:
    return [w for w in stack.state.registry.all() if w.role == role]


async def _eventually(check: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.02)
    return check()


async def _all_slots_free(stack: Stack) -> None:
    assert await _eventually(lambda: all(w.load.in_flight == 0 for w in stack.state.registry.all())), [
        (w.id, w.role, w.load.in_flight) for w in stack.state.registry.all()
    ]
    for w in stack.state.registry.all():
        assert w.load.queued_prefill_tokens == 0 and w.load.running_decode_tokens == 0, w.describe()


def _rendezvous(stack: Stack) -> tuple[int, int]:
    decodes = _sims(stack, "decode")
    return sum(w.counters.pd_rendezvous_ok for w in decodes), sum(w.counters.pd_rendezvous_failed for w in decodes)


def _reply(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"please answer <<sim-reply>>{text}<</sim-reply>>"}]


# ---------------------------------------------------------------- every request type
@pytest.mark.stack(workers=4, roles=PD2)
async def test_completions_stream_and_not_through_pd_pairs(stack: Stack) -> None:
    whole = await stack.client.completions.create(
        model=stack.model, prompt="The quick brown fox", max_tokens=12, seed=5, extra_body={"ignore_eos": True}
    )
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    pieces = []
    stream = await stack.client.completions.create(
        model=stack.model, prompt="The quick brown fox", max_tokens=12, seed=5, stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        pieces.extend(c.text for c in chunk.choices)
    assert "".join(pieces) == whole.choices[0].text
    assert _rendezvous(stack) == (2, 0)
    # Every prefill request went to a prefill worker, every decode one to a decode worker.
    assert sum(w.counters.requests for w in _sims(stack, "prefill")) == 2
    assert sum(w.counters.requests for w in _sims(stack, "decode")) == 2
    assert sum(w.counters.generated_tokens for w in _sims(stack, "prefill")) == 2  # one token each
    await _all_slots_free(stack)


@pytest.mark.stack(workers=4, roles=PD2)
async def test_chat_tools_reasoning_and_stop_unchanged(stack: Stack) -> None:
    messages = _reply("<think>Let me think.</think>The answer is 4.")
    whole = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=60)
    assert whole.choices[0].message.content == "The answer is 4."
    assert getattr(whole.choices[0].message, "reasoning_content", None) == "Let me think."
    content, reasoning = [], []
    stream = await stack.client.chat.completions.create(model=stack.model, messages=messages, max_tokens=60, stream=True)
    async for chunk in stream:
        for c in chunk.choices:
            content.append(c.delta.content or "")
            reasoning.append(getattr(c.delta, "reasoning_content", None) or "")
    assert "".join(content) == "The answer is 4." and "".join(reasoning) == "Let me think."

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    resp = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply(call), tools=tools, max_tokens=80, extra_body=NO_THINK
    )
    assert resp.choices[0].finish_reason == "tool_calls"
    assert json.loads(resp.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}

    # A stop string the gateway matches: the decode request is aborted early.
    stopped = await stack.client.chat.completions.create(
        model=stack.model, messages=_reply("alpha beta gamma delta"), stop=["a gam"], max_tokens=40, extra_body=NO_THINK
    )
    assert stopped.choices[0].message.content == "alpha bet"
    assert _rendezvous(stack) == (4, 0)
    await _all_slots_free(stack)


@pytest.mark.stack(workers=4, roles=PD2)
async def test_native_generate_stream_and_not(stack: Stack) -> None:
    body = {"input_ids": [11, 12, 13, 14, 15], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
    resp = (await stack.http.post("/generate", json=body)).json()
    assert len(resp["output_ids"]) == 6 and resp["meta_info"]["finish_reason"]["type"] == "length"
    async with stack.http.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = [line async for line in r.aiter_lines() if line.startswith("data:")]
    assert events[-1].strip() == "data: [DONE]"
    last = json.loads(events[-2][len("data:"):])
    assert last["output_ids"] == resp["output_ids"]  # same prompt, same seed: the same tokens
    assert last["meta_info"]["worker_id"] in {w.id for w in _gw(stack, "decode")}
    assert _rendezvous(stack) == (2, 0)
    await _all_slots_free(stack)


@pytest.mark.stack(workers=4, roles=PD2)
async def test_n_samples_and_batches_get_a_room_each(stack: Stack) -> None:
    resp = await stack.client.completions.create(
        model=stack.model, prompt="Once upon a time", n=3, max_tokens=5, logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    assert resp.usage.completion_tokens == 15
    for c in resp.choices:
        assert len(c.logprobs.tokens) == 5 and all(len(t) == 2 for t in c.logprobs.top_logprobs)
    assert _rendezvous(stack) == (3, 0)
    batch = await stack.client.completions.create(
        model=stack.model, prompt=["first prompt", "second prompt"], n=2, max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert len(batch.choices) == 4 and batch.usage.completion_tokens == 16
    assert _rendezvous(stack) == (7, 0)  # 3 + 2 prompts x 2 samples, each its own room
    await _all_slots_free(stack)


@pytest.mark.stack(workers=4, roles=PD2)
async def test_prompt_logprobs_come_from_prefill_and_cached_tokens_from_prefill(stack: Stack) -> None:
    prompt = "shared prefix " * 40
    echo = await stack.client.completions.create(
        model=stack.model, prompt=prompt, max_tokens=3, echo=True, logprobs=1, extra_body={"ignore_eos": True}
    )
    lp = echo.choices[0].logprobs
    n_prompt = echo.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 3
    assert lp.token_logprobs[0] is None and all(v is not None for v in lp.token_logprobs[1:])
    assert echo.choices[0].text.startswith(prompt)
    # The decode side was never asked for prompt logprobs: they were merged from the prefill reply.
    # Same prompt again: cache_aware sends it to the prefill that has it, which reports the hit.
    again = await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=3)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached and cached >= n_prompt // 2
    prefills = _sims(stack, "prefill")
    assert sum(w.counters.cached_tokens for w in prefills) == cached
    await _all_slots_free(stack)


@pytest.mark.stack(workers=4, roles=PD2)
async def test_workers_listed_with_roles_and_separate_pool_policies(stack: Stack) -> None:
    listed = (await stack.http.get("/workers")).json()["workers"]
    assert sorted(w["role"] for w in listed) == ["decode", "decode", "prefill", "prefill"]
    assert all(w["bootstrap_port"] for w in listed if w["role"] == "prefill")
    await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=2)
    names = {role: p.name for (_, role), p in stack.state.router.policies().items()}
    assert names == {"prefill": "cache_aware", "decode": "power_of_two"}


def _record_requests(stack: Stack) -> dict[str, list[Any]]:
    """Keep a copy of every GenerateRequest the gateway sends, per role (a spy on the real clients)."""
    sent: dict[str, list[Any]] = {"prefill": [], "decode": []}
    for worker in one_per_engine(stack.state.registry.all()):  # DP ranks share their engine's client
        real = worker.client.generate

        def spy(request: Any, *, timeout: float | None = None, _real: Any = real, _role: str = worker.role) -> Any:
            sent[_role].append(request)
            return _real(request, timeout=timeout)

        worker.client.generate = spy  # type: ignore[method-assign]
    return sent


@pytest.mark.stack(workers=4, roles=PD2, sim={"dp_size": 4})
async def test_wire_params_and_dp_rank_alignment(stack: Stack) -> None:
    sent = _record_requests(stack)
    ports = {w.id: w.bootstrap_port for w in _gw(stack, "prefill")}
    assert len(ports) == 8 and {w.dp_rank for w in _gw(stack, "prefill")} == {0, 1, 2, 3}  # a target per rank
    for i in range(4):
        await stack.client.completions.create(model=stack.model, prompt=f"dp prompt {i}", max_tokens=2, logprobs=1)
    assert _rendezvous(stack) == (4, 0)
    assert len(sent["prefill"]) == len(sent["decode"]) == 4
    ranks: dict[int, list[int]] = {}
    for p, d in zip(sent["prefill"], sent["decode"], strict=True):
        assert p.disaggregated_params == d.disaggregated_params
        assert p.request_id == d.request_id
        room = p.disaggregated_params.bootstrap_room
        assert 0 <= room < 2**31 - 1
        assert p.disaggregated_params.bootstrap_host == "127.0.0.1"
        assert p.disaggregated_params.bootstrap_port in ports.values()
        assert p.HasField("data_parallel_rank") and room % 4 == p.data_parallel_rank
        assert d.HasField("data_parallel_rank")  # the decode side is pinned to its own target's rank
        assert not p.stream and p.sampling_params.n == 1
        assert d.return_logprob and d.logprob_start_len == -1  # output logprobs only, from decode
        ranks.setdefault(p.disaggregated_params.bootstrap_port, []).append(p.data_parallel_rank)
    assert len({p.disaggregated_params.bootstrap_room for p in sent["prefill"]}) == 4  # fresh rooms
    assert sum(len(used) for used in ranks.values()) == 4


# ---------------------------------------------------------------- no decode capacity
@pytest.mark.stack(workers=4, roles=PD2)
async def test_empty_decode_pool_is_503_not_a_hang(stack: Stack) -> None:
    for w in _gw(stack, "decode"):
        w.healthy = False
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        await stack.client.completions.create(model=stack.model, prompt="x", max_tokens=2)
    assert info.value.status_code == 503 and time.monotonic() - started < 2
    assert sum(w.counters.requests for w in _sims(stack, "prefill")) == 0  # nothing half-sent
    await _all_slots_free(stack)


@pytest.mark.stack(workers=2, roles=["prefill", "prefill"])
async def test_prefill_only_fleet_is_503(stack: Stack) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        await stack.client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert info.value.status_code == 503
    assert "decode" in info.value.message


# ---------------------------------------------------------------- faults
@pytest.mark.stack(workers=4, roles=PD2, pd={"prefill_policy": "round_robin", "decode_policy": "round_robin"})
async def test_prefill_dying_mid_request_is_retried_on_a_new_pair(stack: Stack) -> None:
    prefills = _sims(stack, "prefill")
    # Slow prefills (10 ms of simulated time per token): the chosen one dies halfway through.
    for w in prefills:
        w.config.prefill_token_s, w.config.time_scale = 0.01, 1.0
    task = asyncio.ensure_future(stack.client.completions.create(
        model=stack.model, prompt="dying prefill " * 100, max_tokens=4, extra_body={"ignore_eos": True}
    ))
    assert await _eventually(lambda: any(w.counters.requests for w in prefills))
    victim, other = prefills if prefills[0].counters.requests else prefills[::-1]
    other.config.prefill_token_s = 0.0
    await asyncio.sleep(0.2)
    await victim.kill()
    resp = await asyncio.wait_for(task, 10)
    assert resp.usage.completion_tokens == 4
    assert other.counters.requests == 1 and other.counters.finished == 1
    # The first decode half was aborted while it waited (or saw its partner's bootstrap port close).
    assert _rendezvous(stack)[0] == 1
    await _all_slots_free(stack)


@pytest.mark.stack(workers=3, roles=["prefill", "decode", "decode"], retry={"max_attempts": 1})
async def test_prefill_failure_without_retry_aborts_the_decode_half(stack: Stack) -> None:
    prefill = _sims(stack, "prefill")[0]
    prefill.faults.reject_status = "UNAVAILABLE"
    with pytest.raises(openai.APIStatusError) as info:
        await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=3)
    assert info.value.status_code >= 500
    # The decode half was waiting for its room; it was cancelled, and its bootstrap wait is gone.
    assert await _eventually(lambda: not prefill.bootstrap._waiters)  # type: ignore[union-attr]
    assert _rendezvous(stack) == (0, 0)
    await _all_slots_free(stack)


@pytest.mark.stack(workers=2, roles=["prefill", "decode"], retry={"max_attempts": 1}, sections={"resume": {"resume": False}})
async def test_decode_dying_mid_stream_ends_the_stream_with_an_error(stack: Stack) -> None:
    decode = _sims(stack, "decode")[0]
    decode.faults.fail_after_tokens = 3
    stream = await stack.client.completions.create(
        model=stack.model, prompt="hello", max_tokens=50, stream=True, extra_body={"ignore_eos": True}
    )
    got = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            got.extend(c.text for c in chunk.choices)
    assert got  # output had started: no replay, a clean error
    await _all_slots_free(stack)
    decode.faults.fail_after_tokens = -1
    ok = await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=3)
    assert ok.choices[0].text is not None


@pytest.mark.stack(workers=2, roles=["prefill", "decode"], retry={"max_attempts": 1}, sections={"resume": {"resume": False}})
async def test_decode_worker_killed_mid_stream(stack: Stack) -> None:
    decode = _sims(stack, "decode")[0]
    decode.faults.stall_s = 5.0
    decode.faults.stall_after_tokens = 2
    stream = await stack.client.completions.create(
        model=stack.model, prompt="hello", max_tokens=50, stream=True, extra_body={"ignore_eos": True, "stream_interval": 1}
    )
    got = []
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            got.extend(c.text for c in chunk.choices)
            if len(got) >= 2 and not decode.died:
                await decode.kill()
    assert got
    await _all_slots_free(stack)


@pytest.mark.slow
async def test_slow_prefill_delays_first_token_and_times_out_to_another_pair(tmp_path: Any) -> None:
    opts = StackOptions(
        workers=4, roles=PD2, pd={"prefill_policy": "round_robin"}, dispatch={"first_token_timeout_s": 1.0},
        sim={"pd_timeout_s": 10.0},
    )
    async with start_stack(opts, tmp_path) as stack:
        prefills = _sims(stack, "prefill")
        for w in prefills:
            w.config.prefill_token_s, w.config.time_scale = 0.005, 1.0  # 5 ms per uncached prompt token
        started = time.monotonic()
        resp = await stack.client.completions.create(model=stack.model, prompt="slow " * 60, max_tokens=3)
        assert resp.choices and time.monotonic() - started >= 0.25  # slow, within the timeout: just later
        slow, fast = prefills if prefills[0].counters.requests else prefills[::-1]
        fast.config.prefill_token_s = 0.0
        await stack.client.completions.create(model=stack.model, prompt="filler", max_tokens=2)  # round robin: fast
        # Too slow (about 3 s): abandoned after 1 s, both halves aborted, a new pair answers.
        resp = await stack.client.completions.create(model=stack.model, prompt="very slow " * 300, max_tokens=3)
        assert resp.choices
        assert (fast.counters.requests, slow.counters.requests) == (2, 2)
        assert await _eventually(lambda: slow.counters.aborted >= 1)
        assert await _eventually(lambda: not slow.bootstrap._waiters)  # type: ignore[union-attr]
        await _all_slots_free(stack)


@pytest.mark.slow
async def test_client_disconnect_aborts_both_halves(tmp_path: Any) -> None:
    # Slow prefill (1 ms of simulated time per token) so the client leaves before the first token.
    opts = StackOptions(workers=2, roles=["prefill", "decode"], sim={"prefill_token_s": 1e-3, "time_scale": 1.0})
    async with start_stack(opts, tmp_path) as stack:
        (prefill,), (decode,) = _sims(stack, "prefill"), _sims(stack, "decode")
        task = asyncio.create_task(stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "word " * 3000}], max_tokens=50, stream=True
        ))
        # Arrival is not what this checks: a long wait for it (a loaded host, a cold first
        # render of 3,000 words) still leaves the prefill seconds of simulated work to abort.
        assert await _eventually(lambda: prefill.counters.requests == 1 and decode.counters.requests == 1, 10.0)
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _eventually(lambda: prefill.counters.aborted >= 1)  # the prefill stopped computing
        assert await _eventually(lambda: not prefill.bootstrap._waiters)  # type: ignore[union-attr]
        assert decode.counters.pd_rendezvous_ok == 0  # the decode half left its wait
        await _all_slots_free(stack)

        # Mid-stream: the decode side sees the abort.
        prefill.config.prefill_token_s = 0.0
        decode.config.decode_seq_s = 0.02
        stream = await stack.client.chat.completions.create(
            model=stack.model, messages=[{"role": "user", "content": "short"}], max_tokens=200, stream=True,
            extra_body={"ignore_eos": True},
        )
        async for _ in stream:
            break
        await stream.close()
        assert await _eventually(lambda: decode.counters.aborted >= 1)
        await _all_slots_free(stack)


# ---------------------------------------------------------------- pure parts
def test_rooms_are_int32_and_follow_the_dp_rank() -> None:
    rng = random.Random(7)
    for dp in (2, 3, 8):
        for rank in range(dp):
            for _ in range(50):
                room = room_for_rank(rng, rank, dp)
                assert 0 <= room < ROOM_LIMIT and room % dp == rank
    assert room_for_rank(random.Random(1), 0, 1) < ROOM_LIMIT
    with pytest.raises(ValueError):
        room_for_rank(rng, 3, 3)


def test_room_allocator_aligns_rooms_to_the_prefill_rank() -> None:
    class _Info:
        def __init__(self, dp: int) -> None:
            self.dp_size = dp

    class _Prefill:
        def __init__(self, dp: int, rank: int | None) -> None:
            self.info, self.dp_rank = _Info(dp), rank

    alloc = RoomAllocator(random.Random(3))
    single = [alloc.room(_Prefill(1, None)) for _ in range(100)]  # type: ignore[arg-type]
    assert all(0 <= room < ROOM_LIMIT for room in single) and len(set(single)) == 100
    for rank in range(4):
        rooms = [alloc.room(_Prefill(4, rank)) for _ in range(20)]  # type: ignore[arg-type]
        assert all(room % 4 == rank and 0 <= room < ROOM_LIMIT for room in rooms) and len(set(rooms)) == 20


def test_pool_flags_and_policies() -> None:
    specs = parse_pool_flags([["grpc://a:1", "9000", "grpc://b:2"], ["grpc://c:3"]], allow_port=True)
    assert [(s.url, s.bootstrap_port) for s in specs] == [("grpc://a:1", 9000), ("grpc://b:2", None), ("grpc://c:3", None)]
    for bad, allow in ([["9000"]], True), ([["grpc://a:1", "1", "2"]], True), ([["grpc://a:1", "9"]], False), ([["ftp://x:1"]], True):
        with pytest.raises(PdFlagError):
            parse_pool_flags(bad, allow_port=allow)
    # SGLang HTTP workers pair too (the bootstrap fields go in both JSON bodies)
    assert [s.url for s in parse_pool_flags([["http://x:1", "8998"]], allow_port=True)] == ["http://x:1"]
    base = PolicyConfig(policy="round_robin", hash_block_size=32)
    pd = PdConfig(prefill_policy="prefix_hash", decode_policy="least_load")
    assert pool_policy_config(base, pd, "prefill").policy == "prefix_hash"
    assert pool_policy_config(base, pd, "prefill").hash_block_size == 32
    assert pool_policy_config(base, pd, "decode").policy == "least_load"
    assert pool_policy_config(base, pd, "regular").policy == "round_robin"


def test_serve_flags() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([
        "--prefill", "grpc://p1:1", "8998", "--prefill", "grpc://p2:2",
        "--decode", "grpc://d1:3", "grpc://d2:4", "--worker-urls", "grpc://r:5",
        "--prefill-policy", "prefix_hash",
    ])
    cfg = config_from_args(args)
    assert [(s.url, s.bootstrap_port) for s in cfg.pd.prefill] == [("grpc://p1:1", 8998), ("grpc://p2:2", None)]
    assert [s.url for s in cfg.pd.decode] == ["grpc://d1:3", "grpc://d2:4"]
    assert cfg.pd.prefill_policy == "prefix_hash" and cfg.pd.decode_policy == "power_of_two"
    assert cfg.server.worker_urls == ["grpc://r:5"]


def test_worker_info_reads_dp_size_and_bootstrap_port() -> None:
    from gateway.proto import sglang_scheduler_pb2 as pb
    from gateway.workers.worker import WorkerInfo

    server = pb.GetServerInfoResponse()
    server.server_args.update({"dp_size": 4, "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998})
    info = WorkerInfo.from_replies(pb.GetModelInfoResponse(model_path="m"), server)
    assert (info.dp_size, info.disaggregation_mode, info.bootstrap_port) == (4, "prefill", 8998)
    assert WorkerInfo.from_replies(pb.GetModelInfoResponse(model_path="m"), pb.GetServerInfoResponse()).dp_size == 1


@pytest.mark.slow
async def test_bench_pd_script_drives_the_serve_cli_over_subprocess_workers() -> None:
    """token-gateway bench pd end to end, tiny: real `serve --prefill ... --decode ...` and sim-worker processes."""
    import io

    from rich.console import Console

    from gateway_lab.bench.scenarios import pd as mod
    from gateway_lab.bench.workloads import GspConfig

    config = mod.PdBenchConfig(
        prefill_policies=["cache_aware"], prefill_workers=2, decode_workers=2, concurrency=1, run_timeout_s=60
    )
    gsp = GspConfig(groups=2, prompts_per_group=3, system_tokens=64, question_tokens=8, output_tokens=4)
    ((summary, sides),) = await mod.main_async(config, gsp, Console(file=io.StringIO()))
    assert (summary.ok, summary.errors) == (6, 0)
    assert (sides["rendezvous_ok"], sides["rendezvous_failed"]) == (6, 0)
    assert sum(sides["prefill_requests"]) == 6 and sum(sides["decode_requests"]) == 6
    # Later prompts of a group hit its system prompt (the auto-sized KV is tiny here, so not every time).
    assert sides["prefill_cached_tokens"] >= 64
    assert summary.cached_tokens == sides["prefill_cached_tokens"]


@pytest.mark.stack(workers=4, roles=PD2, sim={"step_base_s": 0.002, "time_scale": 1.0})
async def test_concurrent_pairs_with_cancellations_leave_nothing_behind(stack: Stack) -> None:
    rng = random.Random(11)

    async def one(i: int) -> None:
        kwargs: dict[str, Any] = {"model": stack.model, "prompt": f"request {i % 5} " * 20, "max_tokens": 20,
                                  "n": 1 + i % 2, "extra_body": {"ignore_eos": True}}
        if i % 3 == 0:
            stream = await stack.client.completions.create(stream=True, **kwargs)
            async for _ in stream:
                pass
        else:
            resp = await stack.client.completions.create(**kwargs)
            assert resp.usage.completion_tokens == 20 * kwargs["n"]

    tasks = [asyncio.create_task(one(i)) for i in range(24)]
    await asyncio.sleep(0.05)
    for i in rng.sample(range(24), 8):
        await asyncio.sleep(rng.uniform(0, 0.05))
        tasks[i].cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    assert not failures, failures
    assert sum(not isinstance(r, BaseException) for r in results) >= 16
    await _all_slots_free(stack)
    # Every cancelled decode half left its bootstrap wait at once (not after the sim's pd_timeout_s).
    assert await _eventually(lambda: all(not w.bootstrap._waiters for w in _sims(stack, "prefill")))  # type: ignore[union-attr]
    assert await _eventually(lambda: all(not w._requests for w in stack.fleet.workers))
    assert _rendezvous(stack)[1] == 0
