"""The router: pools per (model, role), and the one resolution of a pinned target worker."""

from __future__ import annotations

import pytest

from gateway.policies.base import NoWorkerAvailable, RouteRequest
from gateway.policies.common import TARGET_REASON
from tests.fake_transport import MODEL, FakeTransport, fleet


def route(target: str | None = None, exclude: frozenset[str] = frozenset()) -> RouteRequest:
    return RouteRequest(token_ids=[1, 2], model=MODEL, request_id="t", target_worker=target, exclude=exclude)


@pytest.mark.parametrize("target", ["b:1", "grpc://b:1", "grpc://b:1/"])
async def test_a_target_is_found_by_id_or_url(target: str) -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    chosen = f.router.select(route(target))
    assert chosen.worker.id == "b:1" and chosen.decision.reason == TARGET_REASON


async def test_a_target_that_already_failed_this_request_is_not_retried() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    with pytest.raises(NoWorkerAvailable, match="already failed"):
        f.router.select(route("b:1", exclude=frozenset({"b:1"})))


async def test_unknown_draining_or_other_pool_targets_are_refused() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://d:1", role="decode"))
    with pytest.raises(NoWorkerAvailable, match="not in pool"):
        f.router.select(route("zz:9"))
    with pytest.raises(NoWorkerAvailable, match="not in pool"):
        f.router.select(route("d:1"))  # a decode worker is not in the regular pool
    f.worker("a:1").draining = True
    with pytest.raises(NoWorkerAvailable):
        f.router.select(route("a:1"))


async def test_unavailable_target_says_so() -> None:
    f = await fleet(FakeTransport("grpc://a:1"))
    f.worker("a:1").healthy = False
    with pytest.raises(NoWorkerAvailable, match="unavailable"):
        f.router.select(route("a:1"))


async def test_without_target_excluded_workers_are_skipped() -> None:
    f = await fleet(FakeTransport("grpc://a:1"), FakeTransport("grpc://b:1"))
    assert {f.router.select(route(exclude=frozenset({"a:1"}))).worker.id for _ in range(4)} == {"b:1"}
    with pytest.raises(NoWorkerAvailable, match="no regular worker"):
        f.router.select(route(exclude=frozenset({"a:1", "b:1"})))
