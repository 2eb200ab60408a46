"""A worker failing mid-stream under the agents' routes: each stream ends with its API's
error event, the worker's slot is freed, the stored response says it failed, and the
gateway serves the next request."""

from __future__ import annotations

import anthropic
import pytest

from tests.e2e.http.conftest import Stack

FAULTY = {"workers": 1, "retry": {"max_attempts": 1}, "sections": {"resume": {"resume": False}}, "sim": {"eos_probability": 0.0}}


def _free(stack: Stack) -> bool:
    return all(w.load.in_flight == 0 for w in stack.state.registry.all())


@pytest.mark.stack(**FAULTY)
async def test_messages_stream_ends_with_an_error_event(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 3
    claude = anthropic.AsyncAnthropic(base_url=stack.url, api_key="none", max_retries=0)
    try:
        with pytest.raises(anthropic.APIStatusError) as failed:
            async with claude.messages.stream(model=stack.model, max_tokens=50, messages=[{"role": "user", "content": "hi"}]) as s:
                async for _ in s:
                    pass
        assert failed.value.body["error"]["type"] in ("api_error", "overloaded_error")  # type: ignore[index]
        assert _free(stack)
        stack.fleet.workers[0].faults.fail_after_tokens = -1
        ok = await claude.messages.create(model=stack.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert ok.usage.output_tokens == 2
    finally:
        await claude.close()


@pytest.mark.stack(**FAULTY)
async def test_responses_stream_ends_failed_and_is_stored_so(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 3
    events = [e async for e in await stack.client.responses.create(model=stack.model, input="hi", max_output_tokens=50, stream=True)]
    last = events[-1]
    assert last.type == "response.failed" and last.response.error is not None  # type: ignore[union-attr]
    assert (await stack.client.responses.retrieve(last.response.id)).status == "failed"  # type: ignore[union-attr]
    assert _free(stack)
    stack.fleet.workers[0].faults.fail_after_tokens = -1
    ok = await stack.client.responses.create(model=stack.model, input="hi", max_output_tokens=2)
    assert ok.usage is not None and ok.usage.output_tokens == 2


@pytest.mark.stack(**FAULTY)
async def test_background_run_fails_cleanly(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 3
    resp = await stack.client.responses.create(model=stack.model, input="hi", max_output_tokens=50, background=True)
    events = [e async for e in await stack.client.responses.retrieve(resp.id, stream=True)]
    assert events[-1].type == "response.failed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (await stack.client.responses.retrieve(resp.id)).status == "failed"
    assert _free(stack)
