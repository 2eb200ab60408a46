"""Turn one worker's KV-cache events into radix-tree insertions and removals.

A worker's KV events name pages by chained block hash: a *stored* event lists new
pages (hash and token ids) after a parent page's hash, a *removed* event lists only
hashes, a *cleared* event drops everything. The tree works on token prefixes, so
``WorkerBlocks`` keeps, per worker, ``hash -> (parent hash, page tokens, end depth)``
for the pages the worker reported holding, rebuilds a page's whole prefix by
following parents, and applies:

* stored: ``tree.insert(prefix + new pages, worker)``;
* removed: ``tree.remove_prefix(prefix up to the page's end, worker, keep=page start)``
  for the shallowest removed page of each chain (deeper pages, and anything the
  tree guessed beyond them, go with it);
* cleared, or events lost (a sequence gap, a restarted worker): ``reset`` forgets
  the worker's whole share of the tree, keeping its budget and page size;
* the pool's policy replaced (a flush through the gateway makes fresh ones): ``rebind``
  moves the pages to the new tree, where later events go.

Pages whose parent was never reported (the worker cached them before we subscribed)
cannot be placed and are counted as ``orphans``. The map holds at most
``max_blocks`` pages; beyond that removals must have been lost, and it resets.
Pure and synchronous: the routing layer owns the gRPC stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.policies.radix_tree import RadixTree

DEFAULT_MAX_BLOCKS = 1 << 20


@dataclass(slots=True)
class BlockStats:
    """What one worker's events did to the tree."""

    stored_blocks: int = 0
    removed_blocks: int = 0
    orphan_blocks: int = 0
    inserted_tokens: int = 0  # tokens newly attributed to the worker in the tree
    removed_tokens: int = 0  # tokens the worker lost in the tree
    clears: int = 0
    resets: int = 0


class WorkerBlocks:
    """One worker's reported KV pages, applied to the policy's radix tree."""

    def __init__(self, tree: RadixTree, worker: str, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.tree = tree
        self.worker = worker
        self.max_blocks = max(1, max_blocks)
        self.stats = BlockStats()
        # hash -> (parent hash or None, page tokens, token depth at the page's end)
        self._blocks: dict[int, tuple[int | None, tuple[int, ...], int]] = {}

    def pages(self) -> list[tuple[int | None, int, tuple[int, ...]]]:
        """(parent, hash, tokens) of every page held, parents before their children: the
        share as stored events would rebuild it."""
        held = sorted(self._blocks.items(), key=lambda item: item[1][2])
        return [(parent, h, page) for h, (parent, page, _) in held]

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def prefix(self, block_hash: int) -> list[int] | None:
        """All tokens up to the end of ``block_hash``'s page (None if its chain is broken)."""
        pages: list[tuple[int, ...]] = []
        h: int | None = block_hash
        while h is not None:
            entry = self._blocks.get(h)
            if entry is None:
                return None
            pages.append(entry[1])
            h = entry[0]
        out: list[int] = []
        for page in reversed(pages):
            out.extend(page)
        return out

    def stored(self, parent: int | None, blocks: Sequence[tuple[int, Sequence[int]]]) -> int:
        """Pages ``blocks`` (hash, tokens) now follow ``parent``; returns tokens newly in the tree."""
        if not blocks:
            return 0
        self.stats.stored_blocks += len(blocks)
        if parent is None:
            base: list[int] | None = []
            depth = 0
        else:
            base = self.prefix(parent)
            depth = self._blocks[parent][2] if base is not None else 0
        if base is None:
            self.stats.orphan_blocks += len(blocks)
            return 0
        prev = parent
        tokens = base
        for h, page in blocks:
            page_t = tuple(page)
            depth += len(page_t)
            self._blocks[h] = (prev, page_t, depth)
            tokens.extend(page_t)
            prev = h
        added = self.tree.insert(tokens, self.worker)
        self.stats.inserted_tokens += added
        if len(self._blocks) > self.max_blocks:
            self.reset()
        return added

    def removed(self, hashes: Iterable[int]) -> int:
        """The worker dropped these pages; returns tokens it lost in the tree."""
        gone = [h for h in hashes if h in self._blocks]
        self.stats.removed_blocks += len(gone)
        doomed = set(gone)
        lost = 0
        for h in gone:
            parent, page, depth = self._blocks[h]
            if parent in doomed:
                continue  # removed with its ancestor in this same event
            tokens = self.prefix(h)
            if tokens is not None:
                lost += self.tree.remove_prefix(tokens, self.worker, keep=depth - len(page))
        for h in gone:
            del self._blocks[h]
        self.stats.removed_tokens += lost
        return lost

    def rebind(self, tree: RadixTree) -> None:
        """Apply later events to ``tree``, the pool policy's new one (a flush through the
        gateway replaces its policies), and put the pages reported so far in it, so it holds
        what the worker last reported; the events still to come (the flush's own clear)
        bring it up to date."""
        if tree is self.tree:
            return
        self.tree = tree
        parents = {entry[0] for entry in self._blocks.values()}
        for h in self._blocks:
            if h not in parents:
                tokens = self.prefix(h)
                if tokens:
                    tree.insert(tokens, self.worker)

    def cleared(self) -> None:
        """The worker flushed its cache."""
        self.stats.clears += 1
        self._forget()

    def reset(self) -> None:
        """Events were lost: forget everything the tree attributes to the worker."""
        self.stats.resets += 1
        self._forget()

    def _forget(self) -> None:
        self._blocks.clear()
        tree, w = self.tree, self.worker
        if tree.has_worker(w):
            budget, page = tree.worker_budget(w), tree.page_size(w)
            self.stats.removed_tokens += tree.worker_tokens(w)
            tree.remove_worker(w)
            tree.set_worker(w, budget_tokens=budget, page_size=page)
