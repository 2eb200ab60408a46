"""oracle: cache_aware's cost over the workers' true caches (real sim radix caches here)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gateway.policies import POLICY_NAMES, PolicyConfig, make_policy
from gateway.policies.base import Decision, RouteRequest, WorkerView
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.oracle import OraclePolicy
from gateway_lab.sim.radix_cache import RadixCache

from .helpers import req, tokens, views, with_load

PAGE = 16


class Caches:
    """One real simulated-worker radix cache per worker url, and the oracle's reader."""

    def __init__(self, ws: list[WorkerView], capacity: int = 1 << 16) -> None:
        self.by_url = {w.url: RadixCache(PAGE, capacity) for w in ws}
        self.reads = 0

    def hold(self, w: WorkerView, ids: Sequence[int]) -> None:
        cache = self.by_url[w.url]
        assert cache.alloc(len(ids) - len(ids) % PAGE)
        cache.insert(ids, private_covered=len(ids) - len(ids) % PAGE)

    def cached_length(self, url: str, ids: Sequence[int]) -> int:
        self.reads += 1
        return self.by_url[url].peek_prefix_len(ids, len(ids) - 1)


def paged(ws: list[WorkerView]) -> list[WorkerView]:
    from dataclasses import replace

    return [replace(w, page_size=PAGE) for w in ws]


def send(p: CacheAwarePolicy, r: RouteRequest, ws: list[WorkerView]) -> Decision:
    d = p.select(r, ws)
    p.on_dispatch(r, d)
    return d


def test_follows_the_true_cache_the_tree_never_saw() -> None:
    ws = paged(views(4))
    caches = Caches(ws)
    system = tokens(512, seed=1)
    caches.hold(ws[2], system + tokens(32, seed=2))  # warmed by someone else: no dispatch seen
    oracle = OraclePolicy(caches.cached_length)
    guess = CacheAwarePolicy(eviction_interval_s=0)
    r = req(system + tokens(64, seed=3))
    d = oracle.select(r, ws)
    assert d.worker_id == "w2" and d.reason == "cache_hit" and d.predicted_cached_tokens == 512
    assert guess.select(r, ws).reason == "no_match"  # the tree cannot know


def test_cap_at_prompt_minus_one_and_whole_pages() -> None:
    ws = paged(views(2))
    caches = Caches(ws)
    prompt = tokens(64, seed=4)  # exactly 4 pages, all cached
    caches.hold(ws[1], prompt)
    d = OraclePolicy(caches.cached_length).select(req(prompt), ws)
    # the worker recomputes the last token, so only 3 whole pages count, as the sim reports
    assert d.worker_id == "w1" and d.predicted_cached_tokens == 48


def test_in_flight_prompts_count_until_they_finish() -> None:
    ws = paged(views(4))
    caches = Caches(ws)
    oracle = OraclePolicy(caches.cached_length)
    system = tokens(1024, seed=5)
    first = req(system + tokens(64, seed=6), request_id="a")
    d1 = send(oracle, first, ws)
    ws = with_load(ws, d1.worker_id, in_flight=1, queued_prefill_tokens=0)
    # the cache is still cold, but the worker will hold the system prompt once it prefills
    second = req(system + tokens(64, seed=7), request_id="b")
    d2 = oracle.select(second, ws)
    assert d2.worker_id == d1.worker_id and d2.predicted_cached_tokens == 1024
    oracle.on_finish(first, d1.worker_id, 0, False)  # failed before caching anything
    assert oracle.select(second, ws).predicted_cached_tokens == 0


def test_load_still_outweighs_a_cached_prefix() -> None:
    ws = paged(views(3))
    caches = Caches(ws)
    system = tokens(256, seed=8)
    caches.hold(ws[0], system)
    busy = with_load(ws, "w0", in_flight=40, queued_prefill_tokens=20_000)
    d = OraclePolicy(caches.cached_length).select(req(system + tokens(32, seed=9)), busy)
    assert d.worker_id != "w0" and d.reason == "load_balanced"


def test_unavailable_and_excluded_workers_are_not_read() -> None:
    ws = paged(views(3))
    caches = Caches(ws)
    system = tokens(256, seed=10)
    caches.hold(ws[1], system)
    ws = with_load(ws, "w1", available=False)
    d = OraclePolicy(caches.cached_length).select(req(system + tokens(32, seed=11), exclude=frozenset({"w0"})), ws)
    assert d.worker_id == "w2" and caches.reads == 1  # only w2 was asked


def test_not_a_production_policy() -> None:
    assert "oracle" not in POLICY_NAMES
    with pytest.raises(ValueError):
        make_policy(PolicyConfig(policy="oracle"))
