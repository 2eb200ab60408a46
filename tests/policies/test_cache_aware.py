"""cache_aware: cost behaviour on the known failure modes, tree upkeep (the background evictor too), reasons, explain."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest

from gateway.policies import explain
from gateway.policies.base import Decision, LoadSnapshot, RouteRequest, WorkerView
from gateway.policies.cache_aware import DEFAULT_SPREAD_PREFILL_WEIGHT, CacheAwarePolicy, CostKnobs
from gateway.policies.hot_prefix import MIN_REQUESTS, sure_count

from .helpers import req, tokens, views, with_load


def policy(**kw: object) -> CacheAwarePolicy:
    kw.setdefault("eviction_interval_s", 0)
    return CacheAwarePolicy(**kw)  # type: ignore[arg-type]


def send(p: CacheAwarePolicy, r: RouteRequest, ws: list[WorkerView]) -> Decision:
    d = p.select(r, ws)
    p.on_dispatch(r, d)
    return d


@dataclass
class Pool:
    """The router's side of the bookkeeping, just enough to drive the policy."""

    n: int
    in_flight: Counter[str] = field(default_factory=Counter)
    queued: Counter[str] = field(default_factory=Counter)
    decode: Counter[str] = field(default_factory=Counter)

    def views(self) -> list[WorkerView]:
        return [
            replace(
                w,
                in_flight=self.in_flight[w.worker_id],
                queued_prefill_tokens=self.queued[w.worker_id],
                running_decode_tokens=self.decode[w.worker_id],
            )
            for w in views(self.n)
        ]

    def dispatch(self, p: CacheAwarePolicy, r: RouteRequest, decode: int = 256) -> Decision:
        d = send(p, r, self.views())
        self.in_flight[d.worker_id] += 1
        self.queued[d.worker_id] += len(r.token_ids)
        self.decode[d.worker_id] += decode
        return d

    def first_token(self, worker: str, prompt: int) -> None:
        self.queued[worker] -= prompt


SYSTEM = tokens(2000, 1)


def test_idle_holder_gets_the_hit() -> None:
    p = policy()
    ws = views(4)
    first = send(p, req(SYSTEM + tokens(100, 2)), ws)
    assert first.reason == "no_match"
    d = p.select(req(SYSTEM + tokens(100, 3)), ws)
    assert (d.worker_id, d.reason, d.predicted_cached_tokens) == (first.worker_id, "cache_hit", 2000)


def test_hot_prefix_spills_when_the_holder_has_queued_work() -> None:
    p = policy()
    ws = views(4)
    hot = send(p, req(SYSTEM + tokens(100, 2)), ws).worker_id
    # the holder has 10 cold prompts waiting for prefill: 20K tokens ahead of ours
    loaded = with_load(ws, hot, in_flight=10, queued_prefill_tokens=21_000)
    d = p.select(req(SYSTEM + tokens(100, 3)), loaded)
    assert d.worker_id != hot and d.reason == "load_balanced"


def test_popular_prefix_spreads_over_the_pool_instead_of_piling_on_one_worker() -> None:
    p = policy()
    pool = Pool(4)
    picks: list[Decision] = []
    for i in range(80):
        r = req(SYSTEM + tokens(100, 100 + i), request_id=str(i))
        d = pool.dispatch(p, r)
        pool.first_token(d.worker_id, len(r.token_ids))  # prefilled at once; decode keeps running
        picks.append(d)
    counts = Counter(d.worker_id for d in picks)
    assert len(counts) == 4, counts
    assert max(counts.values()) <= 2 * min(counts.values()), counts
    misses = sum(1 for d in picks if d.predicted_cached_tokens == 0)
    assert misses <= 4  # each worker pays the prefix once, then hits


def test_miss_goes_to_least_loaded_not_to_the_emptiest_tree() -> None:
    p = policy()
    ws = views(2)
    for i in range(30):  # w0's tree is big, w1's is empty
        p.on_dispatch(req(tokens(500, 200 + i)), Decision("w0", "test"))
    novel = req(tokens(500, 999))
    busy_w1 = with_load(ws, "w1", in_flight=3, queued_prefill_tokens=1500)
    d = p.select(novel, busy_w1)
    assert (d.worker_id, d.reason) == ("w0", "no_match")
    busy_w0 = with_load(ws, "w0", in_flight=3, queued_prefill_tokens=1500)
    assert p.select(novel, busy_w0).worker_id == "w1"


def test_misses_balance_by_load_over_an_idle_pool() -> None:
    p = policy()
    pool = Pool(4)
    picks = Counter(pool.dispatch(p, req(tokens(300, 300 + i))).worker_id for i in range(40))
    assert picks == Counter({f"w{i}": 10 for i in range(4)})


def test_new_worker_warms_up_while_others_are_busy() -> None:
    p = policy()
    ws = views(2)
    for w in ("w0", "w1"):
        p.on_dispatch(req(SYSTEM + tokens(50, 5)), Decision(w, "test"))
    newcomer = WorkerView("w2", "grpc://10.0.0.2:30000")
    busy = [replace(w, in_flight=8, queued_prefill_tokens=4_000, running_decode_tokens=2_000) for w in ws]
    p.on_workers_changed([*busy, newcomer])
    d = send(p, req(SYSTEM + tokens(50, 6)), [*busy, newcomer])
    assert d.worker_id == "w2" and d.reason == "load_balanced"
    # now w2 holds the prefix too and, being idle, gets the next one as a hit
    d2 = p.select(req(SYSTEM + tokens(50, 7)), [*busy, newcomer])
    assert (d2.worker_id, d2.reason) == ("w2", "cache_hit")


def test_match_is_counted_in_whole_pages() -> None:
    p = policy()
    ws = views(2, page_size=16)
    prompt = tokens(37, 8)
    p.on_dispatch(req(prompt), Decision("w1", "test"))
    d = p.select(req(prompt + tokens(20, 9)), ws)
    assert (d.worker_id, d.predicted_cached_tokens) == ("w1", 32)
    # less than one page held: no credit, chosen by load (rotating start)
    short = tokens(10, 10)
    p.on_dispatch(req(short), Decision("w0", "test"))
    assert p.select(req([*short, 1]), ws).reason == "cache_miss_balanced"


def test_the_tree_claims_whole_pages_only_and_keeps_what_the_worker_keeps() -> None:
    """A paged worker keeps no partial last page, so neither does the tree: six 40-token
    prompts on 16-token pages are 192 tokens of KV, which a 200-token budget holds. Had
    the tree claimed the tails (240 tokens) it would have evicted the first prompts while
    the worker still held them, and sent their next turns elsewhere."""
    p = policy(hot_prefix_min_tokens=0)
    ws = views(2, page_size=16, kv_capacity_tokens=200)
    p.on_workers_changed(ws)
    prompts = [tokens(40, 60 + i) for i in range(6)]
    for pr in prompts:
        p.on_dispatch(req(pr), Decision("w0", "test"))
    tree = p.tree()
    assert tree.worker_tokens("w0") == 6 * 32
    for pr in prompts:
        assert tree.match(pr).per_worker == {"w0": 32}
        d = p.select(req(pr + tokens(20, 70)), ws)
        assert (d.worker_id, d.reason, d.predicted_cached_tokens) == ("w0", "cache_hit", 32)
    tree.validate()


