"""The pure inspection core: block hashes, ring mapping, tree predictions, explain."""

from __future__ import annotations

import json

import pytest

from gateway.policies import PolicyConfig, RouteRequest, WorkerView, make_policy
from gateway.policies.cache_aware import CacheAwarePolicy
from gateway.policies.hashing import block_hashes, prefix_key
from gateway.policies.inspection import inspect_tokens
from gateway.policies.radix_tree import RadixTree
from gateway.policies.ring import HashRing

WORKERS = [WorkerView(worker_id=f"127.0.0.1:{5000 + i}", url=f"grpc://127.0.0.1:{5000 + i}", page_size=16) for i in range(4)]


def test_blocks_cover_the_prompt_in_order_and_chain() -> None:
    ids = list(range(100, 150))  # 50 tokens: 3 full blocks of 16, 2 left over
    res = inspect_tokens(ids, workers=WORKERS, block_size=16, depth_tokens=32)
    assert res.token_count == 50
    assert [(b.start, b.end) for b in res.blocks] == [(0, 16), (16, 32), (32, 48)]
    assert [b.hash for b in res.blocks] == [h.hash for h in block_hashes(ids, 16)]
    # a change in block 0 changes every later hash (chained), a change in block 2 only block 2's
    other = inspect_tokens([7, *ids[1:]], workers=WORKERS, block_size=16, depth_tokens=32)
    assert all(a.hash != b.hash for a, b in zip(res.blocks, other.blocks, strict=True))
    late = inspect_tokens([*ids[:40], 7, *ids[41:]], workers=WORKERS, block_size=16, depth_tokens=32)
    assert [a.hash == b.hash for a, b in zip(res.blocks, late.blocks, strict=True)] == [True, True, False]


def test_ring_mapping_matches_the_prefix_hash_policy() -> None:
    ids = list(range(1000, 1300))
    cfg = PolicyConfig(policy="prefix_hash", hash_block_size=16, hash_depth_tokens=64)
    policy = make_policy(cfg)
    res = inspect_tokens(ids, workers=WORKERS, block_size=16, depth_tokens=64, policy=policy)
    ring = res.ring
    assert ring is not None
    assert ring.key == prefix_key(ids, 16, 64) == res.blocks[3].hash  # depth 64 = the 4th block
    assert ring.depth_tokens == 64
    assert ring.owner == HashRing(160, [w.worker_id for w in WORKERS]).owner(ring.key)
    assert sorted(ring.order) == sorted(w.worker_id for w in WORKERS) and ring.order[0] == ring.owner
    assert 0 <= ring.fraction < 1
    # idle workers: the policy picks the ring owner, and the decision says so
    assert res.decision is not None
    assert res.decision["choice"] == ring.owner and res.decision["reason"] == "ring_owner"
    assert policy.select(RouteRequest(token_ids=ids), WORKERS).worker_id == ring.owner


def test_depth_is_capped_by_the_prompt_and_short_prompts_still_map() -> None:
    res = inspect_tokens([1, 2, 3], workers=WORKERS, block_size=16, depth_tokens=256)
    assert res.blocks == []
    assert res.ring is not None and res.ring.depth_tokens == 3
    assert res.ring.key == prefix_key([1, 2, 3], 16, 256)
    none = inspect_tokens([1, 2, 3], workers=[], block_size=16, depth_tokens=256)
    assert none.ring is None


def test_tree_predictions_round_down_to_pages_and_change_nothing() -> None:
    tree = RadixTree()
    a, b = WORKERS[0].worker_id, WORKERS[1].worker_id
    prompt = list(range(2000, 2100))
    tree.insert(prompt[:40], a)  # 40 tokens: 2 whole pages of 16
    tree.insert(prompt[:90], b)
    before = tree.stats()
    res = inspect_tokens(prompt, workers=WORKERS, block_size=16, depth_tokens=64, tree=tree)
    rows = {r.worker_id: r for r in res.workers}
    assert res.tree and res.tree_match_tokens == 90
    assert (rows[a].raw_match_tokens, rows[a].predicted_cached_tokens) == (40, 32)
    assert (rows[b].raw_match_tokens, rows[b].predicted_cached_tokens) == (90, 80)
    assert rows[WORKERS[2].worker_id].predicted_cached_tokens == 0
    assert rows[a].tree_tokens == 40 and rows[b].tree_tokens == 90
    assert tree.stats() == before


def test_cache_aware_explain_and_json_round_trip() -> None:
    policy = make_policy(PolicyConfig(policy="cache_aware", eviction_interval_s=0))
    assert isinstance(policy, CacheAwarePolicy)
    try:
        prompt = list(range(3000, 3200))
        first = RouteRequest(token_ids=prompt, request_id="r1")
        d = policy.select(first, WORKERS)
        policy.on_dispatch(first, d)
        policy.on_finish(first, d.worker_id, 0, True)
        res = inspect_tokens(
            prompt, workers=WORKERS, block_size=16, depth_tokens=64,
            tree=policy.tree(""), policy=policy, pieces=[str(t) for t in prompt],
        )
        assert res.policy == "cache_aware"
        assert res.decision is not None and res.decision["choice"] == d.worker_id
        assert res.decision["reason"] == "cache_hit"
        assert {r.worker_id: r.predicted_cached_tokens for r in res.workers}[d.worker_id] == 192
        out = json.loads(json.dumps(res.to_dict()))
        assert out["token_count"] == 200 and out["tokens"][5] == {"index": 5, "id": 3005, "piece": "3005"}
        assert out["blocks"][0]["hex"] == f"{res.blocks[0].hash:016x}"
        assert out["ring"]["owner"] in {w.worker_id for w in WORKERS}
    finally:
        policy.close()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        inspect_tokens([1], workers=WORKERS, block_size=0, depth_tokens=16)
    with pytest.raises(ValueError):
        inspect_tokens([1, 2], workers=WORKERS, block_size=16, depth_tokens=16, pieces=["a"])
