"""Live routing quality: the offered-prefix sketch, the tokenizer-fidelity guard, pool figures."""

from __future__ import annotations

import random

import pytest

from gateway.policies.base import Decision
from gateway.policies.cache_aware import DEFAULT_SPREAD_PREFILL_WEIGHT, CacheAwarePolicy
from gateway.policies.quality import FidelityGuard, OfferedPrefixes, PoolQuality
from gateway_lab.bench.workloads import ideal_hit_rate

from .helpers import req, tokens, views


def gsp_prompts(groups: int, per_group: int, seed: int = 0) -> list[list[int]]:
    systems = [tokens(512, seed * 1000 + g) for g in range(groups)]
    prompts = [systems[g] + tokens(40, seed * 100_000 + g * 100 + p) for g in range(groups) for p in range(per_group)]
    random.Random(seed).shuffle(prompts)
    return prompts


@pytest.mark.parametrize("page", [1, 16])
def test_the_sketch_matches_the_exact_ideal_when_it_holds_the_working_set(page: int) -> None:
    prompts = gsp_prompts(8, 6)
    sketch = OfferedPrefixes(1 << 20, page_size=page)
    for p in prompts:
        sketch.offer(p)
    # the exact ideal counts whole pages and the worker's "last token is recomputed" rule
    # only through the page cut; both agree to within the one-token cap per prompt
    exact = ideal_hit_rate(prompts, page)
    assert sketch.prompt_tokens == sum(len(p) for p in prompts)
    assert sketch.ideal_hit_rate == pytest.approx(exact, abs=0.002)
    assert sketch.sketch_tokens <= 1 << 20


def test_the_sketch_is_bounded_and_then_a_lower_bound() -> None:
    prompts = gsp_prompts(32, 4, seed=1)
    small = OfferedPrefixes(4096)
    for p in prompts:
        small.offer(p)
    assert small.sketch_tokens <= 4096 * 1.25  # the tree's inline hard bound
    assert 0 < small.ideal_hit_rate < ideal_hit_rate(prompts, 1)
    with pytest.raises(ValueError):
        OfferedPrefixes(0)


def test_a_repeated_prompt_counts_all_but_its_last_token() -> None:
    s = OfferedPrefixes(1 << 16)
    assert s.offer([1, 2, 3, 4]) == 0
    assert s.offer([1, 2, 3, 4]) == 3
    assert s.offer([]) == 0 and s.prompts == 2


def test_the_guard_trips_after_mismatches_in_a_row_and_clears_after_agreement() -> None:
    g = FidelityGuard(trip_after=3, clear_after=4)
    assert g.check(100, 100) is None
    assert g.check(100, 101) is None and g.check(100, 101) is None
    assert g.check(100, 100) is None  # an agreement breaks the run
    assert [g.check(100, 99) for _ in range(3)] == [None, None, True]
    assert g.tripped and g.mismatches == 5 and (g.last_sent, g.last_reported) == (100, 99)
    assert g.check(50, 0) is None  # a worker that does not report is no evidence
    assert [g.check(100, 100) for _ in range(4)] == [None, None, None, False]
    assert not g.tripped and g.checked == 11


def test_pool_quality_adds_successful_streams_only() -> None:
    q = PoolQuality()
    q.offered.offer([1, 2, 3])
    q.finish(sent_prompt=100, predicted_cached=64, reported_cached=48, success=True)
    q.finish(sent_prompt=100, predicted_cached=64, reported_cached=0, success=False)
    snap = q.snapshot()
    assert snap["finished"] == 1 and snap["prompt_tokens"] == 100
    assert snap["achieved_hit_rate"] == 0.48 and snap["predicted_hit_rate"] == 0.64
    assert snap["offered_prompt_tokens"] == 3 and snap["load_only"] is False


def test_a_load_only_model_ignores_the_tree() -> None:
    p = CacheAwarePolicy(eviction_interval_s=0)
    ws = views(4)
    system = tokens(1000, 1)
    p.on_dispatch(req(system + tokens(20, 2)), Decision("w3", "test"))
    r = req(system + tokens(20, 3))
    assert p.select(r, ws).worker_id == "w3"
    p.set_load_only("", True)
    d = p.select(r, ws)
    assert d.reason == "no_match" and d.predicted_cached_tokens == 0
    assert p.quality()["load_only_models"] == [""]
    p.set_load_only("", False)
    assert p.select(r, ws).worker_id == "w3"


def test_a_worker_whose_page_size_or_capacity_changes_loses_its_tree_share() -> None:
    p = CacheAwarePolicy(eviction_interval_s=0)
    ws = views(2, kv_capacity_tokens=100_000, page_size=16)
    p.on_workers_changed(ws)
    system = tokens(1024, 4)
    p.on_dispatch(req(system), Decision("w0", "test"))
    p.on_dispatch(req(system), Decision("w1", "test"))
    restarted = [ws[0], views(2, kv_capacity_tokens=50_000, page_size=16)[1]]
    p.on_workers_changed(restarted)
    assert p.tree().match(system).per_worker == {"w0": 1024}
    assert p.stats.worker_resets == 1
    assert p.tree().worker_budget("w1") == 50_000
    assert p.quality()["worker_resets"] == 1


def test_policy_quality_shows_the_queue_weight_and_how_concentrated_the_prefixes_are() -> None:
    p = CacheAwarePolicy(eviction_interval_s=0)
    p.on_workers_changed(views(8))
    q = p.quality()
    assert q["hottest_prefix_load"] is None and q["queued_prefill_weight"] == 1.0  # nothing seen yet
    for i in range(400):
        p.hot.observe(10_000 + i % 64)
    q = p.quality()
    assert q["hottest_prefix_load"] < 1.0 and q["queued_prefill_weight"] == DEFAULT_SPREAD_PREFILL_WEIGHT


def test_policy_quality_shows_the_decode_fill() -> None:
    p = CacheAwarePolicy(eviction_interval_s=0)
    assert p.quality()["decode_fill"] == 1.0  # exact lengths until shown otherwise
    for i in range(32):
        p.on_decoded(req(list(range(i, i + 8)), max_new_tokens=1024), 128)
    assert p.quality()["decode_fill"] == 0.125


def test_policy_quality_shows_the_share_of_traffic_on_prefixes_that_are_not_hot() -> None:
    p = CacheAwarePolicy(eviction_interval_s=0)
    p.on_workers_changed(views(16))
    assert p.quality()["cold_share"] == 1.0
    for i in range(512):
        p.hot.observe(i % 8, 16)  # 8 prefixes on 16 workers: all of them hot
    q = p.quality()
    assert q["cold_share"] < 0.05 and q["queued_prefill_weight"] == DEFAULT_SPREAD_PREFILL_WEIGHT
    assert {h["replicas"] for h in q["hot_prefixes"]} == {2}
