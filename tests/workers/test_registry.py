"""Worker registration against fake transports: probes, roles, lookups, draining."""

from __future__ import annotations

import asyncio

import pytest

from gateway.workers.registry import WorkerRegistrationError, WorkerRegistry
from gateway.workers.transport import CallCode
from tests.fake_transport import MODEL, FakeTransport, fleet, rpc_error


async def test_a_probed_worker_is_registered_with_what_it_said() -> None:
    t = FakeTransport("grpc://127.0.0.1:7001")
    f = await fleet(t)
    w = f.worker("127.0.0.1:7001")
    assert w.model == MODEL and w.role == "regular" and w.info.kv_capacity_tokens == 100_000
    assert f.registry.get("grpc://127.0.0.1:7001") is w and f.registry.get("nonsense") is None
    assert f.registry.models() == [MODEL] and f.registry.pool(MODEL, "regular") == [w]
    assert await f.registry.add(t.url) is w  # adding twice returns the same worker


async def test_role_comes_from_the_worker_unless_given() -> None:
    p = FakeTransport("grpc://p:1", role="prefill", bootstrap_port=8998)
    d = FakeTransport("grpc://d:1", role="decode")
    f = await fleet(p, d)
    assert f.worker("p:1").role == "prefill" and f.worker("p:1").bootstrap_port == 8998
    assert f.worker("d:1").role == "decode"


async def test_prefill_without_bootstrap_port_is_refused() -> None:
    p = FakeTransport("grpc://p:1", role="prefill")
    with pytest.raises(WorkerRegistrationError, match="bootstrap port"):
        await fleet(p)
    assert p.closed


@pytest.mark.parametrize("health", [False, rpc_error(CallCode.UNAVAILABLE)])
async def test_a_worker_failing_its_probe_is_refused_and_its_channel_closed(health: object) -> None:
    t = FakeTransport("grpc://w:1", healthy=health)  # type: ignore[arg-type]
    with pytest.raises(WorkerRegistrationError):
        await fleet(t)
    assert t.closed


async def test_removal_drains_in_flight_requests_first() -> None:
    t = FakeTransport("grpc://w:1")
    f = await fleet(t)
    w = f.worker("w:1")
    guard = w.load.acquire(1, 1)
    removing = asyncio.ensure_future(f.registry.remove("w:1", drain_timeout_s=2.0))
    await asyncio.sleep(0.01)
    assert w.draining and not removing.done() and not w.available
    guard.release()
    assert await removing is w
    assert f.registry.get("w:1") is None and t.closed


async def test_registry_changes_reach_listeners() -> None:
    events: list[tuple[str, str]] = []
    t = FakeTransport("grpc://w:1")
    registry = WorkerRegistry(connect=lambda url, tls, key: t)
    registry.subscribe(lambda event, worker: events.append((event, worker.id)))
    await registry.add(t.url)
    await registry.remove("w:1", drain_timeout_s=0.1)
    assert events == [("added", "w:1"), ("removed", "w:1")]


async def test_an_engine_with_dp_ranks_is_one_target_per_rank_sharing_its_client() -> None:
    events: list[tuple[str, str]] = []
    t = FakeTransport("grpc://w:1", server_args={"dp_size": 3})
    f = await fleet(t)
    f.registry.subscribe(lambda event, worker: events.append((event, worker.id)))
    ranks = f.registry.all()
    assert [(w.id, w.dp_rank) for w in ranks] == [("w:1@0", 0), ("w:1@1", 1), ("w:1@2", 2)]
    assert all(w.client is t and w.info is ranks[0].info for w in ranks)  # one connection, one self-description
    assert f.registry.pool(MODEL, "regular") == ranks and f.registry.ranks(ranks[1]) == ranks
    # an engine's id or URL finds its first rank, a rank id that rank, an unknown rank nothing
    assert f.registry.get("w:1") is ranks[0] and f.registry.get("grpc://w:1") is ranks[0]
    assert f.registry.get("w:1@2") is ranks[2] and f.registry.get("w:1@7") is None
    assert await f.registry.add(t.url) is ranks[0]  # adding twice keeps the ranks
    guard = ranks[2].load.acquire(1, 1)
    removing = asyncio.ensure_future(f.registry.remove("w:1@1", drain_timeout_s=2.0))  # any rank removes the engine
    await asyncio.sleep(0.01)
    assert all(w.draining for w in ranks) and not removing.done() and not t.closed
    guard.release()
    await removing
    assert f.registry.all() == [] and t.closed
    assert events == [("removed", "w:1@0"), ("removed", "w:1@1"), ("removed", "w:1@2")]


async def test_the_operator_overrides_the_reported_dp_size() -> None:
    t = FakeTransport("grpc://w:1", server_args={"dp_size": 4})
    registry = WorkerRegistry(connect=lambda url, tls, key: t)
    w = await registry.add(t.url, dp_size=1)  # one target: the engine balances its ranks
    assert [x.id for x in registry.all()] == ["w:1"] and w.dp_rank is None and w.info.dp_size == 1
    u = FakeTransport("grpc://u:1")
    registry = WorkerRegistry(connect=lambda url, tls, key: u)
    await registry.add(u.url, dp_size=2)
    assert [x.id for x in registry.all()] == ["u:1@0", "u:1@1"]
    with pytest.raises(WorkerRegistrationError, match="dp_size must be"):
        await registry.add("grpc://v:1", dp_size=0)


async def test_an_engine_that_cannot_name_a_rank_is_refused_ranks() -> None:
    t = FakeTransport("grpc://w:1", server_args={"dp_size": 2}, lacks=frozenset({"dp_rank"}))
    with pytest.raises(WorkerRegistrationError, match="dp_size 1"):
        await fleet(t)
    assert t.closed
    huge = FakeTransport("grpc://h:1", server_args={"dp_size": 10**6})
    with pytest.raises(WorkerRegistrationError, match="reports dp_size"):
        await fleet(huge)
