"""Control plane: worker registration and removal over HTTP, health checks, breakers,
load polling, fan-out admin calls, and the faults they must survive."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.workers.breaker import BreakerState
from gateway.workers.health import HealthConfig, HealthMonitor
from gateway_lab.sim.config import SimConfig
from gateway_lab.sim.fleet import SimFleet
from gateway_lab.sim.worker import SimWorker
from tests.e2e.http.conftest import ZERO_COST, Stack

# Requests that take a little while (5 ms per scheduler step) so they overlap.
TIMED = {"step_base_s": 0.005, "time_scale": 1.0}
FAST_HEALTH = {
    "health_check_interval_s": 0.2,
    "health_unhealthy_interval_s": 0.05,
    "health_failure_threshold": 2,
    "health_success_threshold": 2,
    "health_check_timeout_s": 1.0,
}


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settled(stack: Stack) -> bool:
    return all(w.load.in_flight == 0 for w in stack.state.registry.all()) and stack.state.admission.in_flight == 0


# ---------------------------------------------------------------- registration


@pytest.mark.stack(workers=1)
async def test_register_worker_is_probed_and_idempotent(stack: Stack) -> None:
    async with SimFleet.start(1, SimConfig(**ZERO_COST)) as extra:
        url = extra.urls[0]
        created = await stack.http.post("/workers", json={"url": url, "role": "regular", "model": stack.model})
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["created"] is True and body["url"] == url and body["available"] is True
        assert body["registration"][0].startswith("probed")
        assert extra.workers[0].counters.health_checks >= 1
        again = await asyncio.gather(*(stack.http.post("/workers", json={"url": url}) for _ in range(3)))
        assert [r.status_code for r in again] == [200, 200, 200]
        assert all(r.json()["created"] is False for r in again)
        listing = (await stack.http.get("/workers")).json()["workers"]
        assert sorted(w["url"] for w in listing) == sorted([stack.fleet.urls[0], url])
        one = await stack.http.get(f"/workers/{body['id']}")
        assert one.status_code == 200 and one.json()["url"] == url
        # The new worker takes traffic.
        for _ in range(4):
            await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=1)
        assert extra.workers[0].counters.requests >= 1
        removed = await stack.http.delete(f"/workers/{body['id']}")
        assert removed.status_code == 200 and removed.json()["removed"] is True


@pytest.mark.stack(workers=1)
async def test_registration_failures_are_clear(stack: Stack) -> None:
    dead = f"grpc://127.0.0.1:{free_port()}"
    started = time.monotonic()
    resp = await stack.http.post("/workers", json={"url": dead})
    assert resp.status_code == 502
    err = resp.json()["error"]
    assert err["code"] == "worker_registration_failed"
    assert "did not answer its probe" in err["message"] and "UNAVAILABLE" in err["message"]
    assert time.monotonic() - started < 10
    async with SimFleet.start(1, SimConfig(**ZERO_COST)) as extra:
        wrong_model = await stack.http.post("/workers", json={"url": extra.urls[0], "model": "not-this-one"})
        assert wrong_model.status_code == 400 and wrong_model.json()["error"]["param"] == "model"
        bad_role = await stack.http.post("/workers", json={"url": extra.urls[0], "role": "boss"})
        assert bad_role.status_code == 400 and bad_role.json()["error"]["param"] == "role"
        extra_field = await stack.http.post("/workers", json={"url": extra.urls[0], "colour": "red"})
        assert extra_field.status_code == 400
    assert len(stack.state.registry.all()) == 1
    assert (await stack.http.delete("/workers/127.0.0.1:1")).status_code == 404
    assert (await stack.http.get("/workers/127.0.0.1:1")).status_code == 404


@pytest.mark.stack(workers=2, policy="cache_aware", sim=TIMED)
async def test_removal_during_load_loses_nothing(stack: Stack) -> None:
    gone = stack.state.registry.all()[0]
    other = stack.state.registry.all()[1]

    async def one(i: int) -> int:
        stream = await stack.client.completions.create(
            model=stack.model, prompt=f"request {i} " * 8, max_tokens=24, stream=True,
            extra_body={"ignore_eos": True},
        )
        n = 0
        async for chunk in stream:
            n += len(chunk.choices[0].text) if chunk.choices else 0
        return n

    tasks = [asyncio.ensure_future(one(i)) for i in range(16)]
    await eventually(lambda: gone.load.in_flight > 0)
    removal = await stack.http.delete(f"/workers/{gone.id}")
    assert removal.status_code == 200
    assert removal.json()["in_flight"] == 0  # it drained before it left
    results = await asyncio.gather(*tasks)
    assert all(n > 0 for n in results)  # every request finished with output
    assert [w.id for w in stack.state.registry.all()] == [other.id]
    policy = stack.state.router.policy(stack.state.registry.all()[0].model, "regular")
    assert isinstance(policy, CacheAwarePolicy)
    assert all(gone.id not in tree.workers() for tree in policy.trees())
    for _ in range(5):
        raw = await stack.client.completions.with_raw_response.create(model=stack.model, prompt="after", max_tokens=1)
        assert raw.headers["x-worker-id"] == other.id
    assert settled(stack)


# ---------------------------------------------------------------- faults


@pytest.mark.stack(workers=3, sim=TIMED, sections={"health": FAST_HEALTH})
async def test_worker_killed_mid_stream(stack: Stack) -> None:
    victim_sim = stack.fleet.workers[0]
    victim = stack.state.registry.get(victim_sim.url)
    assert victim is not None

    async def stream_one(i: int) -> tuple[str, str]:
        try:
            raw = await stack.client.completions.with_raw_response.create(
                model=stack.model, prompt=f"stream {i}", max_tokens=40, stream=True,
                extra_body={"ignore_eos": True},
            )
            worker = raw.headers["x-worker-id"]
            async for _ in raw.parse():
                pass
            return worker, "ok"
        except openai.APIError:
            return "", "error"

    tasks = [asyncio.ensure_future(stream_one(i)) for i in range(9)]
    await eventually(lambda: victim.load.running_decode_tokens > 0)  # its streams have output
    await victim_sim.kill()
    outcomes = await asyncio.gather(*tasks)
    # Streams on the dead worker resume on the others: every client gets its whole answer.
    assert all(result == "ok" for _, result in outcomes)
    assert any(worker == victim.id for worker, _ in outcomes)
    resumed = sum(s.value for m in stack.state.metrics.resumes.collect() for s in m.samples if s.name.endswith("_total"))
    assert resumed >= 1
    await eventually(lambda: victim.load.in_flight == 0)
    # From now on: zero failures. Requests routed to the dead worker before its breaker
    # opens are retried elsewhere before any output, then it is avoided altogether.
    for _ in range(12):
        done = await stack.client.completions.create(model=stack.model, prompt="after", max_tokens=2)
        assert done.choices
    await eventually(lambda: victim.breaker.state is BreakerState.OPEN or not victim.healthy)
    await eventually(lambda: not victim.healthy)
    sent = victim.load.total_requests
    for _ in range(10):
        await stack.client.completions.create(model=stack.model, prompt="later", max_tokens=2)
    assert victim.load.total_requests == sent
    assert not victim.available
    assert settled(stack)


@pytest.mark.stack(workers=2, sim={**TIMED, "max_running_requests": 2})
async def test_requests_without_output_survive_a_worker_death(stack: Stack) -> None:
    # Non-streamed answers arrive whole, so every request on the dying worker is "before
    # output": queued ones get CANCELLED, running ones UNAVAILABLE; all are retried.
    victim_sim = stack.fleet.workers[0]
    victim = stack.state.registry.get(victim_sim.url)
    assert victim is not None
    tasks = [
        asyncio.ensure_future(
            stack.client.completions.create(model=stack.model, prompt=f"p{i}", max_tokens=16, extra_body={"ignore_eos": True})
        )
        for i in range(12)
    ]
    await eventually(lambda: victim.load.in_flight >= 4)
    await victim_sim.kill()
    done = await asyncio.gather(*tasks)
    assert all(d.usage is not None and d.usage.completion_tokens == 16 for d in done)
    assert settled(stack)


@pytest.mark.stack(workers=2, sections={"health": FAST_HEALTH})
async def test_worker_that_comes_back_is_readmitted(stack: Stack) -> None:
    sim = stack.fleet.workers[0]
    worker = stack.state.registry.get(sim.url)
    assert worker is not None
    port = sim.port
    await sim.kill()
    await eventually(lambda: not worker.healthy)
    assert not worker.available
    reborn = SimWorker(SimConfig(**ZERO_COST))
    await reborn.start("127.0.0.1", port)
    try:
        await eventually(lambda: worker.healthy and worker.available, timeout=15)
        for _ in range(6):
            await stack.client.completions.create(model=stack.model, prompt="back", max_tokens=1)
        assert reborn.counters.requests >= 1
    finally:
        await reborn.stop(grace=0.1)


@pytest.mark.stack(workers=2, dispatch={"first_token_timeout_s": 0.3})
async def test_worker_stalling_before_output_is_left_for_another(stack: Stack) -> None:
    stalled = stack.fleet.workers[0]
    stalled.faults.stall_s = 30.0
    for _ in range(3):
        done = await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=2)
        assert done.choices
    assert stalled.counters.requests >= 1
    await eventually(lambda: settled(stack))


@pytest.mark.stack(workers=1, dispatch={"stall_timeout_s": 0.3}, sections={"resume": {"resume": False}})
async def test_worker_stalling_mid_stream_ends_it_and_frees_the_slot(stack: Stack) -> None:
    faults = stack.fleet.workers[0].faults
    faults.stall_s, faults.stall_after_tokens = 30.0, 2
    started = time.monotonic()
    stream = await stack.client.completions.create(
        model=stack.model, prompt="hi", max_tokens=20, stream=True, extra_body={"ignore_eos": True}
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    assert time.monotonic() - started < 5
    await eventually(lambda: settled(stack))
    faults.stall_s = 0.0
    assert (await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=2)).choices


@pytest.mark.stack(workers=2, retry={"retry_codes": ["UNAVAILABLE"]})
async def test_only_configured_codes_are_retried(stack: Stack) -> None:
    # RESOURCE_EXHAUSTED is retried by default; here only UNAVAILABLE is, so the
    # overloaded worker's answer reaches the client as 503 worker_overloaded.
    stack.fleet.workers[0].faults.reject_status = "RESOURCE_EXHAUSTED"
    codes: list[int] = []
    for _ in range(2):
        resp = await stack.http.post("/v1/completions", json={"model": stack.model, "prompt": "x", "max_tokens": 1})
        codes.append(resp.status_code)
        if resp.status_code == 503:
            assert resp.json()["error"]["code"] == "worker_overloaded"
            assert "retry-after" in resp.headers
    assert sorted(codes) == [200, 503]
    assert stack.fleet.workers[0].counters.rejected == 1
    stack.fleet.workers[1].faults.reject_status = "UNAVAILABLE"
    stack.fleet.workers[0].faults.reject_status = ""
    for _ in range(2):  # UNAVAILABLE is retried on the other worker
        resp = await stack.http.post("/v1/completions", json={"model": stack.model, "prompt": "x", "max_tokens": 1})
        assert resp.status_code == 200
    assert settled(stack)


@pytest.mark.stack(workers=2, retry={"max_attempts": 1})
async def test_one_attempt_means_no_retry(stack: Stack) -> None:
    stack.fleet.workers[0].faults.reject_status = "UNAVAILABLE"
    codes = set()
    for _ in range(4):
        resp = await stack.http.post("/v1/completions", json={"model": stack.model, "prompt": "x", "max_tokens": 1})
        codes.add(resp.status_code)
    assert 502 in codes and 200 in codes
    assert settled(stack)


# ---------------------------------------------------------------- health checks


async def test_health_probes_are_skipped_while_requests_succeed() -> None:
    async with SimFleet.start(1, SimConfig(**ZERO_COST)) as fleet:
        from gateway.workers.registry import WorkerRegistry

        registry = WorkerRegistry()
        worker = await registry.add(fleet.urls[0])
        monitor = HealthMonitor(registry, HealthConfig(health_check_interval_s=10.0, health_unhealthy_interval_s=0.0))
        baseline = fleet.workers[0].counters.health_checks
        worker.record_outcome(True)  # a request just succeeded: evidence enough
        await monitor.check_once()
        assert monitor.probes == 0
        worker.last_ok_at -= 20  # nothing for a while: probe
        await monitor.check_once()
        assert monitor.probes == 1 and fleet.workers[0].counters.health_checks == baseline + 1
        worker.record_outcome(False)  # a failed request asks for an early probe, not a verdict
        assert worker.healthy and worker.suspect
        await monitor.check_once()
        assert monitor.probes == 2 and worker.healthy and not worker.suspect
        await registry.close()


# ---------------------------------------------------------------- load polling and fan-out


@pytest.mark.stack(
    workers=2, policy="power_of_two",
    sections={"policy": {"p2c_metric": "polled_tokens"}, "load_monitor": {"load_poll_interval_s": 0.05}},
)
async def test_loads_are_polled_when_the_policy_needs_them(stack: Stack) -> None:
    await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=1)
    await eventually(lambda: all(w.polled is not None for w in stack.state.registry.all()))
    view = stack.state.registry.all()[0].view()
    assert view.loads is not None and view.loads.max_total_num_tokens > 0
    assert view.loads.age_s < 5


@pytest.mark.stack(workers=2, policy="round_robin", sections={"load_monitor": {"load_poll_interval_s": 0.02}})
async def test_loads_are_not_polled_otherwise(stack: Stack) -> None:
    await stack.client.completions.create(model=stack.model, prompt="hi", max_tokens=1)
    await asyncio.sleep(0.2)
    assert stack.state.loads.polls == 0
    assert all(w.polled is None for w in stack.state.registry.all())


@pytest.mark.stack(workers=2)
async def test_get_loads_and_flush_cache_fan_out(stack: Stack) -> None:
    for _ in range(2):
        await stack.client.completions.create(model=stack.model, prompt="warm the cache " * 20, max_tokens=2)
    loads = await stack.http.get("/get_loads")
    assert loads.status_code == 200
    rows: list[dict[str, Any]] = loads.json()["workers"]
    assert sorted(r["url"] for r in rows) == sorted(stack.fleet.urls)
    assert all(r["loads"]["loads"][0]["max_total_num_tokens"] > 0 for r in rows)
    assert any(w.cache.tree_tokens > 0 for w in stack.fleet.workers)
    flushed = await stack.http.post("/flush_cache")
    assert flushed.status_code == 200 and flushed.json()["success"] is True
    assert len(flushed.json()["workers"]) == 2
    assert all(w.cache.tree_tokens == 0 for w in stack.fleet.workers)
    bad = await stack.http.post("/flush_cache", json={"timeout_s": -1})
    assert bad.status_code == 400
