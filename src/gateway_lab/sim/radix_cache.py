"""A token-level radix KV cache with a fixed-size token pool, like a GPU worker's.

Why it exists: the simulator has to report *true* cached-token counts and
evict like a real worker, so routing policies can be judged against it. The
pool has ``capacity`` token slots, shared by

* the tree: token sequences whose KV is kept for reuse, stored in whole
  pages of ``page_size`` tokens (edges are multiples of a page), and
* private slots: tokens that running requests hold outside the tree (the
  uncached part of a prompt being prefilled, generated tokens, partial pages).

Running requests lock the tree nodes they use (reference counts up to the
root); only unreferenced leaves are evicted, least recently used first. An
allocation evicts as needed and fails rather than exceed the capacity.

When event recording is on, the cache records what a KV-event subscriber needs:
pages stored (with chained block hashes), pages removed, cache cleared.
Pure and synchronous: no asyncio, no I/O.
"""

from __future__ import annotations

import heapq
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


def block_hash(parent: int | None, page: Sequence[int]) -> int:
    """Chained hash of one KV page, as a signed int64.

    ``xxh3_64`` of the page's token ids as little-endian uint32, seeded with the
    parent block's hash (as unsigned 64 bit; 0 for the first page). Each hash
    therefore names the whole prefix up to the end of its page.
    """
    data = array("I", page)
    if sys.byteorder == "big":
        data.byteswap()
    seed = 0 if parent is None else parent % _U64
    h = xxhash.xxh3_64_intdigest(data.tobytes(), seed=seed)
    return h - _U64 if h > _I64_MAX else h


def block_hashes(tokens: Sequence[int], page_size: int) -> list[int]:
    """The chained hashes of every whole page of ``tokens``."""
    out: list[int] = []
    parent: int | None = None
    for start in range(0, len(tokens) - page_size + 1, page_size):
        parent = block_hash(parent, tokens[start : start + page_size])
        out.append(parent)
    return out


