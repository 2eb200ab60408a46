"""Worker faults: retried before output, clean errors after, slots always freed."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.http.conftest import ENGINES, Stack

# Conformance: the same fault checks against every kind of worker.
pytestmark = pytest.mark.parametrize("engine", ENGINES)


@pytest.mark.stack(workers=2, policy="round_robin")
async def test_rejecting_worker_is_retried_elsewhere(stack: Stack) -> None:
    bad = stack.fleet.workers[0]
    bad.faults.reject_status = "UNAVAILABLE"
    for _ in range(4):
        resp = await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=3)
        assert resp.choices[0].text is not None
    assert all(w.load.in_flight == 0 for w in stack.state.registry.all())


@pytest.mark.stack(workers=1, retry={"max_attempts": 1}, sections={"resume": {"resume": False}})
async def test_worker_failing_mid_stream_ends_stream_with_error(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 3
    stream = await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=50, stream=True, extra_body={"ignore_eos": True})
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    assert stack.state.registry.all()[0].load.in_flight == 0
    stack.fleet.workers[0].faults.fail_after_tokens = -1
    ok = await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=3)
    assert ok.choices


@pytest.mark.stack(workers=1, retry={"max_attempts": 1}, dispatch={"stall_timeout_s": 0.3}, sections={"resume": {"resume": False}})
async def test_worker_stalling_mid_stream_ends_stream_with_timeout(stack: Stack) -> None:
    worker = stack.fleet.workers[0]
    worker.faults.stall_s = 30.0
    worker.faults.stall_after_tokens = 3
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 50, "stream": True, "ignore_eos": True}
    events: list[str] = []
    async with stack.http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    assert '"worker_timeout"' in events[-2]  # the error event, after some text
    assert any('"text"' in e for e in events[:-2])
    assert stack.state.registry.all()[0].load.in_flight == 0
    worker.faults.stall_s = 0.0
    ok = await stack.client.completions.create(model=stack.model, prompt="hello", max_tokens=3)
    assert ok.choices