def test_budget_comes_from_kv_capacity_and_holds() -> None:
    p = policy(budget_fraction=0.5)
    ws = views(2, kv_capacity_tokens=1_000)
    p.on_workers_changed(ws)
    for i in range(40):
        send(p, req(tokens(100, 400 + i)), ws)
    tree = p.tree()
    assert tree.worker_budget("w0") == 500
    assert all(v <= 500 for v in tree.stats().worker_tokens.values())
    tree.validate()


def test_unknown_capacity_uses_the_default_budget() -> None:
    p = policy(default_budget_tokens=300)
    p.on_workers_changed(views(1))
    assert p.tree().worker_budget("w0") == 300


def test_removed_worker_leaves_the_trees() -> None:
    p = policy()
    ws = views(3)
    p.on_workers_changed(ws)
    for w in ("w0", "w1", "w2"):
        p.on_dispatch(req([*SYSTEM, 7], model="m"), Decision(w, "test"))
    p.on_workers_changed(ws[:1] + ws[2:])
    tree = p.tree("m")
    assert "w1" not in tree.workers()
    assert all("w1" not in n.workers for n in tree.nodes())
    tree.validate()


def test_unavailable_holder_means_a_balanced_miss() -> None:
    p = policy()
    p.on_dispatch(req(SYSTEM), Decision("w0", "test"))
    d = p.select(req([*SYSTEM, 1]), with_load(views(3), "w0", available=False))
    assert d.reason == "cache_miss_balanced" and d.worker_id != "w0"


def test_trees_are_per_model() -> None:
    p = policy()
    p.on_dispatch(req(SYSTEM, model="a"), Decision("w1", "test"))
    assert p.select(req(SYSTEM, model="a"), views(2)).reason == "cache_hit"
    assert p.select(req(SYSTEM, model="b"), views(2)).reason == "no_match"


def test_queue_estimate_counts_only_the_uncached_part_of_queued_prompts() -> None:
    p = policy()
    ws = views(2)
    p.on_dispatch(req([*SYSTEM, 1], request_id="a"), Decision("w0", "test"))
    hit = req([*SYSTEM, 2], request_id="b")
    p.on_dispatch(hit, p.select(hit, ws))  # predicted 2000 of 2001 cached
    queued = with_load(ws, "w0", queued_prefill_tokens=4002, in_flight=2)
    row = explain(p, req([*SYSTEM, 3]), queued)["workers"]["w0"]
    assert row["queued_uncached_estimate"] == pytest.approx(4002 * (1 - 2000 / 4002), abs=0.2)
    # the worker's own (fresh) figure adds what exceeds our own queued prompts (traffic we
    # did not send); a stale one is ignored
    fresh = with_load(queued, "w0", loads=LoadSnapshot(num_waiting_uncached_tokens=9_000, age_s=1))
    assert explain(p, req([5]), fresh)["workers"]["w0"]["queued_uncached_estimate"] == pytest.approx(
        2002 + (9_000 - 4002), abs=0.2
    )
    # a burst of our own hits, priced by the worker as misses before the first is prefilled,
    # adds nothing: the worker cannot be waiting on more than we sent it
    ours = with_load(queued, "w0", loads=LoadSnapshot(num_waiting_uncached_tokens=4002, age_s=1))
    assert explain(p, req([5]), ours)["workers"]["w0"]["queued_uncached_estimate"] == pytest.approx(2002, abs=0.2)
    # in a process set, what the siblings sent it (counted at their uncached part in the
    # remote prefill already) is not foreign either
    sibling = with_load(fresh, "w0", remote_prefill_tokens=300, remote_queued_prompt_tokens=4000)
    assert explain(p, req([5]), sibling)["workers"]["w0"]["queued_uncached_estimate"] == pytest.approx(
        2002 + 300 + (9_000 - 4002 - 4000), abs=0.2
    )
    stale = with_load(queued, "w0", loads=LoadSnapshot(num_waiting_uncached_tokens=9_000, age_s=60))
    assert explain(p, req([5]), stale)["workers"]["w0"]["queued_uncached_estimate"] < 9_000
    p.on_finish(hit, "w0", 1990, True)
    p.on_finish(req([0], request_id="a"), "w0", 0, True)
    assert p.stats.finished == 2 and p.stats.predicted_tokens == 2000
    assert p.stats.reported_tokens == 1990
    assert p._sums == {}


def test_multiplicative_form_weighs_uncached_prefill_by_batch_size() -> None:
    p = policy(cost=CostKnobs(form="multiplicative"))
    ws = views(2)
    p.on_dispatch(req(SYSTEM), Decision("w0", "test"))
    assert p.select(req([*SYSTEM, 1]), ws).worker_id == "w0"
    # (1 + 1) * (1 + 3000) > (2001 + 1) * 1
    assert p.select(req([*SYSTEM, 1]), with_load(ws, "w0", in_flight=3000)).worker_id == "w1"
    with pytest.raises(ValueError):
        CostKnobs(form="bogus")


def test_target_worker_is_recorded_in_the_tree() -> None:
    p = policy()
    d = send(p, req(SYSTEM, target_worker="w2"), views(3))
    assert (d.worker_id, d.reason, d.predicted_cached_tokens) == ("w2", "target_worker", 0)
    d2 = p.select(req(SYSTEM, target_worker="w2"), views(3))
    assert d2.predicted_cached_tokens == 2000
    assert p.select(req(SYSTEM), views(3)).worker_id == "w2"


def test_explain_is_per_worker_and_changes_nothing() -> None:
    p = policy()
    ws = views(3)
    send(p, req(SYSTEM), ws)
    before = p.tree().stats()
    turn = p._turn
    info = explain(p, req([*SYSTEM, 4]), ws)
    assert info["policy"] == "cache_aware" and info["reason"] == "cache_hit"
    rows = info["workers"]
    assert set(rows) == {"w0", "w1", "w2"}
    chosen = rows[info["choice"]]
    assert chosen["predicted_cached_tokens"] == 2000 and chosen["cost"] == 1
    assert all("cost" in r and "tree_budget" in r for r in rows.values())
    assert p.tree().stats() == before and p._turn == turn


# ------------------------------------------------------------------- closed loop
def test_a_reported_miss_cuts_the_workers_stale_claims() -> None:
    p = policy(hot_prefix_min_tokens=0)
    ws = views(2, page_size=16)
    for i in range(3):  # w0 was sent three prompts of the group
        p.on_dispatch(req(SYSTEM + tokens(100, 10 + i), request_id=f"old{i}"), Decision("w0", "test"))
        p.on_finish(req(SYSTEM + tokens(100, 10 + i), request_id=f"old{i}"), "w0", 0, True)
    r = req(SYSTEM + tokens(100, 20), request_id="r")
    d = send(p, r, ws)
    assert (d.worker_id, d.predicted_cached_tokens) == ("w0", 2000)
    # ... but the worker had evicted all of it but the first two pages
    p.on_finish(r, "w0", 32, True)
    assert p.stats.under_predicted == 1 and p.stats.corrected_tokens == 300
    tree = p.tree()
    assert tree.match(SYSTEM + tokens(100, 10)).per_worker == {"w0": 2000}  # via the fresh prompt only
    assert tree.match(SYSTEM + tokens(100, 20)).per_worker == {"w0": 2096}
    tree.validate()


