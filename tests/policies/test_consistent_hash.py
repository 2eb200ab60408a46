"""``consistent_hash`` (policies/consistent_hash.py): a routing key sticks to one worker
with no load bound; keyless traffic follows its prefix or goes round robin."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.policies.consistent_hash import ConsistentHashPolicy
from gateway.policies.hashing import string_key
from tests.policies.helpers import req, tokens, views, with_load


def test_a_routing_key_always_lands_on_the_same_worker_whatever_its_load() -> None:
    policy = ConsistentHashPolicy()
    ws = views(4)
    first = policy.select(req([1], routing_key="session-42"), ws)
    assert first.reason == "routing_key"
    busy = with_load(ws, first.worker_id, in_flight=1000)
    assert {policy.select(req(tokens(8, i), routing_key="session-42"), busy).worker_id for i in range(5)} == {first.worker_id}


def test_keys_spread_and_an_owner_that_is_down_hands_over_then_gets_them_back() -> None:
    policy = ConsistentHashPolicy()
    ws = views(4)
    owners = {f"k{i}": policy.select(req([1], routing_key=f"k{i}"), ws).worker_id for i in range(200)}
    assert len(set(owners.values())) == 4 and max(Counter(owners.values()).values()) < 100
    down = with_load(ws, "w0", available=False)
    moved = {k: policy.select(req([1], routing_key=k), down).worker_id for k in owners}
    assert all(moved[k] == owners[k] for k in owners if owners[k] != "w0")  # only w0's keys move
    assert "w0" not in moved.values()
    assert {k: policy.select(req([1], routing_key=k), ws).worker_id for k in owners} == owners


def test_keyless_requests_follow_their_prefix_by_default() -> None:
    policy = ConsistentHashPolicy(block_size=16, depth_tokens=64)
    shared = tokens(64, seed=1)
    picks = [policy.select(req(shared + tokens(32, seed=i)), views(4)) for i in range(6)]
    assert len({d.worker_id for d in picks}) == 1 and {d.reason for d in picks} == {"prefix_fallback"}
    others = {policy.select(req(tokens(64, seed=100 + i)), views(4)).worker_id for i in range(20)}
    assert len(others) > 1  # different prefixes spread


def test_keyless_requests_go_round_robin_when_asked() -> None:
    policy = ConsistentHashPolicy(fallback="round_robin")
    picks = [policy.select(req(tokens(8, seed=0)), views(3)) for _ in range(6)]
    assert [d.worker_id for d in picks] == ["w0", "w1", "w2", "w0", "w1", "w2"]
    assert {d.reason for d in picks} == {"round_robin_fallback"}
    assert policy.key(req([1])) is None and policy.key(req([1], routing_key="a")) == string_key("a")


def test_explain_names_the_ring_position_without_moving_round_robin() -> None:
    policy = ConsistentHashPolicy(fallback="round_robin")
    out = policy.explain(req([1], routing_key="abc"), views(3))
    assert out["reason"] == "routing_key" and out["ring_position"]["key"] == string_key("abc")
    assert out["walked"][0] == out["ring_position"]["owner"] == out["choice"]
    assert 0.0 <= out["ring_position"]["fraction"] < 1.0
    assert policy.explain(req([1]), views(3))["choice"] == "w0"
    assert policy.explain(req([1]), views(3))["choice"] == "w0"  # explaining does not advance the turn


def test_an_unknown_fallback_is_refused() -> None:
    with pytest.raises(ValueError, match="fallback must be one of"):
        ConsistentHashPolicy(fallback="random")
