"""Router: when every breaker of a pool is open, healthy workers are still chosen (panic)."""

from __future__ import annotations

import pytest

from gateway.policies.base import NoWorkerAvailable, RouteRequest
from tests.fake_transport import MODEL, FakeTransport, fleet

ROUTE = RouteRequest(token_ids=[1, 2, 3], model=MODEL, request_id="q1")


async def test_all_breakers_open_routes_among_the_healthy() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    a, b = f.worker("a:1"), f.worker("b:1")
    a.breaker.trip("watchdog")
    assert f.router.select(ROUTE).worker is b  # one closed breaker: it alone is chosen
    b.breaker.trip("watchdog")
    assert f.router.select(ROUTE).worker in (a, b)  # none closed: panic, not a 503
    a.healthy = False
    assert f.router.select(ROUTE).worker is b  # health still rules out a down worker
    b.healthy = False
    with pytest.raises(NoWorkerAvailable):
        f.router.select(ROUTE)