def test_a_report_above_the_prediction_is_recorded() -> None:
    p = policy(hot_prefix_min_tokens=0)
    ws = views(2, page_size=16)
    r = req(SYSTEM + tokens(100, 30), request_id="r")
    d = send(p, r, ws)
    assert d.predicted_cached_tokens == 0
    p.tree().remove_prefix(r.token_ids, d.worker_id)  # the tree forgot (budget) what the worker holds
    p.on_finish(r, d.worker_id, 2000, True)
    assert p.stats.over_predicted == 1 and p.stats.learned_tokens == 2000
    assert p.tree().match(SYSTEM).per_worker == {d.worker_id: 2000}


def test_failures_and_the_open_loop_leave_the_tree_alone() -> None:
    for closed, fail in ((True, True), (False, False)):
        p = policy(hot_prefix_min_tokens=0, closed_loop=closed)
        old = req(SYSTEM + tokens(100, 40), request_id="old")
        p.on_dispatch(old, Decision("w0", "test"))
        r = req(SYSTEM + tokens(100, 41), request_id="r")
        send(p, r, views(1))
        p.on_finish(r, "w0", 0, not fail)
        assert p.tree().match(old.token_ids).per_worker == {"w0": 2100}
        assert p.stats.corrected_tokens == 0


# ------------------------------------------------------------- hot-prefix replication
def test_a_hot_prefix_is_held_on_k_workers_in_proportion_to_its_share() -> None:
    p = policy()
    pool = Pool(8)
    hot_sys, picks = tokens(1024, 77), Counter[str]()
    cold = [tokens(1024, 500 + g) for g in range(24)]
    running: list[tuple[RouteRequest, Decision]] = []
    for i in range(800):
        # a quarter of the traffic shares one system prompt: ceil(0.25 * 8 + 1/4) = 3 holders
        system = hot_sys if i % 4 == 0 else cold[i % 24]
        r = req(system + tokens(64, 10_000 + i), request_id=str(i))
        d = pool.dispatch(p, r, decode=256)
        running.append((r, d))
        if len(running) > 32:  # closed loop, 32 in flight: the oldest finishes
            done, dd = running.pop(0)
            pool.first_token(dd.worker_id, len(done.token_ids))
            pool.in_flight[dd.worker_id] -= 1
            pool.decode[dd.worker_id] -= 256
            p.on_finish(done, dd.worker_id, dd.predicted_cached_tokens, True)
        if system is hot_sys and i >= 400:
            picks[d.worker_id] += 1
    key = p._hot_key(req(hot_sys + tokens(64, 1)), 1024)
    assert key is not None
    assert p.hot.replicas(key, 8) == 3
    holders = p.hot.holders(key)
    assert set(picks) == set(holders[:3]), (picks, holders)  # spread over the three holders only
    assert min(picks.values()) >= 15, picks
    without = policy(hot_prefix_min_tokens=0)
    pool, spread, running = Pool(8), Counter[str](), []
    for i in range(800):
        system = hot_sys if i % 4 == 0 else cold[i % 24]
        r = req(system + tokens(64, 10_000 + i), request_id=str(i))
        d = pool.dispatch(without, r, decode=256)
        running.append((r, d))
        if len(running) > 32:
            done, dd = running.pop(0)
            pool.first_token(dd.worker_id, len(done.token_ids))
            pool.in_flight[dd.worker_id] -= 1
            pool.decode[dd.worker_id] -= 256
            without.on_finish(done, dd.worker_id, dd.predicted_cached_tokens, True)
        if system is hot_sys and i >= 400:
            spread[d.worker_id] += 1
    # without replication every spill lands wherever is cheapest: it scatters over the pool
    assert len(spread) > 3, spread


def test_replicas_shrink_when_the_load_falls() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    hp = HotPrefixes(window=64)
    for i in range(200):
        hp.observe(1 if i % 2 == 0 else 100 + i)
    assert hp.replicas(1, 8) == 5  # half the traffic: four workers' shares, plus headroom
    for i in range(400):
        hp.observe(1 if i % 16 == 0 else 1000 + i)
    assert hp.replicas(1, 8) == 1
    assert hp.hot(8) == []


def test_hot_prefix_tracking_is_bounded_and_forgets_departed_workers() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    hp = HotPrefixes(window=64, max_tracked=32)
    for i in range(1000):
        hp.observe(i)
    assert len(hp) <= 32
    hp.add_holder(5, "w0")
    hp.add_holder(5, "w1")
    hp.drop_workers(["w0"])
    assert hp.holders(5) == ["w1"]
    assert hp.replicas(5, 1) == 1
    with pytest.raises(ValueError):
        HotPrefixes(window=0)


def test_short_shared_prefixes_are_not_replicated() -> None:
    p = policy()  # hot_prefix_min_tokens 256: a 64-token chat template shared by all is not hot
    ws = views(4)
    template = tokens(64, 3)
    for i in range(200):
        r = req(template + tokens(300, 900 + i), request_id=str(i))
        d = send(p, r, ws)
        assert d.reason != "hot_prefix"
    assert p.hot.hot(4) == []


def _hot_setup() -> tuple[CacheAwarePolicy, list[int], list[str]]:
    """A policy whose tree holds one system prompt on w0-w2, which carries 40% of the traffic."""
    p = policy(cost=CostKnobs(slot_step_tokens=256))
    ws = views(8, kv_capacity_tokens=1 << 20, page_size=16)
    p.on_workers_changed(ws)
    system = tokens(1024, 91)
    for h in ("w0", "w1", "w2"):
        p.tree("").insert(system + tokens(64, 7), h)
    key = p._hot_key(req(system + tokens(64, 1)), 1024)
    assert key is not None
    for i in range(300):
        p.hot.observe(key if i % 5 < 2 else 10_000 + i)
    for h in ("w0", "w1", "w2", "w3"):
        p.hot.add_holder(key, h)
    assert p.hot.replicas(key, 8) == 4
    return p, system, ["w0", "w1", "w2", "w3"]


def test_a_hot_prefix_overflows_its_holders_only_when_all_their_running_slots_are_taken() -> None:
    p, system, holders = _hot_setup()
    ws = views(8, kv_capacity_tokens=1 << 20, page_size=16, max_running_requests=16, in_flight=4,
               running_decode_tokens=4 * 128)
    for h in holders:  # every holder runs 16 of 16: a request sent there waits for a slot
        ws = with_load(ws, h, in_flight=16, running_decode_tokens=16 * 128)
    d = p.select(req(system + tokens(64, 2)), ws)
    assert d.reason == "hot_prefix_overflow" and d.worker_id not in holders, d
    burst = [replace(w, in_flight=max(w.in_flight, 40)) for w in ws]  # every worker full: stay on the holders
    assert p.select(req(system + tokens(64, 4)), burst).reason == "hot_prefix"
    ws = with_load(ws, "w1", in_flight=15)  # one holder has a free slot: stay on the holders
    d = p.select(req(system + tokens(64, 3)), ws)
    assert d.reason == "hot_prefix" and d.worker_id == "w1", d


