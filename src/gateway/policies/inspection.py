"""What the routing policies see in one prompt: the pure half of ``inspect``.

Given token ids (and, optionally, their vocabulary pieces), a hash ring, a radix
tree and the pool's ``WorkerView`` snapshots, ``inspect_tokens`` lays out everything
a policy would compute for the prompt: the chained block hashes and the token
ranges they cover, the ``prefix_hash`` key with its ring position and owner, per
worker the tokens the ``cache_aware`` tree predicts are cached (in whole KV pages),
and the policy's own ``explain`` answer. Nothing here does I/O or changes the
tree or the ring, so the HTTP admin endpoint, the gRPC front door and the offline
CLI all share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.policies.base import Policy, RouteRequest, WorkerView
from gateway.policies.factory import explain
from gateway.policies.hashing import block_hashes, prefix_key
from gateway.policies.radix_tree import RadixTree, pack
from gateway.policies.ring import RING_SIZE, HashRing


@dataclass(frozen=True, slots=True)
class TokenRow:
    """One prompt token: its position, id and vocabulary piece (None if unknown)."""

    index: int
    id: int
    piece: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One full block: its chained xxh3 hash stands for all tokens in ``[0, end)``."""

    index: int
    hash: int
    start: int
    end: int

    @property
    def hex(self) -> str:
        return f"{self.hash:016x}"


@dataclass(frozen=True, slots=True)
class RingMapping:
    """Where the prompt's ``prefix_hash`` key lands on the consistent-hash ring."""

    key: int
    block_size: int
    depth_tokens: int  # tokens the key covers (whole blocks, capped by the prompt)
    virtual_nodes: int
    fraction: float  # key / 2**64: the position as a fraction of the ring
    vnode_index: int
    vnode_point: int
    owner: str  # the worker owning the key (before any load bound or availability skip)
    order: tuple[str, ...]  # workers clockwise from the key: who takes it if the owner cannot

    @property
    def key_hex(self) -> str:
        return f"{self.key:016x}"


@dataclass(frozen=True, slots=True)
class WorkerCache:
    """What the radix tree predicts one worker holds of the prompt."""

    worker_id: str
    url: str
    available: bool
    page_size: int
    raw_match_tokens: int  # prompt tokens on the worker's tree path
    predicted_cached_tokens: int  # rounded down to whole KV pages
    tree_tokens: int  # all tokens the tree attributes to the worker
    tree_budget: int  # the worker's tree budget in tokens


@dataclass(slots=True)
class Inspection:
    """Everything ``inspect`` reports for one prompt (``to_dict`` for JSON)."""

    model: str
    pool: str
    token_count: int
    block_size: int
    tokens: list[TokenRow]
    blocks: list[BlockRow]
    ring: RingMapping | None  # None when the pool has no worker
    tree: bool  # whether a cache_aware tree answered (False: no tree in this policy/mode)
    tree_match_tokens: int  # prompt tokens found in the tree at all
    workers: list[WorkerCache]
    policy: str | None
    decision: dict[str, Any] | None  # the policy's explain(): choice, reason, per-worker rows
    source: str = "offline"  # "offline" (a worker list given) or "gateway" (live state)
    text: str | None = None  # the rendered prompt, when it came from text or messages
    notes: list[str] = field(default_factory=list)
    quality: dict[str, Any] | None = None  # live routing quality of the pool (gateway only)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["blocks"] = [{**asdict(b), "hex": b.hex} for b in self.blocks]
        if self.ring is not None:
            out["ring"] = {**asdict(self.ring), "key_hex": self.ring.key_hex, "order": list(self.ring.order)}
        return out


def ring_mapping(ring: HashRing, token_ids: Sequence[int], block_size: int, depth_tokens: int) -> RingMapping | None:
    """The prompt's ``prefix_hash`` key and where it lands on ``ring`` (None on an empty ring)."""
    key = prefix_key(token_ids, block_size, depth_tokens)
    depth = min(depth_tokens, len(token_ids))
    covered = depth - depth % block_size if depth >= block_size else depth
    if not len(ring):
        return None
    pos = ring.position(key)
    return RingMapping(
        key=key,
        block_size=block_size,
        depth_tokens=covered,
        virtual_nodes=ring.virtual_nodes,
        fraction=pos.key / float(RING_SIZE),
        vnode_index=pos.vnode_index,
        vnode_point=pos.vnode_point,
        owner=pos.owner,
        order=tuple(ring.walk(key)),
    )


def tree_predictions(
    tree: RadixTree, token_ids: Sequence[int], workers: Sequence[WorkerView]
) -> tuple[int, list[WorkerCache]]:
    """(tokens found in the tree, per worker what it is predicted to hold), read-only."""
    found, raw = tree.match_packed(pack(token_ids))
    rows = []
    for w in workers:
        r = raw.get(w.worker_id, 0)
        ps = max(1, w.page_size)
        rows.append(
            WorkerCache(
                worker_id=w.worker_id,
                url=w.url,
                available=w.available,
                page_size=ps,
                raw_match_tokens=r,
                predicted_cached_tokens=r - r % ps,
                tree_tokens=tree.worker_tokens(w.worker_id),
                tree_budget=tree.worker_budget(w.worker_id),
            )
        )
    return found, rows


def inspect_tokens(
    token_ids: Sequence[int],
    *,
    workers: Sequence[WorkerView],
    block_size: int,
    depth_tokens: int,
    ring: HashRing | None = None,
    virtual_nodes: int | None = None,
    tree: RadixTree | None = None,
    policy: Policy | None = None,
    request: RouteRequest | None = None,
    pieces: Sequence[str | None] | None = None,
    model: str = "",
    pool: str = "regular",
    source: str = "offline",
    text: str | None = None,
) -> Inspection:
    """Lay out what the policies compute for ``token_ids`` over ``workers``.

    ``ring`` defaults to a fresh ring of the workers' ids with ``virtual_nodes``
    (rings are deterministic, so it equals any live ring of the same members).
    ``tree`` adds per-worker predictions; ``policy`` adds its ``explain`` answer for
    ``request`` (default: a plain request for these tokens in ``pool``).
    """
    if block_size < 1 or depth_tokens < 1:
        raise ValueError("block_size and depth_tokens must be >= 1")
    ids = list(token_ids)
    if ring is None:
        from gateway.policies.ring import DEFAULT_VIRTUAL_NODES

        ring = HashRing(virtual_nodes or DEFAULT_VIRTUAL_NODES, (w.worker_id for w in workers))
    names = list(pieces) if pieces is not None else [None] * len(ids)
    if len(names) != len(ids):
        raise ValueError("pieces must have one entry per token")
    found, cache_rows = tree_predictions(tree, ids, workers) if tree is not None else (0, [])
    decision = None
    if policy is not None:
        req = request or RouteRequest(token_ids=ids, model=model, pool=pool)
        decision = explain(policy, req, workers)
    return Inspection(
        model=model,
        pool=pool,
        token_count=len(ids),
        block_size=block_size,
        tokens=[TokenRow(i, t, p) for i, (t, p) in enumerate(zip(ids, names, strict=True))],
        blocks=[BlockRow(i, b.hash, b.start, b.end) for i, b in enumerate(block_hashes(ids, block_size))],
        ring=ring_mapping(ring, ids, block_size, depth_tokens),
        tree=tree is not None,
        tree_match_tokens=found,
        workers=cache_rows,
        policy=policy.name if policy is not None else None,
        decision=decision,
        source=source,
        text=text,
    )
