"""Consistent-hash ring: determinism, minimal key movement, walk order."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from gateway.policies.ring import HashRing

_RNG = random.Random(7)
KEYS = [_RNG.getrandbits(64) for _ in range(20_000)]


def owners(ring: HashRing) -> list[str]:
    return [ring.owner(k) for k in KEYS]


def test_join_moves_about_one_in_n_plus_one_keys_all_to_the_newcomer() -> None:
    ring = HashRing(160, [f"w{i}" for i in range(8)])
    before = owners(ring)
    ring.add("w8")
    after = owners(ring)
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == "w8" for _, a in moved)
    assert 0.07 < len(moved) / len(KEYS) < 0.16  # ideal 1/9 = 0.111


def test_leave_moves_only_the_leavers_keys() -> None:
    ring = HashRing(160, [f"w{i}" for i in range(8)])
    before = owners(ring)
    ring.remove("w3")
    after = owners(ring)
    for b, a in zip(before, after, strict=True):
        if b != "w3":
            assert a == b
        else:
            assert a != "w3"


def test_keys_spread_over_workers() -> None:
    ring = HashRing(160, [f"w{i}" for i in range(8)])
    counts = {w: 0 for w in ring.members}
    for o in owners(ring):
        counts[o] += 1
    assert max(counts.values()) / min(counts.values()) < 1.6


def test_walk_yields_each_worker_once_owner_first() -> None:
    ring = HashRing(40, ["a", "b", "c", "d"])
    for k in KEYS[:50]:
        walked = list(ring.walk(k))
        assert sorted(walked) == ["a", "b", "c", "d"]
        assert walked[0] == ring.owner(k)


def test_position_and_empty_ring() -> None:
    ring = HashRing(4, ["a"])
    for key in (5, KEYS[0], (1 << 64) - 1):
        pos = ring.position(key)
        assert pos.owner == "a"
        # the owning point is the first at or after the key, wrapping to index 0
        assert pos.vnode_point >= key or pos.vnode_index == 0
    assert len(ring.points()) == 4
    with pytest.raises(LookupError):
        HashRing(4).position(1)
    assert list(HashRing(4).walk(1)) == []


def test_membership_order_does_not_matter() -> None:
    a = HashRing(50, ["x", "y", "z"])
    b = HashRing(50, ["z", "x", "y"])
    assert owners(a)[:2000] == owners(b)[:2000]


def test_same_owners_in_another_process() -> None:
    code = (
        "import json,sys; from gateway.policies.ring import HashRing;"
        "keys=json.load(sys.stdin); r=HashRing(160,[f'w{i}' for i in range(8)]);"
        "print(json.dumps([r.owner(k) for k in keys]))"
    )
    keys = KEYS[:3000]
    env = {**os.environ, "PYTHONHASHSEED": "987"}
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(keys), capture_output=True, text=True,
        env=env, timeout=60, check=True,
    )
    ring = HashRing(160, [f"w{i}" for i in range(8)])
    assert json.loads(out.stdout) == [ring.owner(k) for k in keys]
