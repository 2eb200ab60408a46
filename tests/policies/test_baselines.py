"""Baselines, the explicit target worker and candidate filtering, for every policy."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.policies import (
    POLICY_NAMES,
    NoWorkerAvailable,
    PolicyConfig,
    close_policy,
    make_policy,
)
from gateway.policies.base import LoadSnapshot, Policy
from gateway.policies.baselines import (
    LeastLoadPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)
from gateway.policies.consistent_hash import ConsistentHashPolicy

from .helpers import req, tokens, views, with_load


@pytest.fixture(params=POLICY_NAMES)
def policy(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    p = make_policy(PolicyConfig(policy=request.param, seed=1))
    yield p
    close_policy(p)


def test_every_policy_satisfies_the_protocol_and_picks_an_available_worker(policy: Policy) -> None:
    assert isinstance(policy, Policy)
    ws = with_load(views(4), "w1", available=False)
    for i in range(20):
        r = req(tokens(40, i), request_id=str(i))
        d = policy.select(r, ws)
        assert d.worker_id in {"w0", "w2", "w3"} and d.reason
        policy.on_dispatch(r, d)
        policy.on_finish(r, d.worker_id, 0, True)


def test_every_policy_honours_exclude(policy: Policy) -> None:
    r = req(tokens(40, 1), exclude=frozenset({"w0", "w2"}))
    for _ in range(10):
        assert policy.select(r, views(3)).worker_id == "w1"


@pytest.mark.parametrize("target", ["w2", "grpc://10.0.0.2:30000", "10.0.0.2:30000/"])
def test_every_policy_honours_the_target_worker_by_id_or_url(policy: Policy, target: str) -> None:
    d = policy.select(req(tokens(40, 1), target_worker=target), views(4))
    assert (d.worker_id, d.reason) == ("w2", "target_worker")


def test_target_errors_are_clear(policy: Policy) -> None:
    ws = with_load(views(3), "w1", available=False)
    with pytest.raises(NoWorkerAvailable, match="'nope' is not in pool 'regular'"):
        policy.select(req([1], target_worker="nope"), ws)
    with pytest.raises(NoWorkerAvailable, match=r"'w1' .* is unavailable"):
        policy.select(req([1], target_worker="w1"), ws)
    with pytest.raises(NoWorkerAvailable, match="already failed"):
        policy.select(req([1], target_worker="w0", exclude=frozenset({"w0"})), ws)


def test_no_candidates_raise(policy: Policy) -> None:
    with pytest.raises(NoWorkerAvailable, match="no worker registered"):
        policy.select(req([1]), [])
    with pytest.raises(NoWorkerAvailable, match="none of the 2 workers"):
        policy.select(req([1]), [w for w in views(2, available=False)])


def test_round_robin_cycles_over_available_workers() -> None:
    p = RoundRobinPolicy()
    picks = [p.select(req([1]), views(3)).worker_id for _ in range(6)]
    assert picks == ["w0", "w1", "w2", "w0", "w1", "w2"]


def test_random_is_seedable_and_covers_the_pool() -> None:
    a = [RandomPolicy(seed=9).select(req([1]), views(5)).worker_id for _ in range(1)]
    p1, p2 = RandomPolicy(seed=9), RandomPolicy(seed=9)
    s1 = [p1.select(req([1]), views(5)).worker_id for _ in range(200)]
    s2 = [p2.select(req([1]), views(5)).worker_id for _ in range(200)]
    assert s1 == s2 and s1[0] == a[0]
    assert set(s1) == {f"w{i}" for i in range(5)}


def test_power_of_two_prefers_the_less_loaded_of_its_pair() -> None:
    p = PowerOfTwoPolicy(seed=3)
    ws = with_load(views(2), "w0", in_flight=5)
    assert all(p.select(req([1]), ws).worker_id == "w1" for _ in range(20))
    # over a larger pool the most loaded worker is never picked (it always loses its pair)
    big = with_load(views(6), "w3", in_flight=50)
    assert "w3" not in {p.select(req([1]), big).worker_id for _ in range(200)}
    assert not p.needs_loads


def test_power_of_two_can_compare_polled_token_load() -> None:
    p = PowerOfTwoPolicy(seed=3, metric="polled_tokens")
    assert p.needs_loads
    ws = with_load(views(2), "w0", in_flight=0, loads=LoadSnapshot(num_used_tokens=90_000))
    ws = with_load(ws, "w1", in_flight=3, loads=LoadSnapshot(num_used_tokens=100))
    assert all(p.select(req([1]), ws).worker_id == "w1" for _ in range(20))
    with pytest.raises(ValueError):
        PowerOfTwoPolicy(metric="bogus")


def test_least_load_picks_fewest_in_flight_then_tokens_and_rotates_ties() -> None:
    p = LeastLoadPolicy()
    ws = with_load(with_load(views(3), "w0", in_flight=2), "w2", in_flight=1)
    assert p.select(req([1]), ws).worker_id == "w1"
    ws = with_load(views(2), "w0", queued_prefill_tokens=500)
    assert p.select(req([1]), ws).worker_id == "w1"
    idle = views(4)
    assert Counter(p.select(req([1]), idle).worker_id for _ in range(8)) == Counter(
        {f"w{i}": 2 for i in range(4)}
    )


def test_consistent_hash_is_sticky_per_routing_key_and_skips_a_down_owner() -> None:
    p = ConsistentHashPolicy()
    ws = views(6)
    first = {k: p.select(req(tokens(10, i), routing_key=k), ws).worker_id for i, k in enumerate("abcdefghij")}
    assert len(set(first.values())) > 1
    for k, w in first.items():
        d = p.select(req(tokens(10, 99), routing_key=k), ws)
        assert (d.worker_id, d.reason) == (w, "routing_key")
    down = with_load(ws, first["a"], available=False)
    moved = p.select(req([1], routing_key="a"), down).worker_id
    assert moved != first["a"]
    # sticky even when loaded: a routing key asks for affinity
    busy = with_load(ws, first["b"], in_flight=1000)
    assert p.select(req([1], routing_key="b"), busy).worker_id == first["b"]


def test_consistent_hash_fallbacks_without_a_key() -> None:
    p = ConsistentHashPolicy(fallback="prefix")
    shared = tokens(300, 1)
    picks = {p.select(req(shared + tokens(20, i)), views(6)).worker_id for i in range(10)}
    assert len(picks) == 1
    assert p.select(req(shared), views(6)).reason == "prefix_fallback"
    rr = ConsistentHashPolicy(fallback="round_robin")
    got = [rr.select(req(shared), views(3)) for _ in range(3)]
    assert [d.worker_id for d in got] == ["w0", "w1", "w2"]
    assert got[0].reason == "round_robin_fallback"
    with pytest.raises(ValueError):
        ConsistentHashPolicy(fallback="nope")