def test_without_a_known_slot_cap_or_with_the_term_off_hot_prefixes_stay_on_their_holders() -> None:
    assert CostKnobs().slot_step_tokens == 0  # off by default
    p, system, holders = _hot_setup()
    ws = views(8, kv_capacity_tokens=1 << 20, page_size=16, in_flight=4)  # max_running_requests unknown
    for h in holders:
        ws = with_load(ws, h, in_flight=16)
    assert p.select(req(system + tokens(64, 2)), ws).reason == "hot_prefix"
    off = CacheAwarePolicy(eviction_interval_s=0, cost=CostKnobs(slot_step_tokens=0))
    off.on_workers_changed(ws)
    for h in ("w0", "w1", "w2"):
        off.tree("").insert(system + tokens(64, 7), h)
    key = off._hot_key(req(system + tokens(64, 1)), 1024)
    assert key is not None
    for i in range(300):
        off.hot.observe(key if i % 5 < 2 else 10_000 + i)
    for h in holders:
        off.hot.add_holder(key, h)
    capped = [replace(w, max_running_requests=16) for w in ws]
    assert off.select(req(system + tokens(64, 2)), capped).reason == "hot_prefix"


def test_the_slot_wait_counts_only_for_a_worker_whose_slots_are_all_taken() -> None:
    p = policy(cost=CostKnobs(slot_step_tokens=256))
    ws = views(2, kv_capacity_tokens=1 << 20, page_size=16, max_running_requests=16)
    system = tokens(1024, 5)
    p.on_workers_changed(ws)
    p.tree("").insert(system + tokens(64, 7), "w0")
    full = with_load(ws, "w0", in_flight=16, running_decode_tokens=16 * 128)
    rows: dict[str, dict[str, object]] = {}
    p._score(req(system + tokens(64, 1)), full, 0, rows, slot_aware=True)
    plain: dict[str, dict[str, object]] = {}
    p._score(req(system + tokens(64, 1)), full, 0, plain)
    assert rows["w0"]["cost"] > plain["w0"]["cost"] and rows["w1"]["cost"] == plain["w1"]["cost"]
    free = with_load(ws, "w0", in_flight=15, running_decode_tokens=15 * 128)
    rows, plain = {}, {}
    p._score(req(system + tokens(64, 1)), free, 0, rows, slot_aware=True)
    p._score(req(system + tokens(64, 1)), free, 0, plain)
    assert rows["w0"]["cost"] == plain["w0"]["cost"]


