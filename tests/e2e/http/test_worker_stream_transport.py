"""Both ways Generate streams reach workers (``--worker-stream-transport h2`` and ``grpcio``)
give the client the same answers, resume a worker that fails mid-stream the same way,
and free every slot; a client that leaves mid-stream stops the worker's request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.h2 import H2Call
from tests.e2e.http.conftest import Stack, StackOptions, start_stack


@pytest.fixture(params=["h2", "grpcio"])
async def transport_stack(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[Stack]:
    # 1 ms per decode step (simulated time at real speed): a long answer is still going when its client leaves.
    opts = StackOptions(
        workers=2, policy="round_robin", server={"worker_stream_transport": request.param},
        sim={"decode_seq_s": 0.001, "time_scale": 1.0},
    )
    async with start_stack(opts, tmp_path) as s:
        yield s


def _transport(stack: Stack) -> str:
    return stack.state.config.server.worker_stream_transport


async def test_streamed_and_whole_answers_agree(transport_stack: Stack) -> None:
    stack = transport_stack
    worker = stack.state.registry.all()[0]
    call = worker.client.generate(pb.GenerateRequest(request_id="probe"))
    assert isinstance(call, H2Call) == (_transport(stack) == "h2")
    call.cancel()
    body = {"model": stack.model, "prompt": "count with me", "max_tokens": 24, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
    whole = await stack.client.completions.create(**body)
    parts = [c.choices[0].text async for c in await stack.client.completions.create(stream=True, **body) if c.choices]
    assert "".join(parts) == whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens == 24
    chat = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=16, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    usage = None
    async for chunk in chat:
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 16
    assert all(w.load.in_flight == 0 for w in stack.state.registry.all())


async def test_a_worker_failing_mid_stream_is_resumed(transport_stack: Stack) -> None:
    stack = transport_stack
    for w in stack.fleet.workers:
        w.faults.fail_after_tokens = 5
    stream = await stack.client.completions.create(
        model=stack.model, prompt="hello", max_tokens=8, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for w in stack.fleet.workers:
        w.faults.fail_after_tokens = -1  # the continuation succeeds
    usage = None
    finish = []
    async for c in stream:
        usage = c.usage or usage
        finish += [ch.finish_reason for ch in c.choices if ch.finish_reason]
    assert finish == ["length"]
    assert usage is not None and usage.completion_tokens == 8
    assert sum(w.counters.failed for w in stack.fleet.workers) == 1  # one failure, resumed on the other
    assert sum(w.counters.requests for w in stack.fleet.workers) == 2
    assert all(w.load.in_flight == 0 for w in stack.state.registry.all())


async def test_a_client_gone_mid_stream_stops_the_workers_request(transport_stack: Stack) -> None:
    stack = transport_stack
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 5000, "stream": True, "ignore_eos": True}
    async with stack.http.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                break
    for _ in range(200):
        if all(w.load.in_flight == 0 for w in stack.state.registry.all()) and sum(w.counters.aborted for w in stack.fleet.workers):
            break
        await asyncio.sleep(0.01)
    assert all(w.load.in_flight == 0 for w in stack.state.registry.all())
    assert sum(w.counters.aborted for w in stack.fleet.workers) == 1
