"""Token radix tree: unit cases, property-based invariants (hypothesis state machine), and threads
routing, inserting and evicting at once."""

from __future__ import annotations

import random
import threading
import time

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gateway.policies.radix_tree import RadixTree, pack


def lcp(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def raw(tree: RadixTree, toks: list[int]) -> dict[str, int]:
    return tree.match_packed(pack(toks))[1]


# ------------------------------------------------------------------ unit cases
def test_match_is_longest_shared_prefix_per_worker() -> None:
    t = RadixTree()
    t.insert([1, 2, 3, 4, 5, 6], "a")
    t.insert([1, 2, 3, 9, 9], "b")
    t.insert([7, 7], "b")
    m = t.match([1, 2, 3, 4, 5, 6, 7, 8])
    assert m.matched == 6
    assert m.per_worker == {"a": 6, "b": 3}
    assert t.match([1, 2, 3, 9]).per_worker == {"a": 3, "b": 4}
    assert t.match([8]).per_worker == {} and t.match([8]).matched == 0
    assert t.match([]).per_worker == {}
    t.validate()


def test_match_counts_whole_pages_of_each_workers_page_size() -> None:
    t = RadixTree()
    t.set_worker("p16", page_size=16)
    t.set_worker("p1", page_size=1)
    toks = list(range(1, 38))  # 37 tokens
    t.insert(toks, "p16")
    t.insert(toks, "p1")
    assert t.match([*toks, 99]).per_worker == {"p16": 32, "p1": 37}
    assert t.match(toks[:15]).per_worker == {"p1": 15}  # less than a page: nothing


def test_match_does_not_touch_lru() -> None:
    t = RadixTree(default_budget_tokens=10)
    t.insert([1] * 5, "a")
    t.insert([2] * 5, "a")
    t.match([1] * 5)  # a lookup is not a use
    t.insert([3] * 5, "a")  # over budget: the least recently *inserted* goes
    assert t.match([1] * 5).per_worker == {}
    assert t.match([2] * 5).per_worker == {"a": 5}
    t.validate()


def test_reinserting_a_prompt_makes_it_recently_used() -> None:
    t = RadixTree(default_budget_tokens=10)
    t.insert([1] * 5, "a")
    t.insert([2] * 5, "a")
    t.insert([1] * 5, "a")  # used again: now [2]*5 is the least recently used
    t.insert([3] * 5, "a")
    assert t.match([1] * 5).per_worker == {"a": 5}
    assert t.match([2] * 5).per_worker == {}
    t.insert([4] * 5, "a")
    assert t.match([1] * 5).per_worker == {}
    assert t.match([3] * 5).per_worker == {"a": 5}
    t.validate()


def test_budget_eviction_is_lru_leaves_first_and_keeps_shared_prefix() -> None:
    t = RadixTree(default_budget_tokens=20)
    sys_prompt = [9] * 10
    t.insert(sys_prompt + [1] * 5, "a")
    t.insert(sys_prompt + [2] * 5, "a")  # 20 tokens: at budget
    t.insert(sys_prompt + [3] * 5, "a")  # 25: evict the oldest leaf ([1]*5)
    assert t.worker_tokens("a") == 20
    per = t.match(sys_prompt + [1] * 5).per_worker
    assert per == {"a": 10}
    assert t.match(sys_prompt + [3] * 5).per_worker == {"a": 15}
    t.validate()


def test_global_cap_evicts_oldest_pairs_across_workers() -> None:
    t = RadixTree(max_total_tokens=30)
    t.insert([1] * 10, "a")
    t.insert([2] * 10, "b")
    t.insert([3] * 10, "a")
    t.insert([4] * 10, "b")  # 40 > 30: [1]*10 (oldest) goes
    assert t.total_tokens == 30
    assert t.match([1] * 10).matched == 0
    assert t.match([4] * 10).per_worker == {"b": 10}
    t.validate()


def test_background_mode_overshoots_only_by_the_hard_bound_then_evict_trims() -> None:
    t = RadixTree(default_budget_tokens=100, evict_inline=False, overshoot=1.5)
    for i in range(30):
        t.insert([1000 + i] * 10, "a")
        assert t.worker_tokens("a") <= 150  # inline hard bound
    assert t.over_budget() or t.worker_tokens("a") <= 100
    t.evict(chunk=3)
    assert t.worker_tokens("a") <= 100
    assert not t.over_budget()
    t.validate()


def test_remove_worker_leaves_no_trace_and_prunes() -> None:
    t = RadixTree()
    t.insert([1, 2, 3, 4], "a")
    t.insert([1, 2, 5, 6], "b")
    t.insert([7, 8], "a")
    assert t.remove_worker("a") == 3  # nodes [1,2], [3,4] and [7,8]
    assert all("a" not in n.workers for n in t.nodes())
    assert t.match([7, 8]).matched == 0
    assert t.match([1, 2, 3, 4]).matched == 2
    assert t.total_tokens == 4
    assert "a" not in t.workers()
    t.validate()
    assert t.remove_worker("a") == 0


def test_remove_prefix_drops_the_tail_and_its_extensions_only() -> None:
    t = RadixTree()
    t.insert([1, 2, 3, 4, 5, 6], "a")
    t.insert([1, 2, 3, 4, 5, 6, 7, 8], "a")
    t.insert([1, 2, 3, 9], "a")  # shares [1,2,3] with the removed block
    t.insert([1, 2, 3, 4, 5, 6], "b")
    removed = t.remove_prefix([1, 2, 3, 4, 5, 6], "a", keep=2)
    assert removed == 5  # tokens 4,5,6 and the extension 7,8
    assert raw(t, [1, 2, 3, 4, 5, 6, 7, 8]) == {"a": 3, "b": 6}
    assert raw(t, [1, 2, 3, 9]) == {"a": 4, "b": 3}
    t.validate()
    # keep=0 with no other branch: the whole path goes
    assert t.remove_prefix([1, 2, 3, 4, 5, 6], "b") == 6
    assert "b" not in raw(t, [1, 2, 3])
    t.validate()
    assert t.remove_prefix([5, 5], "a") == 0  # not in the tree
    assert t.remove_prefix([1, 2], "a", keep=2) == 0  # nothing beyond keep


def test_remove_prefix_of_a_block_the_tree_only_partly_knows() -> None:
    t = RadixTree()
    t.insert([1, 2, 3, 4], "a")
    t.insert([1, 2, 3, 5, 6], "a")
    # the removed block [3, 7, 7] diverges inside it: other branches keep [1,2,3]
    t.remove_prefix([1, 2, 3, 7, 7], "a", keep=2)
    assert raw(t, [1, 2, 3, 4]) == {"a": 4}
    assert raw(t, [1, 2, 3, 5, 6]) == {"a": 5}
    t.validate()


def test_accepts_tuples_arrays_and_bytes() -> None:
    from array import array

    t = RadixTree()
    t.insert((1, 2, 3), "a")
    t.insert(array("I", [1, 2, 4]), "b")
    assert t.match(pack([1, 2, 3])).per_worker == {"a": 3, "b": 2}


def test_bad_settings_rejected() -> None:
    with pytest.raises(ValueError):
        RadixTree(default_budget_tokens=0)
    with pytest.raises(ValueError):
        RadixTree(overshoot=0.5)


# ------------------------------------------------------- property-based model
WORKERS = ("w0", "w1", "w2")
PAGES = {"w0": 1, "w1": 2, "w2": 4}
seqs = st.lists(st.integers(0, 3), min_size=0, max_size=14)


class TreeMachine(RuleBasedStateMachine):
    """Random inserts / removals / evictions against a model of what each worker was given.

    Model: ``given[w]`` is every sequence inserted for ``w`` since it was last removed.
    A worker's match can never exceed the longest prefix shared with one of those;
    while no eviction or removal has touched it, the match equals that exactly.
    """

    @initialize(tight=st.booleans(), cap=st.integers(8, 60))
    def setup(self, tight: bool, cap: int) -> None:
        self.tight = tight
        self.tree = RadixTree(
            default_budget_tokens=12 if tight else 10_000,
            max_total_tokens=cap if tight else 1_000_000,
        )
        for w in WORKERS:
            self.tree.set_worker(w, page_size=PAGES[w], budget_tokens=self._budget(w))
        self.given: dict[str, list[tuple[int, ...]]] = {w: [] for w in WORKERS}
        self.exact: dict[str, bool] = {w: not tight for w in WORKERS}
        self.probes: list[tuple[int, ...]] = [()]

    def _budget(self, w: str) -> int:
        return {"w0": 12, "w1": 20, "w2": 30}[w] if self.tight else 10_000

    @rule(w=st.sampled_from(WORKERS), toks=seqs)
    def insert(self, w: str, toks: list[int]) -> None:
        self.tree.insert(toks, w)
        self.given[w].append(tuple(toks))
        self.probes.append(tuple(toks))
        if self.tight:
            assert self.tree.worker_tokens(w) <= self._budget(w)
            assert self.tree.total_tokens <= self.tree.max_total_tokens

    @rule(w=st.sampled_from(WORKERS))
    def remove_worker(self, w: str) -> None:
        self.tree.remove_worker(w)
        assert all(w not in n.workers for n in self.tree.nodes())
        self.given[w] = []
        self.exact[w] = not self.tight
        self.tree.set_worker(w, page_size=PAGES[w], budget_tokens=self._budget(w))

    @precondition(lambda self: any(self.given.values()))
    @rule(data=st.data())
    def remove_prefix(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from([w for w in WORKERS if self.given[w]]))
        toks = list(data.draw(st.sampled_from(self.given[w])))
        keep = data.draw(st.integers(0, len(toks)))
        kept_before = raw(self.tree, toks[:keep]).get(w, 0)
        self.tree.remove_prefix(toks, w, keep=keep)
        if len(toks) > keep:
            assert raw(self.tree, toks).get(w, 0) < len(toks)
        assert raw(self.tree, toks[:keep]).get(w, 0) == kept_before
        self.exact[w] = False

    @rule(toks=seqs)
    def probe(self, toks: list[int]) -> None:
        self.probes.append(tuple(toks))

    @invariant()
    def structure_is_consistent(self) -> None:
        self.tree.validate()

    @invariant()
    def matches_agree_with_model(self) -> None:
        for probe in self.probes[-12:]:
            found, raw_per = self.tree.match_packed(pack(list(probe)))
            rounded = self.tree.match(list(probe)).per_worker
            for w in WORKERS:
                bound = max((lcp(probe, g) for g in self.given[w]), default=0)
                got = raw_per.get(w, 0)
                assert got <= bound, (w, probe, got, bound)
                if self.exact[w]:
                    assert got == bound, (w, probe, got, bound)
                assert got <= found
                ps = PAGES[w]
                assert rounded.get(w, 0) == got - got % ps
                assert rounded.get(w, 0) % ps == 0


TestTreeMachine = pytest.mark.slow(TreeMachine.TestCase)  # a few seconds of examples
TestTreeMachine.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ------------------------------------------------------------- closed-loop correction
def test_correct_drops_stale_claims_past_the_reported_depth_but_keeps_the_fresh_prompt() -> None:
    t = RadixTree()
    t.set_worker("a", page_size=4)
    system = list(range(1, 17))  # 16 tokens: 4 pages
    old1, old2 = [*system, 100, 101, 102, 103], [*system, 200, 201, 202, 203]
    other = [50, 51, 52, 53, 54, 55, 56, 57]
    t.insert(old1, "a")
    t.insert(old2, "a")
    t.insert(other, "a")
    t.insert(old1, "b")
    prompt = [*system, 300, 301, 302, 303]
    t.insert(prompt, "a")
    stamp = t.clock
    # the worker found only the first 6 tokens cached (5 pages counted as 4): it had
    # evicted everything of this path past token 4, so the old questions are gone too
    lost = t.correct(prompt, "a", 6, stamp)
    assert lost == 8  # the two old 4-token questions
    m = t.match(old1)
    assert m.per_worker["a"] == 16 and m.per_worker["b"] == 20  # "a" keeps the fresh prompt's path
    assert raw(t, old2)["a"] == 16
    assert raw(t, prompt)["a"] == 20  # it has just computed the whole prompt
    assert raw(t, other)["a"] == 8  # another branch, untouched
    t.validate()


def test_correct_below_a_stale_prompt_drops_the_whole_stale_subtree() -> None:
    t = RadixTree()
    system = list(range(1, 9))
    t.insert([*system, 9, 10], "a")
    stamp_before = t.clock + 1  # claims made before the next insert are stale
    t.insert([*system, 11, 12], "a")
    # keep=0: nothing of this path was cached; claims older than the last insert go
    lost = t.correct([*system, 11, 12], "a", 0, stamp_before)
    assert lost == 2  # the 9, 10 tail; the shared system and the fresh tail stay
    assert raw(t, [*system, 9, 10])["a"] == 8
    t.validate()


def test_correct_keeps_claims_made_after_the_request() -> None:
    t = RadixTree()
    prompt = list(range(1, 21))
    t.insert(prompt, "a")
    stamp = t.clock
    later = [*prompt[:10], 99, 98]
    t.insert(later, "a")  # dispatched after our request: it corrects itself when it ends
    assert t.correct(prompt, "a", 0, stamp) == 0
    assert raw(t, later)["a"] == 12
    t.validate()


def test_correct_of_unknown_worker_or_path_is_a_no_op() -> None:
    t = RadixTree()
    t.insert([1, 2, 3], "a")
    assert t.correct([1, 2, 3], "zz", 0, t.clock + 1) == 0
    assert t.correct([7, 8, 9], "a", 0, t.clock + 1) == 0
    assert t.correct([1, 2, 3], "a", 3, t.clock + 1) == 0  # all of it was cached
    t.validate()


# ------------------------------------------------------------- leaf-only LRU heap
def test_heap_holds_leaves_not_every_node_on_a_path() -> None:
    t = RadixTree()
    template = [7] * 10
    for i in range(100):
        t.insert([*template, i // 10, i % 10, 100 + i], "a")  # a shared template, a digit trie
    leaves = sum(1 for n in t.nodes() if n.end == 13)
    assert leaves == 100
    assert t.stats().heap_entries == 100  # one per leaf; the restamped shared nodes have none
    t.validate()


def test_a_parent_becomes_evictable_once_its_last_child_is_gone() -> None:
    t = RadixTree(default_budget_tokens=6)
    t.insert([1, 2, 3, 4], "a")
    t.insert([1, 2, 5, 6], "a")  # [1,2] -> {[3,4], [5,6]}: 6 tokens
    t.insert([9], "a")  # 7 > 6: the oldest leaf [3,4] goes, the shared [1,2] stays
    assert raw(t, [1, 2, 3, 4]) == {"a": 2}
    assert raw(t, [1, 2, 5, 6]) == {"a": 4}
    t.insert([8, 8, 8, 8], "a")  # 9 > 6: [5,6] goes, then [1,2] (now a leaf, older than [9])
    assert raw(t, [1, 2, 5, 6]) == {}
    assert raw(t, [9]) == {"a": 1} and raw(t, [8, 8, 8, 8]) == {"a": 4}
    assert t.worker_tokens("a") == 5
    t.validate()


def test_eviction_stops_at_the_budget_when_a_parent_and_child_share_a_stamp() -> None:
    # Found comparing against the per-node heap: a parent pushed when one child went,
    # while another child stamped by the same insert is still held, must not take that
    # child with it (it is not a leaf yet).
    t = RadixTree(default_budget_tokens=8)
    for toks, w in [([0], "w0"), ([2, 0, 1], "w0"), ([0, 0, 1, 2, 1, 0], "w1"), ([2, 0, 2], "w0"),
                    ([0, 1, 2, 0, 1], "w0"), ([0, 1, 0, 0], "w0"), ([0, 1, 0, 1, 0, 0], "w1"), ([0, 1], "w1"),
                    ([1, 0, 2, 2, 1, 2], "w0")]:  # fmt: skip
        t.insert(toks, w)
        t.validate()
    assert t.worker_tokens("w0") == 8
    assert raw(t, [0, 1]) == {"w0": 2, "w1": 2}


def test_background_pass_evicts_down_to_the_low_watermark_lru_first() -> None:
    t = RadixTree(default_budget_tokens=100, evict_inline=False, low_watermark=0.8)
    for i in range(11):
        t.insert([1000 + i] * 10, "a")  # 110 tokens: over, but inside the 1.25 overshoot
    assert t.worker_tokens("a") == 110 and t.over_budget()
    v = t.version
    t.evict(chunk=1)  # one node per locked step: the pass still runs to the watermark
    assert t.worker_tokens("a") == 80
    assert [raw(t, [1000 + i] * 10) for i in (2, 3)] == [{}, {"a": 10}]  # the 3 oldest went
    assert not t.over_budget() and t.version == v  # eviction is not a change to look at
    t.insert([5] * 10, "a")  # 90: under budget, nothing to do
    assert t.evict() == 0 and t.worker_tokens("a") == 90
    t.validate()


def test_hard_bound_in_background_mode_also_goes_to_the_low_watermark() -> None:
    t = RadixTree(default_budget_tokens=100, evict_inline=False, overshoot=1.2, low_watermark=0.5)
    for i in range(13):
        t.insert([2000 + i] * 10, "a")
        assert t.worker_tokens("a") <= 120
    # 120 after the 12th insert is within the 1.2 overshoot; the 13th makes 130: down to
    # 0.5 x 100, the five newest prompts.
    assert t.worker_tokens("a") == 50
    assert t.match([2007] * 10).matched == 0 and t.match([2008] * 10).matched == 10
    t.validate()


def test_inline_mode_keeps_the_exact_budget_whatever_the_watermark() -> None:
    t = RadixTree(default_budget_tokens=20, low_watermark=0.5)
    for i in range(5):
        t.insert([3000 + i] * 5, "a")
    assert t.worker_tokens("a") == 20


def test_global_cap_pass_goes_to_the_low_watermark() -> None:
    t = RadixTree(max_total_tokens=100, evict_inline=False, low_watermark=0.7)
    for i in range(11):
        t.insert([4000 + i] * 10, "ab"[i % 2])
    assert t.total_tokens == 110
    t.evict(chunk=2)
    assert t.total_tokens == 70
    assert t.match([4000] * 10).matched == 0 and t.match([4010] * 10).matched == 10
    t.validate()


def test_bad_watermark_rejected() -> None:
    with pytest.raises(ValueError):
        RadixTree(low_watermark=1.5)
    with pytest.raises(ValueError):
        RadixTree(low_watermark=0.1)


# ------------------------------------------------------- extend: an insert from a mark
def _snapshot(t: RadixTree) -> list[tuple[int, int, tuple[int, ...], list[tuple[str, int]]]]:
    return sorted((n.start, n.end, n.tokens, sorted(n.workers.items())) for n in t.nodes())


def _drain_order(t: RadixTree) -> list[tuple[int, tuple[int, ...], str]]:
    """The order eviction takes every (node, worker) pair: budgets cut to one token, one node at a time."""
    out = []
    for w in t.workers():
        t.set_worker(w, budget_tokens=1, page_size=t.page_size(w))
    while True:
        before = {(n.start, n.tokens, w) for n in t.nodes() for w in n.workers}
        if t.evict_step(1) == 0:
            return out
        after = {(n.start, n.tokens, w) for n in t.nodes() for w in n.workers}
        out.extend(sorted(before - after))


def test_extend_from_a_mark_equals_inserting_the_whole_sequence() -> None:
    """Two trees take the same random stream of inserts, removals, corrections and evictions;
    one continues learned outputs from the marks its earlier inserts returned (falling back
    to a whole insert when a mark went stale), the other inserts every whole sequence. After
    every step they hold the same nodes with the same stamps, and evict in the same order."""
    import random

    rng = random.Random(5)
    a = RadixTree(default_budget_tokens=120, evict_inline=False, overshoot=1.25)
    b = RadixTree(default_budget_tokens=120, evict_inline=False, overshoot=1.25)
    workers = ["w0", "w1", "w2"]
    for t in (a, b):
        for w in workers:
            t.set_worker(w, budget_tokens=120, page_size=1)
    marks: list[tuple[str, list[int], object]] = []
    stale = fresh = 0
    for step in range(3000):
        op = rng.random()
        w = rng.choice(workers)
        if op < 0.45 or not marks:
            seq = [1, 2, *[rng.randrange(3, 6) for _ in range(rng.randrange(0, 9))]]
            added, mark = a.insert_mark(pack(seq), w)
            assert added == b.insert_packed(pack(seq), w)
            if mark is not None:
                marks.append((w, seq, mark))
        elif op < 0.85:
            w, seq, mark = marks.pop(rng.randrange(len(marks)))
            more = [rng.randrange(3, 6) for _ in range(rng.randrange(0, 5))]
            out = a.extend(mark, pack(more), w)
            if out is None:
                stale += 1
                got = a.insert_packed(pack(seq + more), w)
            else:
                fresh += 1
                got = out[0]
                marks.append((w, seq + more, out[1]))
            assert got == b.insert_packed(pack(seq + more), w)
        elif op < 0.9:
            seq = [1, 2, *[rng.randrange(3, 6) for _ in range(rng.randrange(0, 6))]]
            keep = rng.randrange(0, len(seq))
            assert a.remove_prefix(seq, w, keep) == b.remove_prefix(seq, w, keep)
        elif op < 0.93:
            seq = [1, 2, *[rng.randrange(3, 6) for _ in range(rng.randrange(0, 6))]]
            depth, stamp = rng.randrange(0, len(seq)), rng.randrange(0, a.clock + 1)
            assert a.correct(pack(seq), w, depth, stamp) == b.correct(pack(seq), w, depth, stamp)
        elif op < 0.94:
            assert a.remove_worker(w) == b.remove_worker(w)
            for t in (a, b):
                t.set_worker(w, budget_tokens=120, page_size=1)
        else:
            assert a.evict() == b.evict()
        if step % 50 == 0 or step > 2950:
            a.validate()
            assert _snapshot(a) == _snapshot(b)
            assert a.clock == b.clock and a.stats().heap_entries == b.stats().heap_entries
    assert stale > 50 and fresh > 300  # both paths taken, many times
    assert _drain_order(a) == _drain_order(b)


def test_extend_of_a_stale_mark_changes_nothing() -> None:
    t = RadixTree(evict_inline=True)
    t.set_worker("a", budget_tokens=1000)
    _, mark = t.insert_mark(pack([1, 2, 3, 4]), "a")
    assert mark is not None
    t.insert([1, 2, 9], "b")  # splits the marked node: the mark (its lower part) still ends at 4
    out = t.extend(mark, pack([5, 6]), "a")
    assert out is not None and out[0] == 2
    assert raw(t, [1, 2, 3, 4, 5, 6]) == {"a": 6, "b": 2}
    t.remove_prefix([1, 2, 3, 4, 5, 6], "a", 0)
    before, clock = _snapshot(t), t.clock
    assert t.extend(mark, pack([7]), "a") is None  # "a" no longer holds it
    assert _snapshot(t) == before and t.clock == clock
    assert t.extend(mark, pack([7]), "nobody") is None
    t.validate()


def test_extend_by_nothing_restamps_the_path_like_a_repeated_insert() -> None:
    a, b = RadixTree(), RadixTree()
    _, mark = a.insert_mark(pack([1, 2, 3]), "w")
    b.insert([1, 2, 3], "w")
    a.insert([1, 2, 3, 4], "w")
    b.insert([1, 2, 3, 4], "w")
    out = a.extend(mark, b"", "w")
    assert out is not None and out == (0, mark)
    b.insert([1, 2, 3], "w")
    assert _snapshot(a) == _snapshot(b) and a.stats().heap_entries == b.stats().heap_entries
    a.validate()
    assert _drain_order(a) == _drain_order(b)


# Under threads: routing, outside inserts and eviction at once.
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


def test_lru_stamp_is_where_a_workers_next_eviction_starts() -> None:
    t = RadixTree(default_budget_tokens=1_000)
    assert t.lru_stamp("a") is None
    t.insert([1, 2, 3], "a")  # stamp 1
    t.insert([4, 5], "a")  # stamp 2
    assert t.lru_stamp("a") == 1
    t.insert([1, 2, 3, 9], "a")  # [1, 2, 3] used again: stamp 3
    assert t.lru_stamp("a") == 2
    t.set_worker("a", budget_tokens=4)  # [4, 5] is evicted first
    assert t.worker_tokens("a") == 4 and t.lru_stamp("a") == 3
    assert t.lru_stamp("b") is None