def test_the_output_the_worker_caches_is_predicted_for_the_next_turn() -> None:
    p = policy(hot_prefix_min_tokens=0)
    ws = views(2, page_size=16)
    prompt = SYSTEM + tokens(100, 50)
    r = req(prompt, request_id="t1")
    d = send(p, r, ws)
    p.on_finish(r, d.worker_id, 0, True)
    output = tokens(64, 51)
    p.on_output(r, d.worker_id, output)
    whole = (len(prompt) + 64) // 16 * 16  # the worker caches whole pages of prompt + output
    follow = req(prompt + output + tokens(40, 52), request_id="t2")
    assert p.tree().match(follow.token_ids).per_worker == {d.worker_id: whole}
    assert send(p, follow, ws).worker_id == d.worker_id
    other = "w1" if d.worker_id == "w0" else "w0"
    p.on_output(r, "w9", output)  # a worker the tree does not know: nothing
    assert other not in p.tree().match(follow.token_ids).per_worker
    open_loop = policy(hot_prefix_min_tokens=0, learn_output=False)
    d2 = send(open_loop, r, ws)
    open_loop.on_output(r, d2.worker_id, output)
    assert open_loop.tree().match(follow.token_ids).per_worker == {d2.worker_id: len(prompt) // 16 * 16}


# ------------------------------------------------- queued-prefill weight adapts to concentration
def test_top_load_is_the_hottest_prefix_in_workers_shares() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    hp = HotPrefixes(window=256)
    assert hp.top_load(8) is None
    for i in range(15):
        hp.observe(i % 64)
    assert hp.top_load(8) is None  # too few requests seen for a share to mean anything
    hp.observe(15)
    assert hp.top_load(8) == 0.0  # 16 different prefixes: none seen twice
    for i in range(16, 2000):
        hp.observe(i % 64)  # 64 prefixes in turn: each 1/64 of the traffic
    load = hp.top_load(8)
    assert load is not None and 0 <= load < 0.2
    for i in range(2000):
        hp.observe(7 if i % 2 else 1000 + i)  # now one prefix carries half the requests
    load = hp.top_load(8)
    assert load is not None and 3.0 < load < 4.5
    assert load == pytest.approx(sure_count(hp.share(7) * hp._total) / hp._total * 8)  # its count less its noise


def test_a_hot_prefix_reads_as_hot_within_two_dozen_requests() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    hp = HotPrefixes(window=256)
    for i in range(24):
        hp.observe(7 if i % 2 == 0 else 100 + i)  # half of the requests share one prefix
    load = hp.top_load(8)
    assert load is not None and load > 1.25


def test_top_load_survives_trimming_the_tracked_keys() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    hp = HotPrefixes(window=64, max_tracked=16)
    for i in range(500):
        hp.observe(3 if i % 3 == 0 else 100 + i)
    assert len(hp) <= 16
    assert hp.top_load(4) == pytest.approx(sure_count(hp.share(3) * hp._total) / hp._total * 4)


def _prime(p: CacheAwarePolicy, hot: bool, n: int = 400) -> None:
    for i in range(n):
        p.hot.observe(1 if hot and i % 2 else 10_000 + i % 64)


def test_queued_prefill_weight_follows_how_concentrated_the_prefixes_are() -> None:
    p = policy()
    assert p.queued_prefill_weight(8) == 1.0  # nothing seen yet: balance first
    _prime(p, hot=False)
    assert p.queued_prefill_weight(8) == pytest.approx(DEFAULT_SPREAD_PREFILL_WEIGHT)  # 64 even prefixes: spread
    q = policy()
    _prime(q, hot=True)
    assert q.queued_prefill_weight(8) == pytest.approx(1.0)  # one prefix is half the traffic
    fixed = policy(cost=CostKnobs(prefill_weight=0.5, spread_prefill_weight=0.5))
    _prime(fixed, hot=True)
    assert fixed.queued_prefill_weight(8) == 0.5
    old = policy(cost=CostKnobs(spread_prefill_weight=1.0))
    _prime(old, hot=False)
    assert old.queued_prefill_weight(8) == 1.0
    with pytest.raises(ValueError):
        CostKnobs(spread_prefill_weight=-1)


def test_queued_prefill_weight_is_linear_around_one_workers_share() -> None:
    p = policy()
    # the hottest prefix at 1/6 of 9 workers' traffic, its noise discounted: inside the band
    for i in range(4000):
        p.hot.observe(1 if i % 6 == 0 else 10_000 + i % 512)
    load = p.hot.top_load(9)
    assert load is not None and 1.0 < load < 1.25
    lo = DEFAULT_SPREAD_PREFILL_WEIGHT
    assert p.queued_prefill_weight(9) == pytest.approx(lo + (1.0 - lo) * (load - 1.0) / 0.25)


def test_a_holder_keeps_its_prefix_longer_while_no_prefix_is_hot() -> None:
    """Queued prefill worth 1.5x and 3x the cached prefix: under spread traffic the holder
    keeps the request; once some other prefix is hot (weight 1.0) it spills."""
    for queued in (3_000, 6_000):
        for hot, kept in ((False, True), (True, False)):
            p = policy()
            _prime(p, hot=hot)
            ws = views(4)
            holder = send(p, req(SYSTEM + tokens(100, 2)), ws).worker_id
            loaded = with_load(ws, holder, queued_prefill_tokens=queued)
            d = p.select(req(SYSTEM + tokens(100, 3)), loaded)
            assert (d.worker_id == holder) is kept, (queued, hot, d)
            assert d.reason == ("cache_hit" if kept else "load_balanced")


def test_a_conversation_turn_stays_behind_one_long_queued_prompt_under_spread_traffic() -> None:
    """The conversation trace's lost hits: a turn whose history (600 tokens) one worker holds,
    that worker prefilling one other 2,000-token prompt, another idle. A spill recomputes the
    history for a few milliseconds of this turn's wait and leaves it on two workers."""
    p = policy()
    _prime(p, hot=False)
    ws = views(4)
    history = tokens(600, 11)
    holder = send(p, req(history + tokens(40, 12)), ws).worker_id
    loaded = with_load(ws, holder, queued_prefill_tokens=2_000, in_flight=1)
    d = p.select(req(history + tokens(40, 12) + tokens(60, 13)), loaded)
    assert d.worker_id == holder and d.reason == "cache_hit", d
    # a queue many times the history still sends it elsewhere
    d = p.select(req(history + tokens(40, 12) + tokens(60, 13)), with_load(ws, holder, queued_prefill_tokens=8_000))
    assert d.worker_id != holder and d.reason == "load_balanced", d


def _turn_setup(stick: float = 4096.0) -> tuple[CacheAwarePolicy, list[WorkerView], str, list[int]]:
    """A conversation's history (640 tokens) on one worker of four, spread traffic."""
    p = policy(cost=CostKnobs(stick_queue_tokens=stick))
    _prime(p, hot=False)
    ws = views(4, max_running_requests=8)
    history = tokens(600, 21) + tokens(40, 22)
    holder = send(p, req(history), ws).worker_id
    return p, ws, holder, history + tokens(60, 23)


def test_a_holder_with_room_keeps_the_turn_the_cost_would_spill() -> None:
    """Its history saves 640 tokens, 3,000 tokens of another prompt are queued on it: at the
    spread weight the cost sends the turn to an idle worker (and copies the history there);
    with a free slot and the queue under ``stick_queue_tokens`` the holder keeps it."""
    for stick, kept in ((4096.0, True), (0.0, False)):
        p, ws, holder, turn = _turn_setup(stick)
        d = p.select(req(turn), with_load(ws, holder, queued_prefill_tokens=3_000, in_flight=1))
        assert (d.worker_id == holder) is kept, (stick, d)
        assert d.reason == ("cache_hit" if kept else "load_balanced")
        assert d.predicted_cached_tokens == (640 if kept else 0)


def test_a_holder_without_room_lets_the_cost_decide() -> None:
    """Every running slot taken, or more queued than ``stick_queue_tokens``: the turn spills
    as the cost says."""
    p, ws, holder, turn = _turn_setup()
    full = with_load(ws, holder, queued_prefill_tokens=3_000, in_flight=8)
    assert p.select(req(turn), full).worker_id != holder
    queued = with_load(ws, holder, queued_prefill_tokens=5_000, in_flight=1)
    assert p.select(req(turn), queued).worker_id != holder
    # no known slot cap counts as room
    p, _, holder, turn = _turn_setup()
    uncapped = with_load(views(4), holder, queued_prefill_tokens=3_000, in_flight=1)
    assert p.select(req(turn), uncapped).worker_id == holder


def test_a_whole_prompt_bound_sees_the_queue_the_estimate_prices_at_the_mean_miss() -> None:
    """The uncached estimate prices the holder's queue at its in-flight requests' mean miss
    share: with a cached turn in flight beside the history, 5,000 queued prompt tokens read
    as about 2,600, under ``stick_queue_tokens``, though one cold 4,096-token prompt may be
    most of them. Counted whole (``stick_whole_tokens``) they are over a 4,096 bound and the
    cost decides; under an 8,192 one the holder keeps the turn as before."""
    for whole, kept in ((0.0, True), (4096.0, False), (8192.0, True)):
        p = policy(cost=CostKnobs(stick_queue_tokens=4096.0, stick_whole_tokens=whole))
        _prime(p, hot=False)
        ws = views(4, max_running_requests=8)
        history = tokens(600, 21) + tokens(40, 22)
        holder = send(p, req(history, request_id="h"), ws).worker_id
        again = send(p, req(history + tokens(60, 24), request_id="again"), with_load(ws, holder, in_flight=1))
        assert again.worker_id == holder and again.predicted_cached_tokens == 640
        loaded = with_load(ws, holder, queued_prefill_tokens=5_000, in_flight=2)
        view = next(w for w in loaded if w.worker_id == holder)
        assert p.queued_uncached(view) < 4096 <= p.queued_whole(view) == 5_000
        d = p.select(req(history + tokens(60, 23)), loaded)
        assert (d.worker_id == holder) is kept, (whole, d)


def test_the_whole_count_adds_the_other_processes_prompts_and_the_polled_foreign_queue() -> None:
    p = policy()
    (w,) = views(1)
    assert p.queued_whole(replace(w, queued_prefill_tokens=300, remote_queued_prompt_tokens=200)) == 500
    polled = LoadSnapshot(num_waiting_uncached_tokens=900, age_s=0.1)
    assert p.queued_whole(replace(w, queued_prefill_tokens=300, loads=polled)) == 900  # 600 nobody here sent
    stale = LoadSnapshot(num_waiting_uncached_tokens=900, age_s=60.0)
    assert p.queued_whole(replace(w, queued_prefill_tokens=300, loads=stale)) == 300
    with pytest.raises(ValueError):
        CostKnobs(stick_whole_tokens=-1)


def test_once_a_prefix_is_hot_the_holder_does_not_stick() -> None:
    """At the full weight (one prefix hot) balance comes first: the same turn spills."""
    p, ws, holder, turn = _turn_setup()
    _prime(p, hot=True)
    assert p.queued_prefill_weight(4) == pytest.approx(1.0)
    d = p.select(req(turn), with_load(ws, holder, queued_prefill_tokens=3_000, in_flight=1))
    assert d.worker_id != holder and d.reason == "load_balanced", d
    with pytest.raises(ValueError):
        CostKnobs(stick_queue_tokens=-1)


def test_unrelated_prompts_read_as_spread_traffic() -> None:
    """Long prompts that share nothing (documents asked about once) key no prefix, yet they
    show the traffic is spread: after enough of them the spread weight holds, and a repeat
    of one stays with its holder behind a queue the full weight would have spilled it for."""
    p = policy()
    ws = views(4)
    for i in range(MIN_REQUESTS):
        send(p, req(tokens(1_000, 500 + i), request_id=str(i)), ws)
    assert p.queued_prefill_weight(4) == pytest.approx(DEFAULT_SPREAD_PREFILL_WEIGHT)
    doc = tokens(1_000, 900)
    holder = send(p, req(doc + tokens(20, 901), request_id="doc"), ws).worker_id
    d = p.select(req(doc + tokens(20, 902)), with_load(ws, holder, queued_prefill_tokens=2_000, in_flight=1))
    assert d.worker_id == holder and d.reason == "cache_hit", d
    # after only a few such requests there is no evidence yet: the full weight spills it
    early = policy()
    for i in range(8):
        send(early, req(tokens(1_000, 500 + i), request_id=str(i)), ws)
    assert early.queued_prefill_weight(4) == 1.0
    holder = send(early, req(doc + tokens(20, 901), request_id="doc"), ws).worker_id
    d = early.select(req(doc + tokens(20, 902)), with_load(ws, holder, queued_prefill_tokens=2_000, in_flight=1))
    assert d.worker_id != holder and d.reason == "load_balanced", d


def test_without_hot_prefix_tracking_the_weight_is_fixed() -> None:
    p = policy(hot_prefix_min_tokens=0)
    assert p.queued_prefill_weight(8) == 1.0


def test_evictor_sweep_skips_trees_with_nothing_new_and_trims_the_rest() -> None:
    from gateway.policies.cache_aware import _Evictor

    p = CacheAwarePolicy(default_budget_tokens=100, eviction_interval_s=3600, eviction_low_watermark=0.8)
    try:
        ws = views(1)
        p.on_workers_changed(ws)
        ev = _Evictor(p, 3600)  # driven by hand: sweep() is one wake-up of the thread
        assert ev.sweep() == 0 and ev.passes == 0  # no tree yet
        for i in range(11):
            send(p, req([7000 + i] * 10, request_id=str(i)), ws)
        tree = p.tree("")
        assert tree.worker_tokens("w0") == 110  # over budget, inside the inline hard bound
        assert ev.sweep() == 3 and ev.passes == 1  # down to the 0.8 watermark: 80 tokens
        assert tree.worker_tokens("w0") == 80
        assert ev.sweep() == 0 and ev.passes == 1  # nothing inserted since: not even a scan
        send(p, req([8000] * 10, request_id="x"), ws)
        assert ev.sweep() == 0 and ev.passes == 1  # 90: changed, looked at, within budget
        tree.validate()
    finally:
        p.close()


# --------------------------------------- all traffic on hot prefixes: no headroom, spread weight
def test_cold_share_is_the_traffic_not_on_hot_prefixes() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    hp = HotPrefixes(window=256)
    assert hp.cold_share() == 1.0  # nothing seen
    for i in range(15):
        hp.observe(1000 + i, 16)  # fewer requests than workers: each would read as hot
    assert hp.cold_share() == 1.0  # so no key is flagged before 16 requests
    for i in range(512):
        hp.observe(i % 8, 16)  # 8 prefixes on 16 workers: each carries two workers' shares
    assert hp.cold_share() == pytest.approx(0.0, abs=0.02)
    for i in range(2000):
        hp.observe(7 if i % 4 == 0 else 1000 + i % 64, 8)  # a quarter on one prefix, the rest spread
    assert hp.cold_share() == pytest.approx(0.75, abs=0.05)


def test_replicas_get_headroom_only_for_traffic_that_is_not_hot() -> None:
    from gateway.policies.hot_prefix import HotPrefixes

    even = HotPrefixes(window=256)
    for i in range(512):
        even.observe(i % 8, 16)
    # 8 equal prefixes, 16 workers: two holders each fill the pool; a third only recomputes
    assert [even.replicas(k, 16) for k in range(8)] == [2] * 8
    mixed = HotPrefixes(window=64)
    for i in range(400):
        mixed.observe(1 if i % 2 == 0 else 100 + i, 8)
    # half the traffic: four workers' shares; headroom for the other (cold) half of it
    assert mixed.replicas(1, 8) == 4
    assert mixed.cold_share() == pytest.approx(0.5, abs=0.05)


def test_the_spread_weight_holds_while_every_offered_prefix_is_hot() -> None:
    even = policy()
    for i in range(512):
        even.hot.observe(i % 8, 16)
    load = even.hot.top_load(16)
    assert load is not None and load > 1.25  # the hottest carries two workers' shares ...
    assert even.queued_prefill_weight(16) == pytest.approx(DEFAULT_SPREAD_PREFILL_WEIGHT)  # ... but so does every other one
    skewed = policy()
    for i in range(2000):
        skewed.hot.observe(7 if i % 4 == 0 else 1000 + i % 64, 8)
    assert skewed.queued_prefill_weight(8) == pytest.approx(1.0)  # one hot prefix among cold ones


def test_eight_groups_on_sixteen_workers_keep_about_two_holders_each() -> None:
    """The bench_overhead gsp burst's shape, scaled down in prompt size: 8 groups x 16 prompts
    all at once on 16 workers. The policy's own bookkeeping drives the load terms."""
    p = policy()
    pool = Pool(16)
    groups = [tokens(1024, 300 + g) for g in range(8)]
    holders: dict[int, set[str]] = {}
    for i in range(128):
        g = (i * 5 + i // 8) % 8
        r = req(groups[g] + tokens(64, 20_000 + i), request_id=str(i))
        d = pool.dispatch(p, r, decode=128)
        holders.setdefault(g, set()).add(d.worker_id)
    per_group = sorted(len(h) for h in holders.values())
    # n / G holders each; with half a worker of headroom per prefix it was three each (24
    # replicas on 16 workers, one more 1K-token prefill per group for no balance gained)
    assert per_group == [2] * 8, per_group
    assert max(pool.in_flight.values()) <= 1.25 * 128 / 16, pool.in_flight


def test_as_many_even_groups_as_workers_keep_one_holder_each_in_a_burst() -> None:
    """The zero-cost fleet's gsp burst: 16 groups x 12 prompts at once on 16 workers, none
    finished yet, each group seen once first, then in a shuffled order. Each group carries
    one worker's share: one holder per group is both the ideal and balanced. The luckiest
    groups' counts read as two or three workers' worth, which raised the queued-prefill
    weight and gave them replicas."""
    import random

    p = policy()
    pool = Pool(16)
    groups = [tokens(2048, 900 + g) for g in range(16)]
    order = [g for g in range(16) for _ in range(11)]
    random.Random(5).shuffle(order)
    holders: dict[int, set[str]] = {}
    for i, g in enumerate([*range(16), *order]):
        d = pool.dispatch(p, req(groups[g] + tokens(128, 40_000 + i), request_id=str(i)), decode=128)
        holders.setdefault(g, set()).add(d.worker_id)
    assert sorted(len(h) for h in holders.values()) == [1] * 16, holders
    assert max(pool.in_flight.values()) == 12, pool.in_flight


def test_a_hot_prefix_gets_a_new_holder_only_when_its_holders_are_busier() -> None:
    p = policy()
    ws = views(8)
    hot_sys = tokens(1024, 78)
    for i in range(120):  # one prefix carries a fifth of the traffic: 1.6 workers' worth, not beyond luck
        send(p, req((hot_sys if i % 5 == 0 else tokens(1024, 600 + i % 16)) + tokens(32, 70_000 + i), request_id=f"h{i}"), ws)
    r = req(hot_sys + tokens(32, 1), request_id="x")
    key = p._hot_key(r, 1024)
    assert key is not None and p.hot.replicas(key, 8) >= 2 and not p.hot.surely_hot(key, 8)
    holders = p.hot.holders(key)
    even = p.select(r, ws)  # the holders are no busier than the rest: no new holder
    assert even.worker_id in holders and even.reason == "hot_prefix", even
    busy = ws
    for h in holders:
        busy = with_load(busy, h, running_decode_tokens=8_000, in_flight=32)
    spilled = p.select(r, busy)  # they are: the cheapest non-holder joins the set
    assert spilled.worker_id not in holders and spilled.reason == "hot_prefix_new_replica", spilled


def test_a_remote_extension_continues_from_its_decisions_mark_or_inserts_whole() -> None:
    from gateway.policies.base import RemoteDecision, RemoteExtension, RemoteFinish
    from gateway.policies.radix_tree import pack

    p, q = CacheAwarePolicy(eviction_interval_s=0), CacheAwarePolicy(eviction_interval_s=0)
    ws = [WorkerView("a", "a"), WorkerView("b", "b")]
    for x in (p, q):
        x.on_workers_changed(ws)
    prompt, out = pack([1, 2, 3, 4]), pack([5, 6])
    mark = p.on_remote(RemoteDecision("a", "m", prompt))
    assert mark is not None
    q.on_remote(RemoteDecision("a", "m", prompt))
    p.on_remote(RemoteExtension("a", "m", mark, out, prompt + out))  # from the mark
    q.on_remote(RemoteDecision("a", "m", prompt + out))  # the whole sequence
    for stale in (None, mark):  # no mark; a mark that "b" never held (stands for nothing of b's)
        p.on_remote(RemoteExtension("b", "m", stale, out, prompt + out))
        q.on_remote(RemoteDecision("b", "m", prompt + out))
    assert p.on_remote(RemoteExtension("gone", "m", mark, out, prompt + out)) is None  # not in the pool
    assert p.on_remote(RemoteFinish("a", "m", 4, True)) is None and not p.remote_finishes

    def snap(x: CacheAwarePolicy) -> list[object]:
        return sorted((n.start, n.end, n.tokens, sorted(n.workers.items())) for n in x.tree("m").nodes())

    assert snap(p) == snap(q) and p.tree("m").clock == q.tree("m").clock
    p.tree("m").validate()


# ------------------------------------------------------------- synced replicas
def test_a_remote_decision_counts_in_the_hot_prefix_tracker_as_a_local_one() -> None:
    """Two replicas that each see half the traffic measure the fleet's prefix shares: a remote
    decision is observed under the key its sender used (the prompt's longest match before the
    insert); a learned output (no prompt count) is not a request. A hot prefix's replica set
    stays each process's own (its own decisions)."""
    from gateway.policies.base import RemoteDecision
    from gateway.policies.radix_tree import pack

    local, other = policy(), policy()
    ws = views(8)
    local.on_workers_changed(ws)
    other.on_workers_changed(ws)
    system = tokens(1024, 91)
    sent: tuple[list[Decision], list[Decision]] = ([], [])
    for i in range(200):
        r = req(system + tokens(64, 40_000 + i), request_id=str(i))
        sender, receiver = (other, local) if i % 2 else (local, other)
        d = send(sender, r, ws)
        sent[i % 2].append(d)
        receiver.on_remote(RemoteDecision(d.worker_id, "", pack(r.token_ids), len(r.token_ids), d.predicted_cached_tokens))
    key = local._hot_key(req(system + tokens(64, 1)), 1024)
    assert key is not None
    assert local.hot.share(key) == pytest.approx(other.hot.share(key)) and local.hot.share(key) > 0.9
    assert local.hot._tick == other.hot._tick == 199  # every request but the first (cold) counted once
    mine = {d.worker_id for d in sent[0]}
    assert set(local.hot.holders(key)) <= mine  # only workers this process chose
    before = local.hot._tick
    local.on_remote(RemoteDecision("w0", "", pack(system + tokens(80, 3)), 0, 0))  # an output extension
    assert local.hot._tick == before


def test_without_hot_prefix_tracking_a_remote_decision_only_feeds_the_tree() -> None:
    from gateway.policies.base import RemoteDecision
    from gateway.policies.radix_tree import pack

    p = policy(hot_prefix_min_tokens=0)
    p.on_workers_changed(views(4))
    toks = tokens(600, 5)
    for _ in range(3):
        p.on_remote(RemoteDecision("w2", "", pack(toks), len(toks), 0))
    assert len(p.hot) == 0 and p.tree().match(toks).per_worker.get("w2") == 600


def test_decode_fill_scales_the_decode_term_by_what_requests_really_decode() -> None:
    """max_tokens is an upper bound unless ignore_eos: a generous cap counted whole as decode
    owed outweighs every cached prefix. The fill (decoded / max_tokens of recent finishes)
    scales the term; exact lengths keep it at exactly 1."""
    exact = policy()
    for i in range(40):
        exact.on_decoded(RouteRequest(tokens(8, i), max_new_tokens=128), 128)
    assert exact.decode_fill == 1.0
    exact.on_decoded(RouteRequest(tokens(8, 99)), 50)  # no max_tokens known: nothing learned
    assert exact.decode_fill == 1.0

    p = policy(hot_prefix_min_tokens=0)
    for i in range(15):  # too few finishes to trust yet
        p.on_decoded(RouteRequest(tokens(8, i), max_new_tokens=1024), 128)
    assert p.decode_fill == 1.0
    p.on_decoded(RouteRequest(tokens(8, 15), max_new_tokens=1024), 128)
    assert p.decode_fill == pytest.approx(0.125)
    p.on_output(RouteRequest(tokens(8, 16), max_new_tokens=1024), "w0", list(range(1024)))  # the gateway's hook
    assert 0.125 < p.decode_fill < 0.2

    # The holder of a 2,000-token prefix runs 8 requests whose caps are 1,024 (real answers ~128);
    # an idle worker holds nothing. Counted whole (4,096 at weight 0.5) the holder loses its prefix;
    # at the learned fill it keeps it.
    prompt = SYSTEM + tokens(64, 7)
    for fill_learned in (False, True):
        q = policy(hot_prefix_min_tokens=0)
        if fill_learned:
            for i in range(64):
                q.on_decoded(RouteRequest(tokens(8, i), max_new_tokens=1024), 128)
        ws = views(2)
        assert send(q, RouteRequest(SYSTEM + tokens(64, 1)), ws).worker_id == "w0"  # w0 learns the prefix
        ws = with_load(ws, "w0", in_flight=8, running_decode_tokens=8 * 1024)
        d = q.select(RouteRequest(prompt), ws)
        assert d.worker_id == ("w0" if fill_learned else "w1"), (fill_learned, d)


def test_decode_fill_can_be_turned_off() -> None:
    from gateway.policies import PolicyConfig, close_policy, make_policy

    p = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0, decode_fill=False))
    try:
        assert isinstance(p, CacheAwarePolicy)
        for i in range(64):
            p.on_decoded(RouteRequest(tokens(8, i), max_new_tokens=1024), 128)
        assert p.decode_fill == 1.0
    finally:
        close_policy(p)


