"""A token radix tree that remembers which workers hold which prompt prefixes.

The tree guesses what each worker's KV cache holds, so the ``cache_aware`` policy
can send a prompt where most of it is already cached. Design points, and why:

* Edges are compressed runs of token ids stored as packed uint32 ``bytes``
  (4 bytes a token; the most compact immutable form, and ``prompt.startswith(edge, pos)``
  compares a whole edge in place with one ``memcmp``). Children are keyed by their
  first token.
* Every node maps ``worker -> last use`` (a logical clock bumped per insert). A
  worker that holds a node holds all its ancestors (a KV cache cannot keep a suffix
  without its prefix), and an insert stamps every node on its path, so along any
  path a worker's stamps never increase going down.
* ``match`` walks only the prompt's path and, per node, copies that node's worker
  map into the result with ``dict.update`` (C speed): the cost is
  O(path length + workers present on the path), independent of tree size and of
  workers that hold nothing of the prompt. It changes nothing (no LRU touch).
* Each worker's share is bounded by a token budget (set from its real KV capacity by
  the policy) and the whole tree by ``max_total_tokens``. Eviction is LRU per worker,
  least recently used leaves first: each worker has a lazy min-heap of
  ``(stamp, seq, node)`` holding its *leaves* only (nodes it holds with no child it
  holds): an insert pushes the one node its path ends at, and dropping a node pushes
  its parent, which may have become a leaf. Interior nodes are restamped by every
  insert through them (a shared chat template by every request) but never pushed, so
  a short unique prompt costs one heap entry, not one per node of its path. Stale
  entries are skipped when popped and the heap is compacted when it grows past twice
  the nodes held. Because stamps never increase going down a path and a parent is
  pushed after its children, a live popped entry is a leaf of that worker's holdings,
  so eviction keeps the prefix property.
  ``evict`` works in short locked chunks so a background thread never holds the lock
  for long, and brings a share that went over its bound down to ``low_watermark`` of
  it (1.0 by default: exactly to the bound; lower means fewer, larger passes);
  ``insert`` also evicts inline when a worker or the tree overshoots its
  bound by ``overshoot`` (or always, with ``evict_inline``), so memory never grows
  without bound even if the background thread falls behind. ``version`` changes with
  every insert and budget change, so a background thread can skip a tree that cannot
  have gone over budget since it last looked.
* Nodes left with no worker are pruned at once, so a removed worker leaves no trace.
* All public methods take one lock; critical sections are one walk or one chunk.

Insertions and removals can come from outside the routing path (the workers' KV
events): ``insert(tokens, worker)``, ``remove_prefix(tokens, worker, keep)`` and
``remove_worker(worker)``.
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gateway.policies.hashing import token_array

_NATIVE = sys.byteorder
DEFAULT_BUDGET_TOKENS = 1 << 18
DEFAULT_MAX_TOTAL_TOKENS = 1 << 24
DEFAULT_OVERSHOOT = 1.25
EVICT_CHUNK = 256


def pack(tokens: Sequence[int] | array | bytes) -> bytes:
    """Token ids as native uint32 bytes, the tree's edge format (bytes pass through)."""
    if isinstance(tokens, bytes):
        return tokens
    return token_array(tokens).tobytes()


def _first(key: bytes) -> int:
    return int.from_bytes(key[:4], _NATIVE)


def _common_tokens(pb: bytes, b: int, key: bytes) -> int:
    """Whole tokens shared by ``pb[b:]`` and ``key`` (binary search on bulk compares)."""
    lo = 0  # tokens known equal
    hi = min(len(key), len(pb) - b) >> 2  # tokens that could be equal
    kv = memoryview(key)
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if pb.startswith(kv[: 4 * mid], b):  # memcmp in place, no copies
            lo = mid
        else:
            hi = mid - 1
    kv.release()
    return lo


