"""prefix_hash: same prefix same worker, bounded load, skipping, spread, explain."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.policies import explain
from gateway.policies.prefix_hash import PrefixHashPolicy
from gateway.policies.ring import HashRing

from .helpers import req, tokens, views, with_load


def test_prompts_sharing_the_hashed_prefix_go_to_the_ring_owner() -> None:
    p = PrefixHashPolicy(block_size=16, depth_tokens=256, depth_window=0)  # a fixed depth
    shared = tokens(256, 1)
    ws = views(8)
    ds = [p.select(req(shared + tokens(100, i)), ws) for i in range(20)]
    assert len({d.worker_id for d in ds}) == 1
    assert ds[0].reason == "ring_owner"
    assert ds[0].worker_id == HashRing(160, [w.worker_id for w in ws]).owner(p.key(req(shared)))


def test_keys_spread_over_the_pool() -> None:
    p = PrefixHashPolicy()
    counts = Counter(p.select(req(tokens(300, i)), views(4)).worker_id for i in range(800))
    assert set(counts) == {"w0", "w1", "w2", "w3"}
    assert max(counts.values()) < 2.0 * min(counts.values())


def test_overloaded_owner_passes_the_key_clockwise() -> None:
    p = PrefixHashPolicy(load_factor=1.25)
    prompt = req(tokens(300, 7))
    ws = views(4, in_flight=4)
    owner = p.select(prompt, ws).worker_id
    walk = list(p.ring.walk(p.key(prompt)))
    assert walk[0] == owner
    # total = 12 + 8 = 20 in flight; limit = ceil(1.25 * 21 / 4) = 7: owner at 12 is above
    hot = with_load(ws, owner, in_flight=12)
    d = p.select(prompt, hot)
    assert (d.worker_id, d.reason) == (walk[1], "load_bounded")
    # owner at 5, others at 4: limit = ceil(1.25 * 18 / 4) = 6, so it keeps the key
    assert p.select(prompt, with_load(ws, owner, in_flight=5)).worker_id == owner
    # owner at 6: limit = ceil(1.25 * 19 / 4) = 6 and 6 is not below it
    assert p.select(prompt, with_load(ws, owner, in_flight=6)).worker_id == walk[1]


def test_load_factor_zero_never_bounces() -> None:
    p = PrefixHashPolicy(load_factor=0)
    prompt = req(tokens(300, 7))
    owner = p.select(prompt, views(4)).worker_id
    assert p.select(prompt, with_load(views(4), owner, in_flight=10_000)).worker_id == owner
    with pytest.raises(ValueError):
        PrefixHashPolicy(load_factor=0.5)


def test_unavailable_owner_is_skipped_and_key_returns_when_it_recovers() -> None:
    p = PrefixHashPolicy()
    prompt = req(tokens(300, 8))
    ws = views(5)
    owner = p.select(prompt, ws).worker_id
    d = p.select(prompt, with_load(ws, owner, available=False))
    assert d.worker_id == list(p.ring.walk(p.key(prompt)))[1] and d.reason == "owner_unavailable"
    assert p.select(prompt, ws).worker_id == owner


def test_short_prompts_still_spread() -> None:
    p = PrefixHashPolicy(block_size=16)
    picks = {p.select(req([i, i + 1]), views(4)).worker_id for i in range(60)}
    assert len(picks) == 4


def test_explain_shows_ring_position_and_walk() -> None:
    p = PrefixHashPolicy()
    prompt = req(tokens(300, 9))
    info = explain(p, prompt, views(3))
    assert info["policy"] == "prefix_hash"
    assert info["choice"] == info["ring_position"]["owner"] == info["walked"][0]
    assert info["ring_position"]["key"] == p.key(prompt)
    assert p.ring_position(p.key(prompt)).owner == info["choice"]
    assert len(p.ring_points()) == 3 * 160


def conversation_prompts(conversations: int, turns: int) -> list[tuple[int, list[int]]]:
    """(conversation, prompt) in arrival order: every prompt starts with the same 512 tokens,
    then its conversation's 256, then 128 more per turn (each turn resends the history)."""
    header = tokens(512, 1)
    out = []
    for t in range(turns):
        for c in range(conversations):
            history = header + tokens(256, 1000 + c)
            for k in range(t + 1):
                history += tokens(128, 10_000 * (c + 1) + k)
            out.append((c, history))
    return out


