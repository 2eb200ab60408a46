"""Chained xxh3 block hashes over token ids.

A prompt is cut into blocks of ``block_size`` tokens. Block ``i`` is hashed with
``xxh3_64`` over its token ids packed as little-endian uint32, seeded with the hash
of block ``i - 1`` (block 0 uses seed 0), so each block's hash stands for every token
up to the end of that block: two prompts share block ``i``'s hash exactly when they
share all tokens before ``(i + 1) * block_size``. The packing and seeding are fixed so
that every process, replica and restart computes the same values (no Python ``hash``).

Shared by the ``prefix_hash`` policy (its ring key) and the ``inspect`` CLI.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import NamedTuple

import xxhash

_xxh3 = xxhash.xxh3_64_intdigest

if array("I").itemsize == 4:
    _UINT32 = "I"
elif array("L").itemsize == 4:  # pragma: no cover - platforms where int is not 32-bit
    _UINT32 = "L"
else:  # pragma: no cover
    raise ImportError("no 32-bit unsigned array type on this platform")
_BIG_ENDIAN = sys.byteorder == "big"


class BlockHash(NamedTuple):
    """The chained hash of one full block and the token range ``[start, end)`` it ends."""

    hash: int
    start: int
    end: int


def token_array(tokens: Sequence[int] | array) -> array:
    """Token ids as a native uint32 ``array`` (no copy when already one)."""
    if isinstance(tokens, array) and tokens.typecode == _UINT32:
        return tokens
    out = array(_UINT32)
    # fromlist is about twice as fast as array(typecode, iterable) on lists
    out.fromlist(tokens if isinstance(tokens, list) else list(tokens))
    return out


def pack_tokens(tokens: Sequence[int] | array) -> bytes:
    """Token ids as packed little-endian uint32 bytes (4 bytes per token)."""
    arr = token_array(tokens)
    if _BIG_ENDIAN:  # pragma: no cover - exercised only on big-endian hosts
        arr = array(_UINT32, arr)
        arr.byteswap()
    return arr.tobytes()


def block_hashes(tokens: Sequence[int] | array, block_size: int) -> list[BlockHash]:
    """Chained hashes of every full block of ``tokens`` (a trailing partial block is skipped)."""
    return [
        BlockHash(h, i * block_size, (i + 1) * block_size) for i, h in enumerate(chained_hashes(tokens, block_size))
    ]


def chained_hashes(tokens: Sequence[int] | array | bytes, block_size: int) -> list[int]:
    """The hashes of ``block_hashes`` alone, without a tuple per block (the request path's
    bookkeeping hashes every prompt). ``bytes`` are the ids packed already as native uint32
    (``token_array(ids).tobytes()``, as a cache-aware policy packs a prompt)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if isinstance(tokens, bytes):
        n_blocks = (len(tokens) >> 2) // block_size
        data = tokens if not _BIG_ENDIAN else pack_tokens(array(_UINT32, tokens))
    else:
        n_blocks = len(tokens) // block_size
        data = pack_tokens(tokens)  # the partial tail block too: cheaper than slicing it off first
    if n_blocks == 0:
        return []
    step = 4 * block_size
    out: list[int] = []
    h = 0
    for at in range(0, n_blocks * step, step):
        h = _xxh3(data[at : at + step], h)
        out.append(h)
    return out


def prefix_key(tokens: Sequence[int] | array, block_size: int, depth_tokens: int) -> int:
    """The chained hash at ``depth_tokens`` (capped by the prompt length).

    The depth is rounded down to whole blocks. A prompt (or depth) shorter than one
    block is hashed whole, seed 0, so short prompts still spread over the ring.
    Only the first ``depth_tokens`` tokens are read, whatever the prompt length.
    """
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    depth = min(depth_tokens, len(tokens))
    n_blocks = depth // block_size
    if n_blocks == 0:
        return _xxh3(pack_tokens(tokens[:depth]), 0)
    data = pack_tokens(tokens[: n_blocks * block_size])
    step = 4 * block_size
    h = 0
    for i in range(n_blocks):
        h = _xxh3(data[i * step : (i + 1) * step], h)
    return h


def string_key(text: str) -> int:
    """The ring key of a client routing key (UTF-8, xxh3 seed 0)."""
    return _xxh3(text.encode("utf-8"), 0)
