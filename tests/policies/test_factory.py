"""PolicyConfig flags and make_policy."""

from __future__ import annotations

import argparse

import pytest

from gateway.policies import POLICY_NAMES, PolicyConfig, close_policy, make_policy
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.prefix_hash import PrefixHashPolicy
from gateway.protocol.headers import ROUTING_KEY_HEADERS, TARGET_WORKER_HEADERS
from gateway.settings import add_options, from_namespace


def test_every_name_builds_a_policy_of_that_name() -> None:
    for name in POLICY_NAMES:
        p = make_policy(PolicyConfig(policy=name))
        assert p.name == name
        close_policy(p)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy(PolicyConfig(policy="nope"))


def test_flags_round_trip_through_argparse() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, PolicyConfig)
    args = parser.parse_args(
        ["--policy", "prefix_hash", "--hash-depth-tokens", "128", "--load-factor", "2",
         "--no-use-polled-loads", "--seed", "4"]
    )
    cfg = from_namespace(PolicyConfig, args)
    assert (cfg.policy, cfg.hash_depth_tokens, cfg.load_factor, cfg.use_polled_loads, cfg.seed) == (
        "prefix_hash", 128, 2.0, False, 4,
    )
    p = make_policy(cfg)
    assert isinstance(p, PrefixHashPolicy) and p.depth_tokens == 128 and p.load_factor == 2.0
    assert "--tree-budget-fraction" in parser.format_help()


def test_overrides_and_cost_knobs_reach_the_policy() -> None:
    p = make_policy(PolicyConfig(), decode_weight=0.25, cost_form="multiplicative", eviction_interval_s=0)
    assert isinstance(p, CacheAwarePolicy)
    assert p.cost.decode_weight == 0.25 and p.cost.form == "multiplicative"
    assert p.needs_loads
    close_policy(p)


def test_header_names_are_lower_case_smg_first() -> None:
    assert ROUTING_KEY_HEADERS == ("x-smg-routing-key", "x-routing-key")
    assert TARGET_WORKER_HEADERS == ("x-smg-target-worker", "x-target-worker")
