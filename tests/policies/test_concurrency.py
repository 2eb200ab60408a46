"""The tree and the cache_aware policy under threads: routing, outside inserts and eviction at once."""

from __future__ import annotations

import random
import threading
import time

from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.radix_tree import RadixTree

from .helpers import req, views

DEADLINE_S = 10.0


def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE_S)
        assert not t.is_alive(), "a worker thread hung"


def test_concurrent_insert_match_remove_and_evict_keep_the_tree_consistent() -> None:
    tree = RadixTree(default_budget_tokens=400, max_total_tokens=1500, evict_inline=False)
    prefixes = [[p] * 30 for p in range(1, 6)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def guarded(fn):  # type: ignore[no-untyped-def]
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced by the assert below
                errors.append(exc)
                stop.set()

        return run

    def inserter(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1500):
            toks = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(1, 20))]
            tree.insert(toks, f"w{rng.randrange(6)}")

    def matcher() -> None:
        rng = random.Random(3)
        for _ in range(3000):
            m = tree.match([*rng.choice(prefixes), rng.randrange(1000)])
            assert all(v <= m.matched for v in m.per_worker.values())

    def evictor() -> None:
        rng = random.Random(4)
        while not stop.is_set():
            tree.evict(chunk=16)
            tree.remove_prefix(rng.choice(prefixes), f"w{rng.randrange(6)}", keep=10)
            if rng.random() < 0.05:
                tree.remove_worker(f"w{rng.randrange(6)}")
            time.sleep(0)

    workers = [threading.Thread(target=guarded(lambda s=s: inserter(s))) for s in (1, 2)]
    workers.append(threading.Thread(target=guarded(matcher)))
    ev = threading.Thread(target=guarded(evictor))
    ev.start()
    _run(workers)
    stop.set()
    ev.join(timeout=DEADLINE_S)
    assert not errors, errors
    tree.validate()
    tree.evict()
    assert not tree.over_budget()
    tree.validate()


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
        deadline = time.monotonic() + DEADLINE_S
        while tree.over_budget() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not tree.over_budget()
        assert all(v <= 2_000 for v in tree.stats().worker_tokens.values())
        tree.validate()
    finally:
        policy.close()
    assert policy._evictor is None