def test_a_header_every_request_shares_does_not_collapse_the_ring() -> None:
    p = PrefixHashPolicy(block_size=16, depth_tokens=256, depth_window=256)
    ws = views(8)
    placed: dict[int, set[str]] = {}
    counts: Counter[str] = Counter()
    for i, (c, prompt) in enumerate(conversation_prompts(100, 4)):
        d = p.select(req(prompt), ws)
        if i >= 100:  # after the first turns the header is known to be common
            placed.setdefault(c, set()).add(d.worker_id)
            counts[d.worker_id] += 1
    assert set(counts) == {w.worker_id for w in ws}
    assert max(counts.values()) < 2.0 * sum(counts.values()) / len(ws)
    # a conversation's later turns stay together: its key is its own start, not the header
    assert all(len(workers) == 1 for workers in placed.values())
    info = explain(p, req(conversation_prompts(1, 1)[0][1]), ws)
    assert info["depth_tokens"] == 768 and info["key_shares"]["256"] > 0.9


def test_a_fixed_depth_inside_the_shared_header_collapses() -> None:
    p = PrefixHashPolicy(block_size=16, depth_tokens=256, depth_window=0)
    picks = {p.select(req(prompt), views(8)).worker_id for _, prompt in conversation_prompts(50, 2)}
    assert len(picks) == 1  # what the adaptive depth is for


def test_an_idle_worker_takes_the_request_when_the_chosen_one_queues() -> None:
    p = PrefixHashPolicy(load_factor=0)
    prompt = req(tokens(300, 11))
    ws = views(4, max_running_requests=4, in_flight=3)
    owner = p.select(prompt, ws).worker_id
    walk = list(p.ring.walk(p.key(prompt)))
    full = with_load(ws, owner, in_flight=4)  # every slot taken: the next request would wait
    assert p.select(prompt, full).worker_id == owner  # nobody idle: it keeps its key
    idle = with_load(full, walk[2], in_flight=0)
    d = p.select(prompt, idle)
    assert (d.worker_id, d.reason) == (walk[2], "idle_worker")
    # the worker's own polled figures say requests wait
    from gateway.policies.base import LoadSnapshot

    waiting = with_load(with_load(views(4), owner, loads=LoadSnapshot(num_waiting_reqs=2), in_flight=1), walk[1],
                        in_flight=1)
    d = p.select(prompt, waiting)
    assert d.reason == "idle_worker" and d.worker_id == walk[2]
    assert explain(p, prompt, waiting)["reason"] == "idle_worker"
    off = PrefixHashPolicy(load_factor=0, idle_takeover=False)
    assert off.select(prompt, waiting).worker_id == owner


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_new_worker_takes_new_keys_of_its_arcs_while_continuing_ones_stay_for_its_warm_up() -> None:
    clock = Clock()
    p = PrefixHashPolicy(warmup_s=30, clock=clock)
    old, grown = views(4), views(5)
    prompts = [tokens(300, 500 + i) for i in range(200)]
    before = {i: p.select(req(x), old).worker_id for i, x in enumerate(prompts)}  # seen: in the window
    clock.now = 10
    continuing = {i: p.select(req(x), grown).worker_id for i, x in enumerate(prompts)}
    assert continuing == before  # every seen key stays where its cache is
    info = explain(p, req(prompts[0]), grown)
    assert info["warming_workers"] == ["w4"] and info["kept_off_warming_workers"] and info["choice"] == before[0]
    fresh = [p.select(req(tokens(300, 10_000 + i)), grown).worker_id for i in range(200)]
    assert "w4" in fresh  # the new worker takes the new keys of its arcs
    clock.now = 41  # settled: the whole ring, seen or not
    settled = {i: p.select(req(x), grown).worker_id for i, x in enumerate(prompts)}
    assert "w4" in settled.values() and all(settled[i] == before[i] for i in settled if settled[i] != "w4")
    off = PrefixHashPolicy(warmup_s=0)
    for x in prompts:
        off.select(req(x), old)
    assert "w4" in {off.select(req(x), grown).worker_id for x in prompts}
