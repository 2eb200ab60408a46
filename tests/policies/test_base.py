"""The router-policy contract (policies/base.py): immutable snapshots and requests, and
the Protocol every policy satisfies (the shipped ones included)."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.policies.base import (
    Decision,
    LoadSnapshot,
    NoWorkerAvailable,
    Policy,
    RemoteDecision,
    RouteRequest,
    WorkerView,
)
from gateway.policies.factory import PolicyConfig, make_policy


def test_snapshots_are_frozen_so_a_policy_cannot_edit_what_it_sees() -> None:
    view = WorkerView("w0", "grpc://w0:1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.in_flight = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RouteRequest(token_ids=[1]).pool = "decode"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        LoadSnapshot().num_running_reqs = 1  # type: ignore[misc]
    assert dataclasses.replace(view, in_flight=3).in_flight == 3 and view.in_flight == 0


def test_defaults_describe_an_idle_regular_worker_and_a_plain_request() -> None:
    view = WorkerView("w0", "grpc://w0:1")
    assert (view.role, view.available, view.in_flight, view.loads, view.page_size) == ("regular", True, 0, None, 1)
    request = RouteRequest(token_ids=[1, 2])
    assert (request.pool, request.target_worker, request.exclude) == ("regular", None, frozenset())


def test_each_decision_has_its_own_scores() -> None:
    a, b = Decision("w0", "r"), Decision("w1", "r")
    a.scores["w0"] = 1.0
    assert b.scores == {} and a.predicted_cached_tokens == 0


def test_remote_events_are_hashable_values() -> None:
    one = RemoteDecision("w0", "m", b"\x01\x00\x00\x00", prompt_tokens=1)
    assert one == RemoteDecision("w0", "m", b"\x01\x00\x00\x00", prompt_tokens=1) and len({one, one}) == 1


@pytest.mark.parametrize("name", ["round_robin", "random", "least_load", "prefix_hash", "consistent_hash", "cache_aware"])
def test_every_shipped_policy_satisfies_the_protocol(name: str) -> None:
    policy = make_policy(PolicyConfig(policy=name))
    try:
        assert isinstance(policy, Policy) and policy.name
        workers = [WorkerView("w0", "grpc://w0:1"), WorkerView("w1", "grpc://w1:1")]
        decision = policy.select(RouteRequest(token_ids=list(range(64)), routing_key="k"), workers)
        assert decision.worker_id in {"w0", "w1"} and decision.reason
        with pytest.raises(NoWorkerAvailable):
            policy.select(RouteRequest(token_ids=[1]), [])
    finally:
        policy.close()


def test_a_load_snapshot_re_aged_keeps_every_other_figure() -> None:
    fields = [f.name for f in dataclasses.fields(LoadSnapshot)]
    polled = LoadSnapshot(**{name: i + 1 for i, name in enumerate(fields)})  # every field distinct
    assert polled.aged(0.25) == dataclasses.replace(polled, age_s=0.25)
    assert polled.aged(0.25) is not polled and polled.age_s == fields.index("age_s") + 1