EVICTOR_DEADLINE_S = 10.0  # the background evictor brings the tree under budget within this


def test_policy_with_background_evictor_thread_stays_within_budget() -> None:
    policy = CacheAwarePolicy(default_budget_tokens=2_000, eviction_interval_s=0.005)
    try:
        ws = views(4)
        policy.on_workers_changed(ws)
        rng = random.Random(5)
        for i in range(600):
            r = req([rng.randrange(8)] * 50 + [rng.randrange(10**6) for _ in range(30)], request_id=str(i))
            d = policy.select(r, ws)
            policy.on_dispatch(r, d)
            policy.on_finish(r, d.worker_id, 0, True)
        tree = policy.tree("")
        deadline = time.monotonic() + EVICTOR_DEADLINE_S
        while tree.over_budget() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not tree.over_budget()
        assert all(v <= 2_000 for v in tree.stats().worker_tokens.values())
        tree.validate()
    finally:
        policy.close()
    assert policy._evictor is None


def _cold_setup(slack: float, w3_tokens: int = 2_000) -> tuple[CacheAwarePolicy, list[WorkerView]]:
    """Four idle workers with 2,000-token tree budgets and spread traffic; their content
    went in oldest first on w2, then w0, w1, w3 (``w3_tokens`` of it, the others full)."""
    p = policy(cost=CostKnobs(cold_slack_tokens=slack))
    _prime(p, hot=False)
    ws = views(4, kv_capacity_tokens=2_000, max_running_requests=8)
    p.on_workers_changed(ws)
    tree = p.tree("")
    for i, wid in enumerate(("w2", "w0", "w1", "w3")):
        tree.insert(tokens(w3_tokens if wid == "w3" else 2_000, 40 + i), wid)
    return p, ws


