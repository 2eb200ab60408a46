"""Whole stack under worker faults: broken streams resumed elsewhere (HTTP with the
official client, n>1, PD), the watchdog on a stalling worker, the failure-ratio breaker
on a flaky one; every case ends with every client answered and every counter at 0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import openai
import pytest

from gateway.workers.breaker import BreakerState
from tests.e2e.http.conftest import Stack


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def idle(stack: Stack) -> bool:
    return all(w.load.in_flight == 0 and w.load.queued_prefill_tokens == 0 and w.load.running_decode_tokens == 0
               for w in stack.state.registry.all())


def resumes(stack: Stack, outcome: str = "ok") -> float:
    return sum(
        s.value for m in stack.state.metrics.resumes.collect() for s in m.samples
        if s.name.endswith("_total") and s.labels.get("outcome") == outcome
    )


@pytest.mark.stack(workers=2, policy="round_robin")
async def test_streaming_resume_with_official_client(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 4
    for _ in range(2):  # one of the two lands on the flaky worker
        stream = await stack.client.completions.create(
            model=stack.model, prompt="hello there", max_tokens=20, stream=True,
            extra_body={"ignore_eos": True}, stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text or ""
                if chunk.choices[0].finish_reason:
                    assert chunk.choices[0].finish_reason == "length"
            if chunk.usage:
                usage = chunk.usage
        assert usage is not None and usage.completion_tokens == 20
        assert usage.prompt_tokens == 2
    assert idle(stack)
    assert resumes(stack) >= 1


async def _two_n2_answers_one_on_a_worker_failing_after_4_tokens(stack: Stack) -> None:
    """Two whole n=2 completions (one lands on the failing worker); each comes back whole."""
    stack.fleet.workers[0].faults.fail_after_tokens = 4
    for i in range(2):
        resp = await stack.client.completions.create(
            model=stack.model, prompt=f"hello {i}", max_tokens=40, n=2, extra_body={"ignore_eos": True},
        )
        assert sorted(c.index for c in resp.choices) == [0, 1]
        assert all(c.finish_reason == "length" and c.text for c in resp.choices)
        assert resp.usage is not None and resp.usage.completion_tokens == 80


# Whole answers streamed from the worker in coarse chunks (none asked for unstreamed).
COARSE = {"resume": {"unary_whole_max_s": 0.0}}


@pytest.mark.stack(workers=2, policy="round_robin", sections=COARSE)
async def test_non_streaming_n2_resumes_into_one_whole_answer(stack: Stack) -> None:
    await _two_n2_answers_one_on_a_worker_failing_after_4_tokens(stack)
    assert idle(stack)
    assert resumes(stack) >= 1


@pytest.mark.stack(workers=2, policy="round_robin")
async def test_non_streaming_n2_asked_for_unstreamed_is_sent_again_whole(stack: Stack) -> None:
    """Asked for unstreamed, a failure after some tokens is a failure before any output:
    the request is sent again from scratch to the other worker, never resumed."""
    await _two_n2_answers_one_on_a_worker_failing_after_4_tokens(stack)
    assert idle(stack)
    assert resumes(stack) == 0


def retries(stack: Stack, code: str) -> float:
    return sum(
        s.value for m in stack.state.metrics.retries.collect() for s in m.samples
        if s.name.endswith("_total") and s.labels.get("code") == code
    )


WATCHDOG = {"watchdog_floor_s": 0.5, "watchdog_interval_s": 0.1}


@pytest.mark.stack(workers=2, policy="round_robin", sections={"watchdog": WATCHDOG, "health": {"breaker_cooldown_s": 60.0}})
async def test_watchdog_moves_requests_off_a_worker_that_stalls_before_its_first_token(stack: Stack) -> None:
    sick_sim = stack.fleet.workers[0]
    sick = stack.state.registry.get(sick_sim.url)
    assert sick is not None
    sick_sim.faults.stall_s = 30.0  # far past the 20 s a client waits; the cap is 180 s

    async def one(i: int) -> str:
        if i % 2:
            resp = await stack.client.completions.create(model=stack.model, prompt=f"q{i}", max_tokens=5, extra_body={"ignore_eos": True})
            return resp.choices[0].text
        stream = await stack.client.completions.create(model=stack.model, prompt=f"q{i}", max_tokens=5, stream=True, extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async with asyncio.timeout(10):
        answers = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(answers)
    assert sick.breaker.state is BreakerState.OPEN and sick.breaker.last_reason == "watchdog"
    assert sick.progress.stalls >= 1
    # Round robin may hand the sick worker only unstreamed whole answers: their own
    # deadline reaches the watchdog's verdict and retries them as ANSWER_OVERDUE.
    assert retries(stack, "WATCHDOG") + retries(stack, "ANSWER_OVERDUE") >= 1
    workers = (await stack.http.get("/workers")).json()
    listed = next(w for w in (workers["workers"] if isinstance(workers, dict) else workers) if w["id"] == sick.id)
    assert listed["breaker"] == "open" and listed["breaker_detail"]["last_open_reason"] == "watchdog"
    metrics = (await stack.http.get("/metrics")).text
    assert f'token_gateway_worker_watchdog_stalls_total{{model="{sick.model}",role="regular",worker="{sick.id}"}}' in metrics
    await eventually(lambda: idle(stack))


@pytest.mark.stack(
    workers=1, policy="round_robin",
    sim={"prefill_token_s": 0.0004, "time_scale": 1.0},
    sections={"watchdog": WATCHDOG},
)
async def test_a_long_prefill_is_not_a_stall(stack: Stack) -> None:
    # ~3000 uncached tokens at 0.4 ms each: 1.2 s of silence, well past the 0.5 s floor.
    prompt = "alpha beta gamma delta " * 750
    resp = await stack.client.completions.create(model=stack.model, prompt=prompt, max_tokens=2)
    assert resp.choices[0].text is not None
    worker = stack.state.registry.all()[0]
    assert worker.progress.stalls == 0 and worker.breaker.state is BreakerState.CLOSED
    assert idle(stack)


@pytest.mark.stack(workers=3, policy="round_robin", sections={"health": {"breaker_min_requests": 6, "breaker_failure_ratio": 0.3, "breaker_cooldown_s": 60.0}})
async def test_flaky_worker_is_opened_by_its_failure_ratio_and_no_client_sees_it(stack: Stack) -> None:
    flaky_sim = stack.fleet.workers[0]
    flaky = stack.state.registry.get(flaky_sim.url)
    assert flaky is not None
    flaky_sim.faults.fail_after_tokens = 4
    flaky_sim.faults.fail_share = 0.5
    for i in range(40):
        stream = await stack.client.completions.create(
            model=stack.model, prompt=f"p{i}", max_tokens=10, stream=True, extra_body={"ignore_eos": True},
        )
        assert len("".join([c.choices[0].text async for c in stream if c.choices])) > 0
        if flaky.breaker.state is BreakerState.OPEN:
            break
    assert flaky.breaker.state is BreakerState.OPEN
    assert flaky.breaker.last_reason in ("ratio", "consecutive")
    assert idle(stack)


@pytest.mark.stack(workers=2, policy="round_robin", sections={"resume": {"resume": False}})
async def test_no_resume_ends_the_stream_with_an_openai_error_event(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 2
    stack.fleet.workers[1].faults.fail_after_tokens = 2
    body = {"model": stack.model, "prompt": "x", "max_tokens": 20, "stream": True, "ignore_eos": True}
    async with stack.http.stream("POST", "/v1/completions", json=body) as r:
        events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and '"error"' in events[-2] and "not resumed" in events[-2]
    await eventually(lambda: idle(stack))


@pytest.mark.stack(workers=2, policy="round_robin", sections=COARSE)
async def test_seeded_request_is_not_resumed(stack: Stack) -> None:
    stack.fleet.workers[0].faults.fail_after_tokens = 2
    stack.fleet.workers[1].faults.fail_after_tokens = 2
    with pytest.raises(openai.APIError, match="seed"):
        await stack.client.completions.create(model=stack.model, prompt="x", max_tokens=20, seed=3, extra_body={"ignore_eos": True})
    await eventually(lambda: idle(stack))


@pytest.mark.stack(workers=4, roles=["prefill", "decode", "decode", "prefill"], pd={"prefill_policy": "round_robin"}, policy="round_robin")
async def test_pd_decode_leg_failure_is_re_paired(stack: Stack) -> None:
    stack.fleet.workers[1].faults.fail_after_tokens = 3  # one of the two decode workers
    # Which decode worker a pair gets is the policy's choice: send until one pair has met
    # the failing worker (bounded), every stream complete whichever it met.
    for i in range(16):
        stream = await stack.client.completions.create(
            model=stack.model, prompt=f"pd {i}", max_tokens=12, stream=True, extra_body={"ignore_eos": True},
            stream_options={"include_usage": True},
        )
        usage = None
        async for c in stream:
            usage = c.usage or usage
        assert usage is not None and usage.completion_tokens == 12
        if i >= 3 and resumes(stack) >= 1:
            break
    assert resumes(stack) >= 1
    await eventually(lambda: idle(stack))
