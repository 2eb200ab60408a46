"""Prefix references: send a shared prompt prefix over the bus once, then refer to it by hash.

With ``--sync-encoding blocks`` a decision carries the chained xxh3 hash of the
longest run of leading blocks (``block_tokens`` each) that is already on the bus, plus
the raw tokens after it. Every process keeps the same book: chain hash -> (parent
hash, the block's tokens), filled by what it published and what it heard, bounded
and least-recently-used first out. A receiver rebuilds the full prompt from the book,
so the tree gets exactly the tokens it would from ``--sync-encoding tokens``; a
reference it cannot resolve (it joined later than the block was sent, or evicted it)
is counted and skipped, and the kv events / later decisions correct the tree.

A block counts as "on the bus" only within the current epoch: the epoch moves when a
new peer appears or the connection comes back, so the next decisions send their
tokens again for whoever may have missed them.
"""

from __future__ import annotations

from collections import OrderedDict

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
DEFAULT_BLOCK_TOKENS = 64
DEFAULT_MAX_BLOCKS = 1 << 16  # 16 MiB of 64-token blocks


class PrefixBook:
    def __init__(self, block_tokens: int = DEFAULT_BLOCK_TOKENS, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, tuple[int, bytes, int]] = OrderedDict()  # hash -> (parent, tokens, epoch)
        self.epoch = 0
        self.unresolved = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def new_epoch(self) -> None:
        """Someone may have missed earlier blocks: send tokens again until re-announced."""
        self.epoch += 1

    def _chain(self, wire: bytes, block_tokens: int, h: int = 0) -> list[tuple[int, int, bytes]]:
        """(hash, parent hash, tokens) of each full block of ``wire``, chained from ``h``."""
        step = 4 * block_tokens
        out: list[tuple[int, int, bytes]] = []
        for i in range(len(wire) // step):
            chunk = wire[i * step : (i + 1) * step]
            parent, h = h, _xxh3(chunk, h)
            out.append((h, parent, chunk))
        return out

    def _learn(self, chain: list[tuple[int, int, bytes]]) -> None:
        blocks, epoch = self._blocks, self.epoch
        for h, parent, chunk in chain:
            blocks[h] = (parent, chunk, epoch)
            blocks.move_to_end(h)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def encode(self, wire: bytes) -> tuple[int, int, bytes]:
        """(reference hash, blocks it covers, tokens after them) for ``wire`` (little-endian
        uint32 token bytes); the whole prompt is learned as announced."""
        if len(wire) < 4 * self.block_tokens:
            return 0, 0, wire  # not one whole block: nothing to refer to or learn
        chain = self._chain(wire, self.block_tokens)
        blocks, epoch = self._blocks, self.epoch
        k = 0
        for h, _, _ in chain:
            entry = blocks.get(h)
            if entry is None or entry[2] != epoch:
                break
            k += 1
        self._learn(chain)
        if k == 0:
            return 0, 0, wire
        return chain[k - 1][0], k, wire[4 * self.block_tokens * k :]

    def learn(self, wire: bytes) -> None:
        """Mark every full block of ``wire`` as on the bus (it went out inside another
        message, e.g. a learned output appended to its decision)."""
        if len(wire) >= 4 * self.block_tokens:
            self._learn(self._chain(wire, self.block_tokens))

    def decode(self, ref: int, count: int, tail: bytes, block_tokens: int) -> bytes | None:
        """The full prompt, or None when the reference is not in the book."""
        out = self.decode_tip(ref, count, tail, block_tokens)
        return None if out is None else out[0]

    def decode_tip(self, ref: int, count: int, tail: bytes, block_tokens: int) -> tuple[bytes, int, int] | None:
        """(full prompt, hash of its last full block, blocks before it in the book's own
        block size), or None when the reference is not in the book. The tip is a compact
        handle: ``decode(tip_hash, tip_blocks, full[4 * blocks * block_tokens:] + more, ...)``
        rebuilds the prompt extended by ``more`` while its blocks stay in the book."""
        if count == 0:
            if len(tail) < 4 * block_tokens:
                return tail, 0, 0  # not one whole block: nothing to learn
            full = tail
            h = 0
        else:
            parts: list[bytes] = []
            h = ref
            blocks = self._blocks
            for _ in range(count):
                entry = blocks.get(h)
                if entry is None:
                    self.unresolved += 1
                    return None
                parts.append(entry[1])
                blocks.move_to_end(h)  # used: keep it as long as the sender may refer to it
                h = entry[0]
            parts.reverse()
            parts.append(tail)
            full = b"".join(parts)
            h = ref
        if block_tokens != self.block_tokens:
            return full, 0, 0  # a peer with another block size: nothing learned, no tip
        chain = self._chain(tail, block_tokens, h)
        self._learn(chain)  # the referenced blocks are known already
        if chain:
            return full, chain[-1][0], count + len(chain)
        return full, h, count
