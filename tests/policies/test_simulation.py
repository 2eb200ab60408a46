"""End-to-end check of the policies against the independent simulated caches in
scripts/bench_policies.py (small sizes; no timing is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gateway.policies import PolicyConfig, close_policy, make_policy

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_policies.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_policies", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_policies"] = mod
    spec.loader.exec_module(mod)
    return mod


def run(bench: ModuleType, name: str, hot_share: float = 0.0, **overrides: object):  # type: ignore[no-untyped-def]
    wl = bench.gsp_workload(16, 8, 512, 32, 32, seed=3, hot_share=hot_share)
    policy = make_policy(PolicyConfig(policy=name, eviction_interval_s=0), **overrides)
    try:
        return wl, bench.simulate(policy, wl, 4, 4096, 16, 16, bench.Timing(), 0.0, {})[0]
    finally:
        close_policy(policy)


def test_cache_aware_approaches_the_ideal_hit_rate_and_beats_cache_blind_routing(bench: ModuleType) -> None:
    wl, ca = run(bench, "cache_aware")
    _, rr = run(bench, "round_robin")
    assert ca.hit_rate > 0.85 * wl.ideal_hit
    assert ca.hit_rate > rr.hit_rate + 0.2
    assert ca.throughput_tok_s > rr.throughput_tok_s
    # the tree's predictions track what the independent caches really held
    assert abs(ca.predicted_hit - ca.hit_rate) < 0.1


def test_hot_prefix_stays_balanced_with_cache_aware_but_not_with_sticky_hashing(bench: ModuleType) -> None:
    _, ca = run(bench, "cache_aware", hot_share=0.5)
    _, ch = run(bench, "consistent_hash", hot_share=0.5)
    assert ca.served_max_over_mean < 1.5
    assert ch.served_max_over_mean > ca.served_max_over_mean