def test_a_cold_prompt_goes_where_it_evicts_the_oldest_content() -> None:
    """A prompt no worker holds any of costs the same prefill everywhere; what differs is
    what it pushes out. With the rule on it goes to a worker whose tree share has room for
    it, else to the one whose least recently used content is oldest (w2 here), as one
    cache pooling the four workers' memory would evict."""
    cold = req(tokens(1_000, 90))
    p, ws = _cold_setup(0.0, w3_tokens=500)
    assert p.select(cold, ws).worker_id == "w3"  # 1,500 tokens of room: evicts nothing
    p, ws = _cold_setup(0.0)
    d = p.select(cold, ws)
    assert (d.worker_id, d.reason) == ("w2", "no_match"), d
    # a prompt one worker holds part of is not cold: its holder keeps it, as without the rule
    warm = req(tokens(2_000, 41)[:800] + tokens(200, 91))
    assert p.select(warm, ws).worker_id == "w0"
    assert p.tree("").lru_stamp("w2") is not None  # select changed nothing


def test_the_cold_rule_weighs_load_within_its_slack_only() -> None:
    """The oldest-content worker is busier by one request (16 tokens of cost): at slack 0
    the next oldest idle one (w0) gets the prompt, at slack 64 it still goes to w2, and
    below 0 the rule is off (the rotating order among the idle workers)."""
    cold = req(tokens(1_000, 90))
    p, ws = _cold_setup(0.0)
    busy = with_load(ws, "w2", in_flight=1)
    assert p.select(cold, busy).worker_id == "w0"
    p, ws = _cold_setup(64.0)
    assert p.select(cold, with_load(ws, "w2", in_flight=1)).worker_id == "w2"
    off, _ = _cold_setup(-1.0)
    picks = {send(off, req(tokens(1_000, 100 + i), request_id=str(i)), ws).worker_id for i in range(4)}
    assert picks == {"w0", "w1", "w2", "w3"}