class Node:
    """One edge of the tree: ``key`` tokens (whole pages) below ``parent``."""

    __slots__ = ("children", "hashes", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: list[int], parent: Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.hashes: list[int] | None = None  # one per page, computed on demand

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Node(len={len(self.key)}, lock={self.lock_ref}, children={len(self.children)})"


@dataclass(frozen=True)
class StoredEvent:
    """Pages newly held: (hash, tokens) per page; ``parent_hash`` precedes the first."""

    parent_hash: int | None
    blocks: list[tuple[int, list[int]]]


@dataclass(frozen=True)
class RemovedEvent:
    hashes: list[int]


@dataclass(frozen=True)
class ClearedEvent:
    pass


CacheEvent = StoredEvent | RemovedEvent | ClearedEvent


class RadixCache:
    """Radix tree of token pages plus the token pool it lives in."""

    def __init__(self, page_size: int, capacity: int) -> None:
        if page_size < 1 or capacity < page_size:
            raise ValueError("need page_size >= 1 and capacity >= page_size")
        self.page_size = page_size
        self.capacity = capacity
        self.root = Node([], None)
        self.root.lock_ref = 1  # never evicted
        self.tree_tokens = 0
        self.protected_tokens = 0  # tree tokens under a lock
        self.private_tokens = 0
        self.evicted_tokens = 0  # lifetime total
        self.num_nodes = 0
        self._tick = 0
        self._heap: list[tuple[int, int, Node]] = []
        self._heap_seq = 0
        self._events: list[CacheEvent] | None = None

    # ---------------------------------------------------------------- accounting
    @property
    def used_tokens(self) -> int:
        return self.tree_tokens + self.private_tokens

    @property
    def free_tokens(self) -> int:
        return self.capacity - self.used_tokens

    @property
    def evictable_tokens(self) -> int:
        return self.tree_tokens - self.protected_tokens

    @property
    def available_tokens(self) -> int:
        """Slots an allocation could get right now (free plus evictable)."""
        return self.capacity - self.private_tokens - self.protected_tokens

    def alloc(self, n: int) -> bool:
        """Take ``n`` private slots, evicting LRU leaves if needed; False if impossible."""
        if n <= 0:
            return True
        if self.free_tokens < n:
            if self.available_tokens < n:
                return False
            self.evict(n - self.free_tokens)
        self.private_tokens += n
        return True

    def release(self, n: int) -> None:
        """Give back ``n`` private slots."""
        if n < 0 or n > self.private_tokens:
            raise ValueError(f"cannot release {n} of {self.private_tokens} private tokens")
        self.private_tokens -= n

    # ---------------------------------------------------------------- events
    def enable_events(self) -> None:
        """Start recording KV events (drained by :meth:`drain_events`)."""
        if self._events is None:
            self._events = []

    @property
    def events_enabled(self) -> bool:
        return self._events is not None

    def drain_events(self) -> list[CacheEvent]:
        if not self._events:
            return []
        out, self._events = self._events, []
        return out

    # ---------------------------------------------------------------- lookup
    def _touch(self, node: Node) -> None:
        self._tick += 1
        tick = self._tick
        deepest = node
        while node is not self.root:
            node.last_access = tick
            node = node.parent  # type: ignore[assignment]
        if not deepest.children and deepest.lock_ref == 0 and deepest is not self.root:
            self._push(deepest)

    def _walk(self, tokens: list[int], limit: int, split: bool) -> tuple[Node, int]:
        """Follow ``tokens[:limit]`` (limit a multiple of page) as far as the tree holds it."""
        ps = self.page_size
        node = self.root
        pos = 0
        while pos < limit:
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            key = child.key
            end = pos + len(key)
            if end <= limit and key == tokens[pos:end]:
                node = child
                pos = end
                continue
            # The edge diverges (or runs past the limit) after some whole pages;
            # the first page matched through the dict key.
            matched = ps
            stop = min(len(key), limit - pos)
            while (
                matched + ps <= stop
                and key[matched : matched + ps] == tokens[pos + matched : pos + matched + ps]
            ):
                matched += ps
            if split:
                node = self._split(child, matched)
            pos += matched
            break
        return node, pos

    def match_prefix(self, tokens: Sequence[int], max_len: int | None = None) -> tuple[Node, int]:
        """Longest cached prefix of ``tokens`` in whole pages: (node ending it, length).

        Refreshes the prefix's LRU time. ``max_len`` caps the match (a worker
        always recomputes at least the last prompt token).
        """
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        limit = len(tokens) if max_len is None else min(len(tokens), max_len)
        limit -= limit % self.page_size
        node, pos = self._walk(tokens, limit, split=True)
        if node is not self.root:
            self._touch(node)
        return node, pos

    def peek_prefix_len(self, tokens: Sequence[int], max_len: int | None = None) -> int:
        """Like :meth:`match_prefix` but changes nothing (no split, no LRU refresh)."""
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        limit = len(tokens) if max_len is None else min(len(tokens), max_len)
        limit -= limit % self.page_size
        return self._walk(tokens, limit, split=False)[1]

    # ---------------------------------------------------------------- update
    def insert(self, tokens: Sequence[int], private_covered: int = 0) -> tuple[Node, int]:
        """Add the whole pages of ``tokens`` to the tree: (node ending them, tokens added).

        ``private_covered`` is how many of those tokens the caller held as
        private slots (the part beyond the prefix it already had locked): they
        leave the private count, as new tree tokens or as freed duplicates.
        """
        ps = self.page_size
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        limit = len(tokens) - len(tokens) % ps
        if private_covered < 0 or private_covered > min(limit, self.private_tokens):
            raise ValueError(f"private_covered={private_covered} out of range")
        node, pos = self._walk(tokens, limit, split=True)
        added = 0
        if pos < limit:
            key = tokens[pos:limit]
            leaf = Node(key, node)
            node.children[tuple(key[:ps])] = leaf
            self.num_nodes += 1
            added = len(key)
            self.tree_tokens += added
            if self._events is not None:
                parent_hash = self._last_hash(node)
                leaf.hashes = self._chain(parent_hash, key)
                self._events.append(
                    StoredEvent(
                        parent_hash,
                        [(h, key[i * ps : (i + 1) * ps]) for i, h in enumerate(leaf.hashes)],
                    )
                )
            node = leaf
        self.private_tokens -= private_covered
        if node is not self.root:
            self._touch(node)
        return node, added

    def lock(self, node: Node) -> None:
        """Protect ``node`` and its ancestors from eviction (reference counted)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.protected_tokens += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        deepest = node
        while node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError("unlock of an unlocked node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_tokens -= len(node.key)
            node = node.parent  # type: ignore[assignment]
        if deepest is not self.root and deepest.lock_ref == 0 and not deepest.children:
            self._push(deepest)

    def evict(self, n: int) -> int:
        """Evict unreferenced leaves, LRU first, until ``n`` tokens are freed; returns freed."""
        freed = 0
        heap = self._heap
        while freed < n and heap:
            access, _, node = heapq.heappop(heap)
            if node.parent is None or node.children or node.lock_ref or node.last_access != access:
                continue  # stale entry
            freed += self._remove_leaf(node)
        self.evicted_tokens += freed
        return freed

    def clear(self) -> None:
        """Drop the whole tree (only allowed when nothing is locked)."""
        if self.protected_tokens:
            raise RuntimeError("cannot clear the cache while requests hold locks")
        self.root = Node([], None)
        self.root.lock_ref = 1
        self.tree_tokens = 0
        self.num_nodes = 0
        self._heap = []
        if self._events is not None:
            self._events.append(ClearedEvent())

    # ---------------------------------------------------------------- internals
    def _push(self, node: Node) -> None:
        self._heap_seq += 1
        heapq.heappush(self._heap, (node.last_access, self._heap_seq, node))
        if len(self._heap) > 4 * self.num_nodes + 64:
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        """Drop stale heap entries: one entry per evictable leaf."""
        entries: list[tuple[int, int, Node]] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.lock_ref == 0:
                self._heap_seq += 1
                entries.append((node.last_access, self._heap_seq, node))
        heapq.heapify(entries)
        self._heap = entries

    def _split(self, child: Node, at: int) -> Node:
        """Cut ``child``'s edge after ``at`` tokens; the new upper node is returned."""
        ps = self.page_size
        parent = child.parent
        assert parent is not None
        upper = Node(child.key[:at], parent)
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.children[tuple(child.key[at : at + ps])] = child
        if child.hashes is not None:
            upper.hashes = child.hashes[: at // ps]
            child.hashes = child.hashes[at // ps :]
        parent.children[tuple(child.key[:ps])] = upper
        child.key = child.key[at:]
        child.parent = upper
        self.num_nodes += 1
        return upper

    def _remove_leaf(self, node: Node) -> int:
        parent = node.parent
        assert parent is not None
        del parent.children[tuple(node.key[: self.page_size])]
        if self._events is not None:
            self._events.append(RemovedEvent(self._hashes(node)))
        node.parent = None
        size = len(node.key)
        self.tree_tokens -= size
        self.num_nodes -= 1
        if parent is not self.root and not parent.children and parent.lock_ref == 0:
            self._push(parent)
        return size

    def _chain(self, parent_hash: int | None, key: list[int]) -> list[int]:
        ps = self.page_size
        out: list[int] = []
        for start in range(0, len(key), ps):
            parent_hash = block_hash(parent_hash, key[start : start + ps])
            out.append(parent_hash)
        return out

    def _hashes(self, node: Node) -> list[int]:
        """The node's page hashes, computing any missing ones down from the root."""
        if node.hashes is not None:
            return node.hashes
        pending: list[Node] = []
        cur: Node | None = node
        while cur is not None and cur is not self.root and cur.hashes is None:
            pending.append(cur)
            cur = cur.parent
        parent_hash = None if cur is None or cur is self.root else cur.hashes[-1]  # type: ignore[index]
        for n in reversed(pending):
            n.hashes = self._chain(parent_hash, n.key)
            parent_hash = n.hashes[-1]
        return node.hashes  # type: ignore[return-value]

    def _last_hash(self, node: Node) -> int | None:
        if node is self.root:
            return None
        return self._hashes(node)[-1]

    # ---------------------------------------------------------------- inspection
    def check_invariants(self) -> None:
        """Recount everything from the tree (tests call this; O(cache))."""
        ps = self.page_size
        tree = protected = nodes = 0
        stack: list[tuple[Node, Node | None]] = [(self.root, None)]
        while stack:
            node, parent = stack.pop()
            if node is not self.root:
                nodes += 1
                assert node.parent is parent, "broken parent link"
                assert node.key and len(node.key) % ps == 0, "edge not whole pages"
                tree += len(node.key)
                if node.lock_ref:
                    protected += len(node.key)
                child_locks = sum(c.lock_ref for c in node.children.values())
                assert node.lock_ref >= child_locks, "child locked without its parent"
                if node.hashes is not None:
                    assert len(node.hashes) == len(node.key) // ps
            for first, child in node.children.items():
                assert first == tuple(child.key[:ps]), "child indexed by the wrong page"
                stack.append((child, node))
        assert tree == self.tree_tokens, (tree, self.tree_tokens)
        assert protected == self.protected_tokens, (protected, self.protected_tokens)
        assert nodes == self.num_nodes, (nodes, self.num_nodes)
        assert 0 <= self.private_tokens
        assert self.used_tokens <= self.capacity, "capacity exceeded"
