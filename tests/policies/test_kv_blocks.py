"""KV events -> radix tree: stored pages are learned, removed pages and flushes forgotten."""

from __future__ import annotations

from gateway.policies.kv_blocks import WorkerBlocks
from gateway.policies.radix_tree import RadixTree
from gateway_lab.sim.radix_cache import block_hash

PS = 4


def pages(tokens: list[int], parent: int | None = None) -> list[tuple[int, list[int]]]:
    out = []
    for i in range(0, len(tokens) - len(tokens) % PS, PS):
        parent = block_hash(parent, tokens[i : i + PS])
        out.append((parent, tokens[i : i + PS]))
    return out


def held(tree: RadixTree, tokens: list[int], worker: str = "w") -> int:
    return tree.match(tokens).per_worker.get(worker, 0)


def make() -> tuple[RadixTree, WorkerBlocks]:
    tree = RadixTree()
    tree.set_worker("w", budget_tokens=1000, page_size=PS)
    return tree, WorkerBlocks(tree, "w")


def test_stored_chain_and_extension_are_learned() -> None:
    tree, wb = make()
    a = list(range(100, 116))  # 4 pages
    blocks = pages(a)
    assert wb.stored(None, blocks[:2]) == 8 and held(tree, a) == 8
    assert wb.prefix(blocks[1][0]) == a[:8]
    # the next event continues after page 1: the tree gets the whole prefix
    assert wb.stored(blocks[1][0], blocks[2:]) == 8 and held(tree, a) == 16
    # a branch sharing the first page
    b = [*a[:4], 7, 7, 7, 7]
    assert wb.stored(blocks[0][0], pages(b)[1:]) == 4
    assert held(tree, b) == 8 and held(tree, a) == 16
    assert wb.stats.stored_blocks == 5 and len(wb) == 5
    tree.validate()


def test_removed_leaf_pages_are_forgotten_and_the_prefix_kept() -> None:
    tree, wb = make()
    a = list(range(200, 224))  # 6 pages
    blocks = pages(a)
    wb.stored(None, blocks)
    tree.insert([*a, 1, 2], "w")  # the router's own guess went two tokens further
    # the worker evicts the last three pages (one leaf, hashes shallow to deep)
    lost = wb.removed([h for h, _ in blocks[3:]])
    assert lost == 14  # 12 page tokens + the router's 2-token tail
    assert held(tree, a) == 12 and len(wb) == 3
    assert wb.removed([12345]) == 0  # unknown hashes are ignored
    assert wb.stats.removed_blocks == 3
    tree.validate()


def test_orphans_clear_and_reset() -> None:
    tree, wb = make()
    a = list(range(300, 316))
    blocks = pages(a)
    # pages whose parent was never reported cannot be placed
    assert wb.stored(blocks[1][0], blocks[2:]) == 0 and wb.stats.orphan_blocks == 2 and held(tree, a) == 0
    wb.stored(None, blocks)
    tree.insert(list(range(900, 920)), "w")
    assert held(tree, a) == 16
    wb.cleared()
    assert len(wb) == 0 and held(tree, a) == 0 and held(tree, list(range(900, 920))) == 0
    assert tree.worker_budget("w") == 1000 and tree.page_size("w") == PS  # registration kept
    wb.stored(None, blocks)
    wb.reset()
    assert wb.stats.resets == 1 and wb.stats.clears == 1 and held(tree, a) == 0
    tree.validate()


def test_map_is_bounded() -> None:
    tree = RadixTree()
    wb = WorkerBlocks(tree, "w", max_blocks=5)
    wb.stored(None, pages(list(range(400, 416))))  # 4 pages: fine
    assert len(wb) == 4
    wb.stored(None, pages(list(range(500, 508))))  # 6 > 5: removals were lost, start over
    assert len(wb) == 0 and wb.stats.resets == 1 and tree.worker_tokens("w") == 0


def test_rebind_moves_the_reported_pages_to_a_new_tree() -> None:
    """A flush through the gateway replaces the policy: its new tree gets every chain the
    worker reported, and later events go there, not to the old one."""
    old, wb = make()
    a, b = list(range(100, 112)), [100, 101, 102, 103, 9, 9, 9, 9]
    wb.stored(None, pages(a))
    wb.stored(pages(a)[0][0], pages(b)[1:])
    new = RadixTree()
    new.set_worker("w", budget_tokens=1000, page_size=PS)
    wb.rebind(new)
    assert wb.tree is new and held(new, a) == 12 and held(new, b) == 8
    wb.rebind(new)  # the same tree again: nothing re-inserted
    c = list(range(500, 508))
    wb.stored(None, pages(c))
    assert held(new, c) == 8 and held(old, c) == 0
    wb.cleared()
    assert held(new, a) == 0 and held(new, c) == 0 and len(wb) == 0


def test_pages_rebuild_the_share_parents_first() -> None:
    _, wb = make()
    a = list(range(100, 116))
    blocks = pages(a)
    wb.stored(None, blocks[:2])
    wb.stored(blocks[1][0], blocks[2:])
    b = [*a[:4], 7, 7, 7, 7]
    wb.stored(blocks[0][0], pages(b)[1:])
    held_pages = wb.pages()
    assert len(held_pages) == 5 and held_pages[0] == (None, blocks[0][0], tuple(a[:4]))
    seen: set[int] = set()
    for parent, h, _ in held_pages:  # each page's parent comes before it
        assert parent is None or parent in seen
        seen.add(h)
    other, copy = make()
    for parent, h, page in held_pages:
        copy.stored(parent, [(h, list(page))])
    assert held(other, a) == 16 and held(other, b) == 8 and copy.pages() == held_pages