class _Node:
    __slots__ = ("children", "key", "parent", "workers")

    def __init__(self, key: bytes, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, _Node] | None = None
        self.workers: dict[str, int] = {}


class _WorkerState:
    __slots__ = ("budget", "evicting", "heap", "page_size", "pairs", "tokens")

    def __init__(self, budget: int, page_size: int) -> None:
        self.budget = budget
        self.evicting = False  # a background pass is bringing it down to the low watermark
        self.page_size = max(1, page_size)
        self.tokens = 0  # sum of edge lengths of nodes this worker holds
        self.pairs = 0  # nodes this worker holds
        self.heap: list[tuple[int, int, _Node]] = []  # (stamp, seq, node): its leaves, lazily


Mark = object  # where an inserted sequence ends (a node, opaque to callers): see ``RadixTree.extend``


class TreeMatch(NamedTuple):
    """``matched``: tokens of the prompt found in the tree at all; ``per_worker``: tokens
    each worker holds, rounded down to its page size (workers with 0 left out)."""

    matched: int
    per_worker: dict[str, int]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A read-only copy of one node, for tests and ``inspect``."""

    start: int
    end: int
    tokens: tuple[int, ...]
    workers: dict[str, int]


@dataclass(frozen=True, slots=True)
class TreeStats:
    total_tokens: int
    node_count: int
    max_total_tokens: int
    worker_tokens: dict[str, int]
    worker_budgets: dict[str, int]
    heap_entries: int


class RadixTree:
    """Token radix tree of worker cache holdings with per-worker LRU budgets."""

    def __init__(
        self,
        *,
        default_budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        overshoot: float = DEFAULT_OVERSHOOT,
        evict_inline: bool = True,
        low_watermark: float = 1.0,
    ) -> None:
        if default_budget_tokens < 1 or max_total_tokens < 1:
            raise ValueError("budgets must be >= 1 token")
        if overshoot < 1.0:
            raise ValueError("overshoot must be >= 1.0")
        if not 0.5 <= low_watermark <= 1.0:
            raise ValueError("low_watermark must be in [0.5, 1]")
        self.default_budget_tokens = default_budget_tokens
        self.max_total_tokens = max_total_tokens
        self.overshoot = overshoot
        self.evict_inline = evict_inline
        # Background passes (``evict``) and the overshoot bound bring a worker (or the tree)
        # that went over its bound down to this fraction of it, so they run in fewer,
        # larger batches; inline eviction (``evict_inline``) keeps the exact bound.
        self.low_watermark = low_watermark
        self.version = 0  # bumped by every insert and budget change: nothing new, nothing to evict
        self._evicting_total = False
        self._root = _Node(b"", None)
        self._lock = threading.Lock()
        self._clock = 0
        self._seq = itertools.count()
        self._workers: dict[str, _WorkerState] = {}
        self.total_tokens = 0
        self.node_count = 0

    # ----------------------------------------------------------------- workers
    def set_worker(self, worker: str, *, budget_tokens: int | None = None, page_size: int = 1) -> None:
        """Register ``worker`` (or update its budget and page size)."""
        budget = budget_tokens if budget_tokens and budget_tokens > 0 else self.default_budget_tokens
        with self._lock:
            st = self._workers.get(worker)
            if st is None:
                self._workers[worker] = _WorkerState(budget, page_size)
            else:
                st.budget = budget
                st.page_size = max(1, page_size)
            self.version += 1
            if self.evict_inline:
                self._evict_worker_locked(worker, self._workers[worker], budget, None)

    def workers(self) -> list[str]:
        with self._lock:
            return list(self._workers)

    def has_worker(self, worker: str) -> bool:
        return worker in self._workers

    def worker_tokens(self, worker: str) -> int:
        st = self._workers.get(worker)
        return st.tokens if st else 0

    def worker_budget(self, worker: str) -> int:
        st = self._workers.get(worker)
        return st.budget if st else self.default_budget_tokens

    def page_size(self, worker: str) -> int:
        st = self._workers.get(worker)
        return st.page_size if st else 1

    def lru_stamp(self, worker: str) -> int | None:
        """The stamp of ``worker``'s least recently used node, where its next eviction
        starts (None when it holds nothing): comparing it across workers says whose
        cache would give up the oldest content to a new prompt, as one cache pooling
        their memory would. Stale heap entries on top are dropped on the way, as
        eviction drops them."""
        with self._lock:
            st = self._workers.get(worker)
            if st is None:
                return None
            heap = st.heap
            while heap and heap[0][2].workers.get(worker) != heap[0][0]:
                heapq.heappop(heap)
            return heap[0][0] if heap else None

    @property
    def clock(self) -> int:
        """The logical clock: the stamp the latest insert gave the nodes on its path."""
        return self._clock

    # ------------------------------------------------------------------- match
    def match(self, tokens: Sequence[int] | array | bytes) -> TreeMatch:
        """Tokens of ``tokens`` each worker holds, rounded to whole pages of its page size."""
        matched, raw = self.match_packed(pack(tokens))
        out: dict[str, int] = {}
        for w, d in raw.items():
            st = self._workers.get(w)
            ps = st.page_size if st else 1
            d -= d % ps
            if d:
                out[w] = d
        return TreeMatch(matched, out)

    def match_packed(self, pb: bytes) -> tuple[int, dict[str, int]]:
        """(tokens found in the tree, raw tokens held per worker) for packed tokens ``pb``.

        Walks only the prompt's path; never changes the tree.
        """
        mv = memoryview(pb).cast("I")
        n = len(mv)
        found: dict[str, int] = {}
        pos = 0
        node = self._root
        with self._lock:
            while pos < n:
                ch = node.children
                if not ch:
                    break
                child = ch.get(mv[pos])
                if child is None:
                    break
                key = child.key
                b = pos << 2
                if pb.startswith(key, b):
                    pos += len(key) >> 2
                    found.update(dict.fromkeys(child.workers, pos))
                    node = child
                else:
                    pos += _common_tokens(pb, b, key)
                    found.update(dict.fromkeys(child.workers, pos))
                    break
        mv.release()
        return pos, found

    # ------------------------------------------------------------------ insert
    def insert(self, tokens: Sequence[int] | array | bytes, worker: str) -> int:
        """Record that ``worker`` now holds ``tokens``; returns tokens newly attributed to it."""
        return self.insert_packed(pack(tokens), worker)

    def insert_packed(self, pb: bytes, worker: str) -> int:
        return self.insert_mark(pb, worker)[0]

    def insert_mark(self, pb: bytes, worker: str) -> tuple[int, Mark | None]:
        """``insert_packed`` that also returns a mark of where the sequence ends (None for an
        empty one), from which ``extend`` continues it without walking it again."""
        with self._lock:
            st = self._workers.get(worker)
            if st is None:
                st = self._workers[worker] = _WorkerState(self.default_budget_tokens, 1)
            self._clock += 1
            self.version += 1
            added, node = self._descend(self._root, pb, worker, st, self._clock)
            if len(st.heap) > 2 * st.pairs + 64:
                self._compact(worker, st)
            self._bound_locked(worker, st)
        return added, None if node is self._root else node

    def extend(self, mark: Mark, more: bytes, worker: str) -> tuple[int, Mark] | None:
        """Record that ``worker`` now holds the sequence that ends at ``mark`` followed by
        ``more`` (packed tokens): exactly ``insert_packed(sequence + more, worker)``, but the
        sequence's path is restamped bottom-up instead of walked from the root. None, with
        nothing changed, when the mark no longer stands for a sequence ``worker`` holds (it
        was evicted or removed since): the caller inserts the whole sequence instead.

        Why it equals the full insert: the mark is the node the sequence's insert ended at,
        and a node's end depth never changes (a split keeps the lower part, which ends
        where the node did); while ``worker`` holds it, it holds every ancestor too (the
        prefix property), so a full insert would walk exactly this chain, adding nothing on
        it and stamping each node, then continue below the mark with ``more``.
        """
        with self._lock:
            st = self._workers.get(worker)
            node: _Node = mark  # type: ignore[assignment]
            if st is None or worker not in node.workers:
                return None
            self._clock += 1
            self.version += 1
            now = self._clock
            root = self._root
            up: _Node | None = node
            while up is not root and up is not None:
                up.workers[worker] = now
                up = up.parent
            added, end = self._descend(node, more, worker, st, now)
            if end is node:  # ``more`` was empty: the path's end is the mark itself
                heapq.heappush(st.heap, (now, next(self._seq), node))
            if len(st.heap) > 2 * st.pairs + 64:
                self._compact(worker, st)
            self._bound_locked(worker, st)
        return added, end

    def _descend(self, node: _Node, pb: bytes, worker: str, st: _WorkerState, now: int) -> tuple[int, _Node]:
        """Insert ``pb`` below ``node`` for ``worker`` at stamp ``now`` (lock held): the
        tokens newly attributed to it and the node the path ends at (pushed on its heap
        when ``pb`` is not empty)."""
        mv = memoryview(pb).cast("I")
        n = len(mv)
        added = 0
        heap = st.heap
        pos = 0
        while pos < n:
            ch = node.children
            first = mv[pos]
            child = ch.get(first) if ch else None
            if child is None:
                leaf = _Node(pb[pos << 2 :], node)
                if ch is None:
                    node.children = ch = {}
                ch[first] = leaf
                length = n - pos
                self.total_tokens += length
                self.node_count += 1
                leaf.workers[worker] = now
                st.tokens += length
                st.pairs += 1
                added += length
                node = leaf
                break
            key = child.key
            b = pos << 2
            if not pb.startswith(key, b):
                child = self._split(child, _common_tokens(pb, b, key), pos)
                key = child.key
            length = len(key) >> 2
            pos += length
            held = child.workers
            if worker not in held:
                st.tokens += length
                st.pairs += 1
                added += length
            held[worker] = now
            node = child
        mv.release()
        if n and node is not self._root:  # the path's end: the one node that may be a leaf
            heapq.heappush(heap, (now, next(self._seq), node))
        return added, node

    def _split(self, node: _Node, m: int, start: int) -> _Node:
        """Cut ``node``'s edge after ``m`` tokens; the new upper node is returned.

        The lower part keeps its identity (so its heap entries stay valid); the upper
        node copies the worker stamps and needs no heap entry: every worker on it holds
        the lower part, so it is a leaf of no one.
        """
        parent = node.parent
        assert parent is not None and parent.children is not None and 0 < m
        top = _Node(node.key[: m << 2], parent)
        node.key = node.key[m << 2 :]
        top.children = {_first(node.key): node}
        top.workers = dict(node.workers)
        parent.children[_first(top.key)] = top
        node.parent = top
        self.node_count += 1
        for w in top.workers:
            self._workers[w].pairs += 1
        return top

    # ---------------------------------------------------------------- removals
    def remove_worker(self, worker: str) -> int:
        """Forget ``worker`` entirely; returns how many nodes it held."""
        with self._lock:
            st = self._workers.pop(worker, None)
            if st is None:
                return 0
            # Every node it holds is an ancestor of (or is) one of its leaves, and every
            # leaf has a heap entry: collect upwards from them, then drop deepest first.
            held: dict[int, tuple[int, _Node]] = {}
            for _t, _s, leaf in st.heap:
                chain: list[_Node] = []
                node: _Node | None = leaf
                while node is not None and node is not self._root and id(node) not in held and worker in node.workers:
                    chain.append(node)
                    node = node.parent
                base = held[id(node)][0] if node is not None and id(node) in held else 0
                for i, c in enumerate(reversed(chain), 1):
                    held[id(c)] = (base + i, c)
            for _depth, node in sorted(held.values(), key=lambda e: -e[0]):
                del node.workers[worker]
                if not node.workers:
                    self._prune(node)
            return len(held)

    def remove_prefix(self, tokens: Sequence[int] | array | bytes, worker: str, keep: int = 0) -> int:
        """``worker`` dropped the KV of ``tokens[keep:]``; returns tokens it lost in the tree.

        It keeps ``tokens[:keep]``. Everything it held that extends the whole of
        ``tokens`` goes too; other branches that merely share ``tokens[keep:j]`` stay,
        and so do the nodes they need.
        """
        pb = pack(tokens)
        mv = memoryview(pb).cast("I")
        n = len(mv)
        keep = max(0, keep)
        removed = 0
        with self._lock:
            st = self._workers.get(worker)
            if st is not None and keep < n:
                end = self._walk_depth(pb, mv)
                if end > keep:
                    if keep:
                        self._split_at(pb, mv, keep)
                    self._split_at(pb, mv, end)
                    path = self._path(pb, mv, end)  # (start, node) pairs, root excluded
                    for i in range(len(path) - 1, -1, -1):
                        start, node = path[i]
                        if start < keep or worker not in node.workers:
                            continue
                        deepest = i == len(path) - 1
                        if deepest and end == n:
                            removed += self._drop_subtree(node, worker, st)
                        elif not self._has_worker_child(node, worker):
                            removed += self._drop(node, worker, st)
                        else:
                            break
        mv.release()
        return removed

    def correct(self, tokens: Sequence[int] | array | bytes, worker: str, keep: int, before: int) -> int:
        """``worker`` held only ``tokens[:keep]`` when it prefilled ``tokens``: drop stale claims.

        The worker reported ``keep`` cached tokens, so (KV caches hold whole pages) it
        held nothing on this path past ``keep`` rounded down to its page, nor anything
        extending that. Its claims there stamped before ``before`` (the clock after this
        prompt's own insert) are dropped; the prompt's own path, and claims made later,
        stay: the worker has just computed the prompt, and later requests correct
        themselves when they finish. Stamps never increase going down a path, so
        dropping every stale claim below a point keeps the prefix property. Returns
        tokens the worker lost in the tree.
        """
        pb = pack(tokens)
        mv = memoryview(pb).cast("I")
        removed = 0
        with self._lock:
            st = self._workers.get(worker)
            if st is not None:
                keep = max(0, keep - keep % st.page_size)
                if keep < len(mv) and self._walk_depth(pb, mv) > keep:
                    if keep:
                        self._split_at(pb, mv, keep)
                    node, pos = self._root, 0
                    while pos < keep:  # down to the node ending at ``keep``
                        assert node.children is not None
                        node = node.children[mv[pos]]
                        pos += len(node.key) >> 2
                    ch = node.children
                    top = ch.get(mv[keep]) if ch else None
                    if top is not None:
                        removed = self._drop_stale(top, worker, st, before)
        mv.release()
        return removed

    def _drop_stale(self, top: _Node, worker: str, st: _WorkerState, before: int) -> int:
        """Drop ``worker``'s claims stamped before ``before`` in ``top``'s subtree (deepest first)."""
        order: list[_Node] = []
        stack = [top]
        while stack:
            cur = stack.pop()
            t = cur.workers.get(worker)
            if t is None:
                continue  # it holds nothing below either (prefix property)
            if t < before:
                order.append(cur)
            if cur.children:
                stack.extend(cur.children.values())
        return sum(self._drop(cur, worker, st) for cur in reversed(order))

    def _walk_depth(self, pb: bytes, mv: memoryview) -> int:
        node, pos, n = self._root, 0, len(mv)
        while pos < n:
            child = node.children.get(mv[pos]) if node.children else None
            if child is None:
                break
            key = child.key
            b = pos << 2
            if pb.startswith(key, b):
                pos += len(key) >> 2
                node = child
            else:
                return pos + _common_tokens(pb, b, key)
        return pos

    def _split_at(self, pb: bytes, mv: memoryview, depth: int) -> None:
        """Make sure a node boundary sits at ``depth`` on the prompt's (existing) path."""
        node, pos = self._root, 0
        while pos < depth:
            assert node.children is not None
            child = node.children[mv[pos]]
            length = len(child.key) >> 2
            if pos + length > depth:
                self._split(child, depth - pos, pos)
                return
            pos += length
            node = child

    def _path(self, pb: bytes, mv: memoryview, depth: int) -> list[tuple[int, _Node]]:
        node, pos, out = self._root, 0, []
        while pos < depth:
            assert node.children is not None
            child = node.children[mv[pos]]
            out.append((pos, child))
            pos += len(child.key) >> 2
            node = child
        return out

    @staticmethod
    def _has_worker_child(node: _Node, worker: str) -> bool:
        ch = node.children
        return bool(ch) and any(worker in c.workers for c in ch.values())  # type: ignore[union-attr]

    def _drop(self, node: _Node, worker: str, st: _WorkerState) -> int:
        """Drop ``worker`` from ``node`` (a leaf of its holdings); its parent may now be one."""
        del node.workers[worker]
        length = len(node.key) >> 2
        st.tokens -= length
        st.pairs -= 1
        parent = node.parent
        if not node.workers:
            self._prune(node)
        if parent is not None and parent is not self._root:
            t = parent.workers.get(worker)
            if t is not None and not self._has_worker_child(parent, worker):  # it became a leaf
                heapq.heappush(st.heap, (t, next(self._seq), parent))
        return length

    def _drop_subtree(self, node: _Node, worker: str, st: _WorkerState) -> int:
        """Drop ``worker`` from ``node`` and every descendant it holds (deepest first)."""
        order: list[_Node] = []
        stack = [node]
        while stack:
            cur = stack.pop()
            order.append(cur)
            if cur.children:
                stack.extend(c for c in cur.children.values() if worker in c.workers)
        return sum(self._drop(cur, worker, st) for cur in reversed(order))

    def _prune(self, node: _Node) -> None:
        """Detach ``node`` and any ancestors left with no worker and no child."""
        while node is not self._root and not node.workers and not node.children:
            parent = node.parent
            assert parent is not None and parent.children is not None
            del parent.children[_first(node.key)]
            if not parent.children:
                parent.children = None
            self.total_tokens -= len(node.key) >> 2
            self.node_count -= 1
            node.parent = None
            node = parent

    # ---------------------------------------------------------------- eviction
    def over_budget(self) -> bool:
        """A worker or the tree is over its bound, or a pass toward the low watermark is unfinished."""
        if self.total_tokens > self.max_total_tokens or self._evicting_total:
            return True
        return any(st.tokens > st.budget or st.evicting for st in list(self._workers.values()))

    def evict(self, chunk: int = EVICT_CHUNK) -> int:
        """Bring every worker within its budget and the tree within its cap.

        Works in locked chunks of at most ``chunk`` node evictions (``evict_step``),
        releasing the lock in between, so routing never waits long. Returns nodes evicted.
        """
        done = 0
        while True:
            n = self.evict_step(chunk)
            if n == 0:
                return done
            done += n

    def evict_step(self, chunk: int = EVICT_CHUNK) -> int:
        """One locked chunk: evict for the first over-budget worker, else for the global cap.

        A worker (or the tree) that went over its bound is brought down to
        ``low_watermark`` of it over as many steps as that takes.
        """
        low = self.low_watermark
        with self._lock:
            for w, st in self._workers.items():
                if st.tokens > st.budget:
                    st.evicting = True
                if st.evicting:
                    target = int(st.budget * low)
                    n = self._evict_worker_locked(w, st, target, chunk)
                    if st.tokens <= target or n < chunk:
                        st.evicting = False
                    if n:
                        return n
            if self.total_tokens > self.max_total_tokens:
                self._evicting_total = True
            if self._evicting_total:
                target = int(self.max_total_tokens * low)
                n = self._evict_global_locked(target, chunk)
                if self.total_tokens <= target or n < chunk:
                    self._evicting_total = False
                return n
        return 0

    def _bound_locked(self, worker: str, st: _WorkerState) -> None:
        """Inline eviction after an insert: always in inline mode, else only on overshoot."""
        if self.evict_inline:
            if st.tokens > st.budget:
                self._evict_worker_locked(worker, st, st.budget, None)
            if self.total_tokens > self.max_total_tokens:
                self._evict_global_locked(self.max_total_tokens, None)
            return
        factor, low = self.overshoot, self.low_watermark
        if st.tokens > st.budget * factor:
            self._evict_worker_locked(worker, st, int(st.budget * low), None)
        if self.total_tokens > self.max_total_tokens * factor:
            self._evict_global_locked(int(self.max_total_tokens * low), None)

    def _pop_live(self, worker: str, st: _WorkerState) -> _Node | None:
        heap = st.heap
        while heap:
            t, _s, node = heapq.heappop(heap)
            if node.workers.get(worker) == t:
                return node
        return None

    def _evict_one(self, worker: str, st: _WorkerState) -> bool:
        """Drop ``worker``'s least recently used leaf; False when it holds nothing."""
        while True:
            node = self._pop_live(worker, st)
            if node is None:
                return False
            if not self._has_worker_child(node, worker):
                self._drop(node, worker, st)
                return True
            # A parent pushed when one child went, with a child of the same stamp still
            # held: not a leaf yet. That child's subtree has a leaf entry of its own, and
            # the parent is pushed again when its last child goes.

    def _evict_worker_locked(self, worker: str, st: _WorkerState, target: int, limit: int | None) -> int:
        """Drop ``worker``'s LRU leaves until it holds ``target`` tokens (at most ``limit`` nodes).

        ``_evict_one`` and ``_drop`` in one loop: in a set of processes every tree
        evicts for the whole set's traffic, so the per-node cost is paid N times over.
        """
        n = 0
        heap = st.heap
        pop, push, seq, root = heapq.heappop, heapq.heappush, self._seq, self._root
        while st.tokens > target and (limit is None or n < limit):
            while heap:
                t, _s, node = pop(heap)
                held = node.workers
                if held.get(worker) == t:
                    ch = node.children
                    if not ch:
                        break
                    for c in ch.values():  # a plain loop: no generator per node
                        if worker in c.workers:
                            break  # not a leaf yet: see _evict_one
                    else:
                        break
            else:
                return n
            del held[worker]
            st.tokens -= len(node.key) >> 2
            st.pairs -= 1
            parent = node.parent
            if not held:
                self._prune(node)
            if parent is not root and parent is not None:
                pt = parent.workers.get(worker)
                if pt is not None:
                    pch = parent.children
                    if pch:
                        for c in pch.values():
                            if worker in c.workers:
                                break
                        else:
                            push(heap, (pt, next(seq), parent))  # it became a leaf
                    else:
                        push(heap, (pt, next(seq), parent))
            n += 1
        return n

    def _evict_global_locked(self, target: int, limit: int | None) -> int:
        """Evict the globally least recently used (node, worker) pairs until under ``target``."""
        tops: list[tuple[int, int, str]] = []
        for w, st in self._workers.items():
            heap = st.heap
            while heap and heap[0][2].workers.get(w) != heap[0][0]:
                heapq.heappop(heap)
            if heap:
                tops.append((heap[0][0], heap[0][1], w))
        heapq.heapify(tops)
        n = 0
        while tops and self.total_tokens > target and (limit is None or n < limit):
            _t, _d, w = tops[0]
            st = self._workers[w]
            self._evict_one(w, st)
            n += 1
            heap = st.heap
            while heap and heap[0][2].workers.get(w) != heap[0][0]:
                heapq.heappop(heap)
            if heap:
                heapq.heapreplace(tops, (heap[0][0], heap[0][1], w))
            else:
                heapq.heappop(tops)
        return n

    def _compact(self, worker: str, st: _WorkerState) -> None:
        # Live entries only, one per node (a parent may have been pushed once per dropped child).
        live = {id(e[2]): e for e in st.heap if e[2].workers.get(worker) == e[0]}
        st.heap = list(live.values())
        heapq.heapify(st.heap)

    # ----------------------------------------------------------- introspection
    def stats(self) -> TreeStats:
        with self._lock:
            return TreeStats(
                total_tokens=self.total_tokens,
                node_count=self.node_count,
                max_total_tokens=self.max_total_tokens,
                worker_tokens={w: st.tokens for w, st in self._workers.items()},
                worker_budgets={w: st.budget for w, st in self._workers.items()},
                heap_entries=sum(len(st.heap) for st in self._workers.values()),
            )

    def nodes(self) -> list[NodeInfo]:
        """Copies of every node except the root, parents before children."""
        out: list[NodeInfo] = []
        with self._lock:
            stack: list[tuple[_Node, int]] = [(self._root, 0)]
            while stack:
                node, start = stack.pop()
                end = start + (len(node.key) >> 2)
                if node is not self._root:
                    toks = tuple(memoryview(node.key).cast("I"))
                    out.append(NodeInfo(start, end, toks, dict(node.workers)))
                if node.children:
                    stack.extend((c, end) for c in node.children.values())
        return out

    def validate(self) -> None:
        """Check every structural invariant; raises AssertionError naming the first broken one."""
        with self._lock:
            tokens: dict[str, int] = dict.fromkeys(self._workers, 0)
            pairs: dict[str, int] = dict.fromkeys(self._workers, 0)
            live: set[tuple[int, str, int]] = set()
            for w, st in self._workers.items():
                live.update((id(e[2]), w, e[0]) for e in st.heap)
            total = count = 0
            stack: list[_Node] = [self._root]
            while stack:
                node = stack.pop()
                if node is not self._root:
                    _check(len(node.key) >= 4 and len(node.key) % 4 == 0, "empty or ragged edge")
                    _check(bool(node.workers), "node with no worker was not pruned")
                    total += len(node.key) >> 2
                    count += 1
                    parent = node.parent
                    _check(parent is not None, "detached node still linked")
                    assert parent is not None
                    for w, t in node.workers.items():
                        _check(w in tokens, f"unregistered worker {w!r} in tree")
                        tokens[w] += len(node.key) >> 2
                        pairs[w] += 1
                        if not any(w in c.workers for c in (node.children or {}).values()):
                            _check((id(node), w, t) in live, f"no heap entry for {w!r}'s leaf")
                        if parent is not self._root:
                            pt = parent.workers.get(w)
                            _check(pt is not None, f"{w!r} holds a node but not its parent")
                            _check(pt is not None and pt >= t, "stamps increase going down")
                if node.children:
                    for k, c in node.children.items():
                        _check(k == _first(c.key), "child keyed by the wrong token")
                        _check(c.parent is node, "child's parent link is wrong")
                        stack.append(c)
            _check(total == self.total_tokens, f"total_tokens {self.total_tokens} != {total}")
            _check(count == self.node_count, f"node_count {self.node_count} != {count}")
            for w, st in self._workers.items():
                _check(st.tokens == tokens[w], f"{w!r} tokens {st.tokens} != {tokens[w]}")
                _check(st.pairs == pairs[w], f"{w!r} pairs {st.pairs} != {pairs[w]}")


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"radix tree invariant broken: {what}")
