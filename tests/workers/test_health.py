"""The health monitor: thresholds both ways, requests as evidence, breaker reset on recovery."""

from __future__ import annotations

import time

from gateway.workers.breaker import BreakerState
from gateway.workers.health import HealthConfig, HealthMonitor
from gateway.workers.transport import CallCode
from tests.fake_transport import FakeTransport, fleet, rpc_error

CONFIG = HealthConfig(
    health_check_interval_s=30.0, health_failure_threshold=2, health_success_threshold=2, health_unhealthy_interval_s=1.0,
)


async def test_failed_probes_take_a_worker_out_and_good_ones_bring_it_back() -> None:
    t = FakeTransport("grpc://w:1")
    f = await fleet(t)
    w = f.worker("w:1")
    monitor = HealthMonitor(f.registry, CONFIG)
    t.healthy = rpc_error(CallCode.UNAVAILABLE)
    assert not await monitor.probe(w) and w.healthy  # one failure is not enough
    assert not await monitor.probe(w) and not w.healthy and not w.available
    w.breaker.record_failure()
    w.breaker.record_failure()
    w.breaker.record_failure()
    t.healthy = True
    assert await monitor.probe(w) and not w.healthy
    assert await monitor.probe(w) and w.healthy
    assert w.breaker.state is BreakerState.CLOSED and w.available


async def test_a_recent_success_makes_a_probe_unnecessary() -> None:
    t = FakeTransport("grpc://w:1")
    f = await fleet(t)
    w = f.worker("w:1")
    monitor = HealthMonitor(f.registry, CONFIG)
    now = time.monotonic()
    w.record_outcome(True)
    assert not monitor.due(w, now + 1.0)
    assert monitor.due(w, now + 31.0)
    w.record_outcome(False)  # a failed request asks for an early probe
    assert w.suspect and monitor.due(w, now + 1.5)
    await monitor.check_once()
    assert monitor.probes == 1 and not w.suspect


async def test_draining_workers_are_not_probed() -> None:
    t = FakeTransport("grpc://w:1")
    f = await fleet(t)
    w = f.worker("w:1")
    w.draining = True
    assert not HealthMonitor(f.registry, CONFIG).due(w, time.monotonic() + 1000)


async def test_a_probe_that_times_out_while_the_streams_progress_is_not_a_failure() -> None:
    """Under a burst a real worker's probe (a generation) waits behind the queue; the
    tokens its streams keep delivering prove it alive, so the timeout is not counted."""
    t = FakeTransport("grpc://w:1")
    f = await fleet(t)
    w = f.worker("w:1")
    monitor = HealthMonitor(f.registry, CONFIG)
    t.healthy = rpc_error(CallCode.DEADLINE_EXCEEDED)
    real = t.health_check

    async def slow_probe(*, timeout: float = 5.0):  # type: ignore[no-untyped-def]
        w.progress.message(time.monotonic())  # a stream message lands while the probe waits
        return await real(timeout=timeout)

    t.health_check = slow_probe  # type: ignore[method-assign]
    for _ in range(CONFIG.health_failure_threshold + 1):
        assert not await monitor.probe(w)
    assert w.healthy and w.failures == 0
    t.health_check = real  # type: ignore[method-assign]
    for _ in range(CONFIG.health_failure_threshold):  # silent and failing: counted as before
        await monitor.probe(w)
    assert not w.healthy


async def test_a_worker_back_with_a_new_start_time_was_restarted_and_its_tree_share_goes() -> None:
    t, other = FakeTransport("grpc://w:1", start_time=1000), FakeTransport("grpc://w:2", start_time=1000)
    f = await fleet(t, other, policy="cache_aware")
    w, w2 = f.worker("w:1"), f.worker("w:2")
    assert w.info.start_time == 1000.0
    policy = f.router.policy(w.model, "regular")
    tree = policy.tree(w.model)  # type: ignore[attr-defined]
    prompt = list(range(1, 200))
    tree.insert(prompt, w.id)
    tree.insert(prompt, w2.id)
    events: list[str] = []
    f.registry.subscribe(lambda event, worker: events.append(f"{event} {worker.id}"))
    monitor = HealthMonitor(f.registry, CONFIG)
    for target, transport in ((w, t), (w2, other)):  # both go down; only w:1 comes back as a new process
        transport.healthy = rpc_error(CallCode.UNAVAILABLE)
        await monitor.probe(target)
        await monitor.probe(target)
        transport.healthy = True
        assert not target.healthy
    t.start_time = 2000
    for _ in range(2):
        await monitor.probe(w)
        await monitor.probe(w2)
    assert w.healthy and w2.healthy and w.info.start_time == 2000.0
    assert events == ["restarted w:1"]
    assert tree.worker_tokens(w.id) == 0 and tree.worker_tokens(w2.id) == 199  # at once, w:2's share stays


async def test_an_engine_is_probed_once_for_all_its_ranks() -> None:
    t = FakeTransport("grpc://w:1", server_args={"dp_size": 4})
    f = await fleet(t)
    ranks = f.registry.all()
    probes = 0
    real = t.health_check

    async def counted(*, timeout: float = 5.0) -> object:
        nonlocal probes
        probes += 1
        return await real(timeout=timeout)

    t.health_check = counted  # type: ignore[method-assign, assignment]
    monitor = HealthMonitor(f.registry, CONFIG)
    t.healthy = rpc_error(CallCode.UNAVAILABLE)
    for r in ranks:
        r.suspect = True  # each asks for an early probe
    await monitor.check_once()
    assert probes == 1 and all(r.failures == 1 and not r.suspect for r in ranks)
    for r in ranks:
        r.last_probe_at = 0.0
    await monitor.check_once()
    assert probes == 2 and not any(r.healthy for r in ranks)  # the engine is down: every rank is
    t.healthy = True
    for _ in range(2):
        for r in ranks:
            r.last_probe_at = 0.0
        await monitor.check_once()
    assert probes == 4 and all(r.healthy and r.available for r in ranks)