def test_once_a_prefix_is_hot_a_cold_prompt_is_placed_by_load_as_without_the_rule() -> None:
    cold = req(tokens(1_000, 90))
    on, ws = _cold_setup(0.0)
    off, _ = _cold_setup(-1.0)
    _prime(on, hot=True)
    _prime(off, hot=True)
    assert on.select(cold, ws).worker_id == off.select(cold, ws).worker_id


def test_replicas_that_hash_a_cold_prompt_put_its_group_on_one_worker_whatever_their_load_views() -> None:
    """Two replicas see the same new prompt groups before either hears of the other's
    decisions, each with its own request in flight (w0 on one, w1 on the other). Off, each
    takes its own cheapest worker (the first in its rotating order) and half the groups start
    on two; with the hash on, both
    rank the workers within the slack by the prompt's hash and pick the same one, and the
    groups still spread over the pool."""
    ws = views(4)
    a_view = with_load(ws, "w0", in_flight=1, queued_prefill_tokens=2_000)
    b_view = with_load(ws, "w1", in_flight=1, queued_prefill_tokens=2_000)
    groups = [tokens(2_000, 200 + g) + tokens(100, 300 + g) for g in range(24)]
    off_a, off_b = policy(), policy()
    assert sum(off_a.select(req(g), a_view).worker_id != off_b.select(req(g), b_view).worker_id for g in groups) == 12
    agree = CostKnobs(cold_hash_slack=2.0)  # within two prompts' prefill: the whole pool here
    on_a, on_b = policy(cost=agree), policy(cost=agree)
    picks = []
    for g in groups:
        da, db = on_a.select(req(g), a_view), on_b.select(req(g), b_view)
        assert (da.worker_id, da.reason) == (db.worker_id, "no_match")
        picks.append(da.worker_id)
    assert len(set(picks)) == 4  # the hash spreads groups, it does not pile them up
    # the same question of a group with another tail hashes alike: its first tokens decide
    assert on_a.select(req(groups[0][:2_000] + tokens(100, 999)), a_view).worker_id == picks[0]


def test_the_cold_hash_stays_within_its_slack_and_leaves_warm_prompts_alone() -> None:
    """A worker costing more than the slack above the cheapest is never the hash's pick; a
    prompt one worker holds part of is not cold: its holder keeps it, as without the hash."""
    ws = views(4)
    busy = with_load(ws, "w0", in_flight=2, queued_prefill_tokens=4_000)
    p = policy(cost=CostKnobs(cold_hash_slack=0.0))
    picks = {p.select(req(tokens(2_100, 400 + i)), busy).worker_id for i in range(24)}
    assert "w0" not in picks and len(picks) == 3
    held = send(p, req(SYSTEM + tokens(100, 2)), ws).worker_id
    d = p.select(req(SYSTEM + tokens(100, 3)), ws)
    assert (d.worker_id, d.reason) == (held, "cache_hit")


def test_the_evict_rule_decides_a_cold_prompt_where_it_applies_the_hash_elsewhere() -> None:
    p = policy(cost=CostKnobs(cold_slack_tokens=0.0, cold_hash_slack=1e9))
    _prime(p, hot=False)  # spread traffic: the evict rule's condition holds
    ws = views(4, kv_capacity_tokens=2_000, max_running_requests=8)
    p.on_workers_changed(ws)
    for i, wid in enumerate(("w2", "w0", "w1", "w3")):
        p.tree("").insert(tokens(2_000, 40 + i), wid)
    assert p.select(req(tokens(1_000, 90)), ws).worker_id == "w2"  # the oldest content, as with the evict rule alone
    hot = policy(cost=CostKnobs(cold_slack_tokens=0.0, cold_hash_slack=1e9))
    _prime(hot, hot=True)  # one prefix is hot: the evict rule is off, the hash places cold prompts
    twin = policy(cost=CostKnobs(cold_hash_slack=1e9))
    _prime(twin, hot=True)
    for i in range(8):
        cold = req(tokens(1_000, 500 + i))
        assert hot.select(cold, views(4)).worker_id == twin.select(cold, views(4)).worker_id
