"""GetLoads polling (workers/load_monitor.py): one figure per worker over its DP ranks,
and only workers whose pool's policy reads loads are asked."""

from __future__ import annotations

import pytest

from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.workers.load_monitor import LoadMonitor, LoadMonitorConfig, snapshot
from gateway.workers.transport import CallCode, WorkerCallError
from tests.fake_transport import FakeTransport, fleet


def _rank(**fields: float) -> pb.SchedulerLoad:
    return pb.SchedulerLoad(**fields)  # type: ignore[arg-type]


def test_dp_ranks_are_summed_and_ratios_averaged() -> None:
    reply = pb.GetLoadsResponse(loads=[
        _rank(num_running_reqs=2, num_waiting_reqs=1, num_used_tokens=100, max_total_num_tokens=1000,
              token_usage=0.1, num_waiting_uncached_tokens=50, cache_hit_rate=0.5),
        _rank(num_running_reqs=3, num_waiting_reqs=0, num_used_tokens=300, max_total_num_tokens=1000,
              token_usage=0.3, num_waiting_uncached_tokens=10, cache_hit_rate=0.7),
    ])
    s = snapshot(reply)
    assert (s.num_running_reqs, s.num_waiting_reqs, s.num_used_tokens, s.max_total_num_tokens) == (5, 1, 400, 2000)
    assert s.num_waiting_uncached_tokens == 60
    assert s.token_usage == pytest.approx(0.2) and s.cache_hit_rate == pytest.approx(0.6)
    assert snapshot(pb.GetLoadsResponse()).num_running_reqs == 0


async def test_only_needed_live_workers_are_polled_and_failures_keep_old_figures() -> None:
    a, b, c = FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"), FakeTransport("grpc://c:1")
    f = await fleet(a, b, c)

    async def loads(*, timeout: float = 2.0, include: object = ()) -> pb.GetLoadsResponse:
        return pb.GetLoadsResponse(loads=[_rank(num_running_reqs=7)])

    async def broken(*, timeout: float = 2.0, include: object = ()) -> pb.GetLoadsResponse:
        raise WorkerCallError(CallCode.UNAVAILABLE, "down")

    a.loads = loads  # type: ignore[method-assign]
    c.loads = loads  # type: ignore[method-assign]
    monitor = LoadMonitor(f.registry, lambda w: w.id != "b:1", LoadMonitorConfig(load_poll_interval_s=0))
    f.worker("c:1").draining = True
    assert await monitor.poll_once()
    assert f.worker("a:1").polled is not None and f.worker("a:1").polled.num_running_reqs == 7
    assert f.worker("b:1").polled is None and f.worker("c:1").polled is None  # not needed; draining
    assert monitor.polls == 1
    a.loads = broken  # type: ignore[method-assign]
    await monitor.round()
    assert f.worker("a:1").polled.num_running_reqs == 7 and monitor.polls == 1  # the old figures age
    none = LoadMonitor(f.registry, lambda w: False)
    assert not await none.poll_once()
    assert none.interval_s() == 0.5


async def test_a_worker_whose_engine_has_no_loads_is_not_asked() -> None:
    plain, loadless = FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1")
    loadless.lacks = frozenset({"loads"})
    asked: list[str] = []

    def answering(name: str) -> object:
        async def loads(*, timeout: float = 2.0, include: object = ()) -> pb.GetLoadsResponse:
            asked.append(name)
            return pb.GetLoadsResponse(loads=[_rank(num_running_reqs=1)])
        return loads

    plain.loads = answering("a")  # type: ignore[method-assign]
    loadless.loads = answering("b")  # type: ignore[method-assign]
    f = await fleet(plain, loadless)
    monitor = LoadMonitor(f.registry, lambda w: True, LoadMonitorConfig(load_poll_interval_s=0))
    assert await monitor.poll_once()
    assert asked == ["a"] and f.worker("b:1").polled is None


def test_a_rank_takes_its_own_row() -> None:
    reply = pb.GetLoadsResponse(loads=[_rank(dp_rank=0, num_running_reqs=2), _rank(dp_rank=1, num_running_reqs=5)])
    assert snapshot(reply, 1).num_running_reqs == 5 and snapshot(reply, 0).num_running_reqs == 2
    assert snapshot(reply).num_running_reqs == 7 and snapshot(reply, 4) == snapshot(pb.GetLoadsResponse())


async def test_an_engine_with_dp_ranks_is_polled_once_for_all_of_them() -> None:
    t = FakeTransport("grpc://a:1", server_args={"dp_size": 3})
    f = await fleet(t)
    calls = 0

    async def loads(*, timeout: float = 2.0, include: object = ()) -> pb.GetLoadsResponse:
        nonlocal calls
        calls += 1
        return pb.GetLoadsResponse(loads=[_rank(dp_rank=r, num_waiting_reqs=10 * r) for r in range(3)])

    t.loads = loads  # type: ignore[method-assign]
    monitor = LoadMonitor(f.registry, lambda w: True, LoadMonitorConfig(load_poll_interval_s=0))
    assert await monitor.poll_once()
    assert calls == 1 and monitor.polls == 1
    assert [w.polled.num_waiting_reqs for w in f.registry.all() if w.polled] == [0, 10, 20]
    assert len({w.polled_at for w in f.registry.all()}) == 1
