"""The simulator's radix KV cache: matching, page rounding, locks, LRU eviction, capacity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway_lab.sim.radix_cache import (
    ClearedEvent,
    RadixCache,
    RemovedEvent,
    StoredEvent,
    block_hash,
    block_hashes,
)


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def cache_with(tokens: list[int], page: int = 4, cap: int = 1000) -> RadixCache:
    c = RadixCache(page, cap)
    assert c.alloc(len(tokens))
    c.insert(tokens, private_covered=len(tokens) - len(tokens) % page)
    c.release(len(tokens) % page)
    return c


def test_match_is_whole_pages_and_exact() -> None:
    c = cache_with(seq(0, 10))  # pages [0..3] [4..7]; the tail 8,9 is not cached
    assert c.tree_tokens == 8
    assert c.match_prefix(seq(0, 10))[1] == 8
    assert c.match_prefix(seq(0, 7))[1] == 4  # only one whole page of the query
    assert c.match_prefix([0, 1, 2, 9, 9, 9, 9, 9])[1] == 0  # diverges inside page 0
    assert c.match_prefix([*seq(0, 6), 99, 99])[1] == 4  # diverges inside page 1
    assert c.match_prefix(seq(0, 10), max_len=7)[1] == 4
    assert c.match_prefix([5, 6, 7, 8])[1] == 0
    c.check_invariants()


def test_split_on_partial_match_keeps_counts() -> None:
    c = cache_with(seq(0, 16))
    node, n = c.match_prefix([*seq(0, 8), 50, 51, 52, 53])
    assert n == 8 and len(node.key) == 8 and len(node.children) == 1
    assert c.tree_tokens == 16 and c.num_nodes == 2
    c.check_invariants()
    assert c.alloc(4)
    _, added = c.insert([*seq(0, 8), 50, 51, 52, 53], private_covered=4)
    assert added == 4 and c.tree_tokens == 20 and c.num_nodes == 3
    assert c.private_tokens == 0
    c.check_invariants()


def test_peek_changes_nothing() -> None:
    c = cache_with(seq(0, 16))
    before = (c.num_nodes, c._tick)
    assert c.peek_prefix_len([*seq(0, 8), 7, 7, 7, 7]) == 8
    assert (c.num_nodes, c._tick) == before


def test_insert_duplicates_free_private_slots() -> None:
    c = cache_with(seq(0, 8))
    assert c.alloc(8)
    _, added = c.insert(seq(0, 8), private_covered=8)
    assert added == 0 and c.private_tokens == 0 and c.used_tokens == 8


def test_lru_eviction_order() -> None:
    c = RadixCache(4, 12)
    for base in (100, 200, 300):
        assert c.alloc(4)
        c.insert(seq(base, 4), private_covered=4)
    c.match_prefix(seq(100, 4))  # 100 becomes the most recent; 200 is now the oldest
    assert c.alloc(4)  # needs one leaf evicted
    assert c.match_prefix(seq(200, 4))[1] == 0
    assert c.match_prefix(seq(100, 4))[1] == 4
    assert c.match_prefix(seq(300, 4))[1] == 4
    assert c.evicted_tokens == 4
    c.check_invariants()


def test_locked_nodes_are_never_evicted() -> None:
    c = RadixCache(4, 8)
    assert c.alloc(8)
    node, _ = c.insert(seq(0, 8), private_covered=8)
    c.lock(node)
    assert c.available_tokens == 0
    assert not c.alloc(1)
    assert c.evict(8) == 0
    c.unlock(node)
    assert c.alloc(8)  # now everything can go
    assert c.tree_tokens == 0 and c.private_tokens == 8
    c.check_invariants()


def test_parent_becomes_evictable_after_children_go() -> None:
    c = RadixCache(2, 100)
    for tail in ([7, 7], [8, 8]):
        new = 2 if c.tree_tokens else 6
        assert c.alloc(new)
        c.insert([1, 1, 2, 2, *tail], private_covered=new)
        c.check_invariants()
    assert c.evict(100) == 8
    assert c.tree_tokens == 0 and c.num_nodes == 0


def test_lock_counts_protect_ancestors() -> None:
    c = cache_with(seq(0, 16))
    mid, _ = c.match_prefix([*seq(0, 8), 9, 9, 9, 9])
    c.lock(mid)
    assert c.protected_tokens == 8
    c.evict(100)
    assert c.tree_tokens == 8  # the unlocked tail went, the locked prefix stayed
    c.unlock(mid)
    with pytest.raises(ValueError):
        c.unlock(mid)
    c.check_invariants()


def test_release_and_clear() -> None:
    c = cache_with(seq(0, 8))
    with pytest.raises(ValueError):
        c.release(1)
    node, _ = c.match_prefix(seq(0, 8))
    c.lock(node)
    with pytest.raises(RuntimeError):
        c.clear()
    c.unlock(node)
    c.clear()
    assert c.tree_tokens == 0 and c.match_prefix(seq(0, 8))[1] == 0


def test_block_hash_chain_matches_events() -> None:
    c = RadixCache(4, 100)
    c.enable_events()
    tokens = seq(0, 12)
    assert c.alloc(12)
    c.insert(tokens, private_covered=12)
    (ev,) = c.drain_events()
    assert isinstance(ev, StoredEvent) and ev.parent_hash is None
    expected = block_hashes(tokens, 4)
    assert [h for h, _ in ev.blocks] == expected
    assert [t for _, t in ev.blocks] == [seq(0, 4), seq(4, 4), seq(8, 4)]
    assert expected[1] == block_hash(expected[0], seq(4, 4))
    assert all(-(2**63) <= h < 2**63 for h in expected)
    # A branch after the second page chains from that page's hash.
    assert c.alloc(4)
    c.insert([*seq(0, 8), 50, 51, 52, 53], private_covered=4)
    (ev2,) = c.drain_events()
    assert isinstance(ev2, StoredEvent) and ev2.parent_hash == expected[1]
    assert ev2.blocks[0][0] == block_hash(expected[1], [50, 51, 52, 53])
    c.evict(100)
    removed = [h for e in c.drain_events() if isinstance(e, RemovedEvent) for h in e.hashes]
    assert sorted(removed) == sorted([*expected, ev2.blocks[0][0]])
    c.clear()
    assert c.drain_events() == [ClearedEvent()]


def test_hashes_computed_lazily_when_events_start_late() -> None:
    c = cache_with(seq(0, 8))
    c.enable_events()
    c.evict(8)
    (ev,) = c.drain_events()
    assert isinstance(ev, RemovedEvent) and ev.hashes == block_hashes(seq(0, 8), 4)


# ---------------------------------------------------------------- properties
class Model:
    """Drives the cache like the scheduler does and checks it never lies."""

    def __init__(self, page: int, cap: int) -> None:
        self.c = RadixCache(page, cap)
        self.page = page
        self.held: list[tuple[object, int]] = []  # (locked node, private tokens)


def evictable_leaves(c: RadixCache) -> list:
    out, stack = [], list(c.root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.children and node.lock_ref == 0:
            out.append(node)
    return out


ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "finish", "evict", "evict_one", "match"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=24),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(page=st.sampled_from([1, 2, 4]), cap=st.integers(8, 64), script=ops)
def test_random_operations_keep_invariants(page: int, cap: int, script: list) -> None:
    m = Model(page, cap)
    c = m.c
    for op, tokens in script:
        if op == "admit":
            node, cached = c.match_prefix(tokens, max_len=len(tokens) - 1)
            c.lock(node)
            if c.alloc(len(tokens) - cached):
                whole = len(tokens) - len(tokens) % page
                new_node, _ = c.insert(tokens, private_covered=max(0, whole - cached))
                c.lock(new_node)
                c.unlock(node)
                m.held.append((new_node, len(tokens) - max(whole, cached)))
            else:
                c.unlock(node)
        elif op == "finish" and m.held:
            node, private = m.held.pop(len(tokens) % len(m.held))
            c.release(private)
            c.unlock(node)  # type: ignore[arg-type]
        elif op == "evict":
            before = c.tree_tokens
            locked = c.protected_tokens
            freed = c.evict(len(tokens) * page)
            assert c.tree_tokens == before - freed >= locked
        elif op == "evict_one":
            leaves = evictable_leaves(c)
            if leaves:
                oldest = min(leaves, key=lambda n: n.last_access)
                c.evict(1)
                assert oldest.parent is None, "evicted something other than the LRU leaf"
        else:
            n = c.peek_prefix_len(tokens)
            node, got = c.match_prefix(tokens)
            assert got == n and got % page == 0 and got <= len(tokens)
        c.check_invariants()
        assert c.used_tokens <= cap
        assert c.protected_tokens + c.private_tokens <= cap
    while m.held:
        node, private = m.held.pop()
        c.release(private)
        c.unlock(node)  # type: ignore[arg-type]
    assert c.protected_tokens == 0 and c.private_tokens == 0
    c.evict(cap)
    assert c.tree_tokens == 0
    c.check_invariants()


@settings(max_examples=100, deadline=None)
@given(
    page=st.sampled_from([1, 2, 4]),
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=16), min_size=1, max_size=12),
)
def test_match_returns_true_longest_cached_prefix(page: int, prompts: list[list[int]]) -> None:
    """Compared with a brute-force set of every cached page prefix."""
    c = RadixCache(page, 10_000)
    cached: set[tuple[int, ...]] = set()
    for p in prompts:
        whole = len(p) - len(p) % page
        expect = max(
            (k for k in range(0, whole + 1, page) if k == 0 or tuple(p[:k]) in cached), default=0
        )
        # Every cached prefix is contiguous from the root, so the longest one is the answer.
        assert c.peek_prefix_len(p) == expect
        assert c.match_prefix(p)[1] == expect
        assert c.alloc(whole - expect)
        c.insert(p, private_covered=whole - expect)
        for k in range(page, whole + 1, page):
            cached.add(tuple(p[:k]))
        c.check_invariants()
