"""The policy tap (sync/policy_tap.py): every hook reaches the real policy first, then
decisions, finishes and learned outputs go to the outbox; the rest passes through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.baselines import RoundRobinPolicy
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.sync.policy_tap import TappedPolicy


class _Sink:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def dispatched(self, pool: str, request: RouteRequest, decision: Decision, packed: bytes | None = None) -> None:
        self.events.append(("dispatched", pool, decision.worker_id, packed))

    def finished(self, pool: str, request: RouteRequest, worker_id: str, cached_tokens: int, success: bool) -> None:
        self.events.append(("finished", pool, worker_id, cached_tokens, success))

    def learned(self, pool: str, request: RouteRequest, worker_id: str, output_ids: Sequence[int], packed: bytes | None = None) -> None:
        self.events.append(("learned", pool, worker_id, list(output_ids)))


WORKERS = [WorkerView("w0", "grpc://w0:1"), WorkerView("w1", "grpc://w1:1")]


def test_decisions_and_finishes_reach_the_policy_then_the_sink() -> None:
    inner, sink = CacheAwarePolicy(eviction_interval_s=0), _Sink()
    tapped = TappedPolicy(inner, "m/regular", sink)
    request = RouteRequest(token_ids=list(range(64)), model="m", request_id="r1")
    decision = tapped.select(request, WORKERS)
    tapped.on_dispatch(request, decision)
    assert inner.explain(request, WORKERS)["choice"] == decision.worker_id  # the policy learned the prompt
    tapped.on_finish(request, decision.worker_id, 10, True)
    tapped.on_output(request, decision.worker_id, [7, 8])
    tapped.on_output(request, decision.worker_id, [])  # nothing learned: nothing sent
    kinds = [e[0] for e in sink.events]
    assert kinds == ["dispatched", "finished", "learned"] and sink.events[0][1] == "m/regular"
    assert sink.events[0][3] == inner.packed(request)  # the packed prompt travels, computed once
    assert (tapped.name, tapped.needs_loads, tapped.learn_output) == (inner.name, inner.needs_loads, True)
    tapped.close()


def test_a_policy_that_learns_no_output_sends_none_and_the_rest_passes_through() -> None:
    inner, sink = RoundRobinPolicy(), _Sink()
    tapped = TappedPolicy(inner, "p", sink)
    request = RouteRequest(token_ids=[1], model="m")
    tapped.on_output(request, "w0", [1, 2])
    assert sink.events == [] and tapped.packed(request) is None and tapped.quality() == {}
    assert tapped.on_remote(object()) is None  # type: ignore[arg-type]
    assert not tapped.remote_finishes
    tapped.on_workers_changed(WORKERS)
    assert tapped.explain(request, WORKERS)["policy"] == inner.name
    assert tapped._next == inner._next  # type: ignore[attr-defined]  # anything else is the real policy's
