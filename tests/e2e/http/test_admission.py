"""Admission control: concurrency cap, FIFO queue (429 full, 408 timeout), per-key rate limit."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from gateway.protocol.errors import (
    QueueFullError,
    QueueTimeoutError,
    RateLimitedError,
    ShuttingDownError,
)
from gateway.server.admission import Admission, AdmissionConfig
from tests.e2e.http.conftest import Stack

# ---------------------------------------------------------------- the object itself


async def test_cap_queue_and_full_queue() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=1, queue_timeout_s=5))
    first = await adm.acquire("k")
    waiting = asyncio.ensure_future(adm.acquire("k"))
    await asyncio.sleep(0.01)
    assert adm.in_flight == 1 and adm.queued == 1 and not waiting.done()
    with pytest.raises(QueueFullError) as full:
        await adm.acquire("k")
    assert full.value.status == 429 and full.value.retry_after
    first.release()
    first.release()  # idempotent: must not free a second slot
    second = await asyncio.wait_for(waiting, 1)
    assert adm.in_flight == 1 and adm.queued == 0
    second.release()
    assert adm.in_flight == 0


async def test_waiters_are_served_first_in_first_out() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=10, queue_timeout_s=5))
    order: list[int] = []

    async def one(i: int) -> None:
        async with adm.admit():
            order.append(i)
            await asyncio.sleep(0.005)

    holder = await adm.acquire()
    tasks = []
    for i in range(5):
        tasks.append(asyncio.ensure_future(one(i)))
        await asyncio.sleep(0.002)  # enqueue in a known order
    holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == [0, 1, 2, 3, 4]
    assert adm.in_flight == 0


async def test_queue_timeout_is_408_and_frees_nothing() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=4, queue_timeout_s=0.05))
    holder = await adm.acquire()
    with pytest.raises(QueueTimeoutError) as timeout:
        await adm.acquire()
    assert timeout.value.status == 408
    assert adm.in_flight == 1 and adm.queued == 0
    holder.release()
    assert adm.in_flight == 0
    async with adm.admit():
        assert adm.in_flight == 1


async def test_cancelled_waiter_leaves_no_slot_behind() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=4, queue_timeout_s=5))
    holder = await adm.acquire()
    waiter = asyncio.ensure_future(adm.acquire())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    holder.release()
    assert adm.in_flight == 0 and adm.queued == 0


async def test_close_refuses_new_and_queued_requests() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=1, max_queued_requests=4, queue_timeout_s=5))
    holder = await adm.acquire()
    waiter = asyncio.ensure_future(adm.acquire())
    await asyncio.sleep(0.01)
    adm.close()
    with pytest.raises(ShuttingDownError):
        await waiter
    with pytest.raises(ShuttingDownError):
        await adm.acquire()
    assert not await adm.wait_idle(0.01)
    holder.release()
    assert await adm.wait_idle(0.01)


async def test_token_bucket_per_key() -> None:
    now = [100.0]
    adm = Admission(AdmissionConfig(rate_limit_per_s=2.0, rate_limit_burst=2), clock=lambda: now[0])
    for _ in range(2):
        (await adm.acquire("alice")).release()
    with pytest.raises(RateLimitedError) as limited:
        await adm.acquire("alice")
    assert limited.value.status == 429 and limited.value.retry_after == pytest.approx(0.5)
    (await adm.acquire("bob")).release()  # another key has its own bucket
    now[0] += 0.5
    (await adm.acquire("alice")).release()
    with pytest.raises(RateLimitedError):
        await adm.acquire("alice")


async def test_rate_limit_remembers_a_bounded_number_of_keys() -> None:
    adm = Admission(AdmissionConfig(rate_limit_per_s=1.0, rate_limit_max_keys=3), clock=lambda: 0.0)
    for i in range(10):
        (await adm.acquire(f"key-{i}")).release()
    assert len(adm._buckets) == 3


# ---------------------------------------------------------------- through the HTTP front door

SLOW = {"fault_stall_s": 0.6}  # each request goes silent once for 0.6 s before its first token


@pytest.mark.stack(workers=1, sim=SLOW, sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 0}})
async def test_http_429_with_retry_after_when_queue_full(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 2}
    first = asyncio.ensure_future(stack.http.post("/v1/completions", json=body))
    await asyncio.sleep(0.2)
    resp = await stack.http.post("/v1/completions", json=body)
    assert resp.status_code == 429
    assert int(resp.headers["retry-after"]) >= 1
    err = resp.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
    assert (await first).status_code == 200
    assert stack.state.admission.in_flight == 0
    metrics = (await stack.http.get("/metrics")).text
    assert 'token_gateway_admission_rejections_total{reason="queue_full"} 1.0' in metrics


@pytest.mark.stack(
    # The first request holds the one slot well past the second's queue timeout (a 0.6 s
    # stall left a race between the first finishing and the second timing out).
    workers=1, sim={"fault_stall_s": 2.0},
    sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 4, "queue_timeout_s": 0.4}},
)
async def test_http_408_on_queue_timeout(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 2}
    first = asyncio.ensure_future(stack.http.post("/v1/completions", json=body))
    await asyncio.sleep(0.2)
    second = asyncio.ensure_future(
        stack.http.post("/v1/chat/completions", json={"model": stack.model, "messages": [{"role": "user", "content": "hi"}]})
    )
    for _ in range(40):  # bounded: until the chat request is waiting in the queue
        if stack.state.admission.queued:
            break
        await asyncio.sleep(0.005)
    assert "token_gateway_queue_depth 1.0" in (await stack.http.get("/metrics")).text
    resp = await second
    assert resp.status_code == 408
    assert 'token_gateway_admission_rejections_total{reason="queue_timeout"} 1.0' in (await stack.http.get("/metrics")).text
    assert resp.json()["error"]["code"] == "queue_timeout"
    assert (await first).status_code == 200
    assert stack.state.admission.in_flight == 0 and stack.state.admission.queued == 0


@pytest.mark.stack(workers=1, sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 0}})
async def test_stream_holds_its_slot_until_it_ends(stack: Stack) -> None:
    stack.fleet.workers[0].faults.stall_s = 2.0  # the stream stays open (holding its slot) well past the next request
    stack.fleet.workers[0].faults.stall_after_tokens = 2
    stream = await stack.client.completions.create(
        model=stack.model, prompt="hello", max_tokens=6, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = stream.__aiter__()
    await chunks.__anext__()
    with pytest.raises(openai.RateLimitError):
        await stack.client.completions.create(model=stack.model, prompt="x", max_tokens=1)
    async for _ in chunks:
        pass
    for _ in range(200):  # bounded: the slot is released once the server has sent the response's end
        if stack.state.admission.in_flight == 0:
            break
        await asyncio.sleep(0.005)
    assert stack.state.admission.in_flight == 0
    ok = await stack.client.completions.create(model=stack.model, prompt="x", max_tokens=1)
    assert ok.choices


@pytest.mark.stack(workers=1, sim=SLOW, sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 4}})
async def test_client_leaving_the_queue_frees_its_place(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 2}
    first = asyncio.ensure_future(stack.http.post("/v1/completions", json=body))
    await asyncio.sleep(0.1)
    with pytest.raises(httpx.ReadTimeout):
        await stack.http.post("/v1/completions", json=body, timeout=0.1)
    assert (await first).status_code == 200
    for _ in range(100):
        if stack.state.admission.in_flight == 0 and stack.state.admission.queued == 0:
            break
        await asyncio.sleep(0.01)
    assert stack.state.admission.in_flight == 0 and stack.state.admission.queued == 0


@pytest.mark.stack(
    workers=1,
    server={"api_keys": ["key-a", "key-b"]},
    sections={"admission": {"rate_limit_per_s": 0.01, "rate_limit_burst": 2}},
)
async def test_http_rate_limit_per_api_key(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 1}
    a = {"authorization": "Bearer key-a"}
    b = {"authorization": "Bearer key-b"}
    for _ in range(2):
        assert (await stack.http.post("/v1/completions", json=body, headers=a)).status_code == 200
    limited = await stack.http.post("/v1/completions", json=body, headers=a)
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(limited.headers["retry-after"]) >= 1
    assert (await stack.http.post("/v1/completions", json=body, headers=b)).status_code == 200


# ---------------------------------------------------------------- batches take one slot per prompt


async def test_a_batch_takes_one_slot_per_prompt_and_waits_for_room() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=4, max_queued_requests=4, queue_timeout_s=5))
    one = await adm.acquire("k")
    batch = asyncio.ensure_future(adm.acquire("k", 4))  # needs all four slots
    await asyncio.sleep(0.01)
    assert not batch.done() and adm.queued == 1
    later = asyncio.ensure_future(adm.acquire("k"))  # FIFO: does not overtake the batch
    await asyncio.sleep(0.01)
    assert not later.done()
    one.release()
    ticket = await asyncio.wait_for(batch, 1)
    assert adm.in_flight == 4 and not later.done()
    ticket.release()
    (await asyncio.wait_for(later, 1)).release()
    assert adm.in_flight == 0


async def test_a_batch_larger_than_the_cap_is_refused_at_once() -> None:
    from gateway.protocol.errors import InvalidRequestError

    adm = Admission(AdmissionConfig(max_concurrent_requests=4))
    with pytest.raises(InvalidRequestError) as err:
        await adm.acquire("k", 5)
    assert err.value.status == 400 and err.value.code == "batch_too_large"
    assert adm.in_flight == 0


async def test_a_batch_spends_one_rate_token_per_prompt() -> None:
    from gateway.protocol.errors import InvalidRequestError

    adm = Admission(AdmissionConfig(rate_limit_per_s=1.0, rate_limit_burst=3), clock=lambda: 100.0)
    (await adm.acquire("k", 3)).release()
    with pytest.raises(RateLimitedError):
        await adm.acquire("k")  # the batch of three spent the whole burst
    with pytest.raises(InvalidRequestError):
        await adm.acquire("other", 4)  # more than the burst could ever allow


async def test_a_cancelled_heavy_waiter_lets_lighter_ones_in() -> None:
    adm = Admission(AdmissionConfig(max_concurrent_requests=2, max_queued_requests=4, queue_timeout_s=5))
    one = await adm.acquire("k")
    heavy = asyncio.ensure_future(adm.acquire("k", 2))
    await asyncio.sleep(0.01)
    light = asyncio.ensure_future(adm.acquire("k"))
    await asyncio.sleep(0.01)
    heavy.cancel()
    ticket = await asyncio.wait_for(light, 1)
    assert adm.in_flight == 2
    ticket.release()
    one.release()
    assert adm.in_flight == 0


# ---------------------------------------------------------------- priority, key shares, the fleet's slots


@pytest.mark.stack(
    workers=1, sim=SLOW, server={"api_keys": ["key-a"]},
    sections={"admission": {"max_concurrent_requests": 1, "max_queued_requests": 8}},
)
async def test_priority_from_the_body_or_the_header_orders_the_queue(stack: Stack) -> None:
    auth = {"authorization": "Bearer key-a"}
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 2}
    done: list[str] = []

    async def send(label: str, extra: dict[str, object], headers: dict[str, str]) -> None:
        resp = await stack.http.post("/v1/completions", json={**body, **extra}, headers={**auth, **headers})
        assert resp.status_code == 200, resp.text
        done.append(label)

    first = asyncio.ensure_future(send("first", {}, {}))
    await asyncio.sleep(0.2)
    tasks = [asyncio.ensure_future(send("low", {"priority": -1}, {}))]
    await asyncio.sleep(0.05)
    tasks.append(asyncio.ensure_future(send("normal", {}, {})))
    await asyncio.sleep(0.05)
    tasks.append(asyncio.ensure_future(send("high by header", {"priority": -5}, {"x-priority": "3"})))
    await asyncio.sleep(0.1)
    metrics = (await stack.http.get("/metrics", headers=auth)).text
    tenant = stack.state.admission.waiting()
    assert sum(tenant.values()) == 3
    for (level, key), count in tenant.items():
        assert f'token_gateway_queue_waiting{{priority="{level}",tenant="{key}"}} {float(count)}' in metrics
    await asyncio.wait_for(asyncio.gather(first, *tasks), 30)
    assert done == ["first", "high by header", "normal", "low"]


@pytest.mark.stack(workers=1)
async def test_a_priority_that_is_not_an_integer_is_a_400(stack: Stack) -> None:
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 1}
    resp = await stack.http.post("/v1/completions", json=body, headers={"x-priority": "urgent"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "x-priority"
    resp = await stack.http.post("/v1/completions", json={**body, "priority": 2**40})
    assert resp.status_code == 400 and "priority" in resp.text
    ok = await stack.client.completions.create(model=stack.model, prompt="x", max_tokens=1, extra_body={"priority": 2})
    assert ok.choices


@pytest.mark.stack(
    workers=2, sim={**SLOW, "max_running_requests": 1},
    sections={"admission": {"fleet_headroom": 0, "max_queued_requests": 8}},
)
async def test_fleet_headroom_queues_in_the_gateway_past_the_workers_running_slots(stack: Stack) -> None:
    assert stack.state.admission.cap() == 2  # two workers of one running slot each
    assert stack.state.router.slot_headroom == 0
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 2}
    sends = [asyncio.ensure_future(stack.http.post("/v1/completions", json=body)) for _ in range(3)]
    await asyncio.sleep(0.3)
    assert stack.state.admission.in_flight == 2 and stack.state.admission.queued == 1
    assert all(r.status_code == 200 for r in await asyncio.wait_for(asyncio.gather(*sends), 30))
    assert stack.state.admission.in_flight == 0 and stack.state.admission.queued == 0


@pytest.mark.stack(workers=2, sections={"admission": {"fleet_headroom": 1, "fleet_slot_bound": False}})
async def test_the_slot_bound_follows_the_fleet_cap_unless_turned_off(stack: Stack) -> None:
    assert stack.state.admission.cap() > 0 and stack.state.router.slot_headroom == -1
