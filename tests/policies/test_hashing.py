"""Chained xxh3 block hashes: chaining, packing, depth capping, determinism."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from array import array

import pytest
import xxhash

from gateway.policies.hashing import (
    block_hashes,
    chained_hashes,
    pack_tokens,
    prefix_key,
    string_key,
)

from .helpers import tokens


def reference_chain(toks: list[int], b: int) -> list[int]:
    """An independent spelling of the scheme: struct '<I' packing, seed = previous hash."""
    out, h = [], 0
    for i in range(len(toks) // b):
        h = xxhash.xxh3_64_intdigest(struct.pack(f"<{b}I", *toks[i * b : (i + 1) * b]), seed=h)
        out.append(h)
    return out


def test_pack_is_little_endian_uint32() -> None:
    assert pack_tokens([1, 0x01020304]) == b"\x01\x00\x00\x00\x04\x03\x02\x01"
    assert pack_tokens(array("I", [7])) == pack_tokens([7]) == pack_tokens((7,))


def test_block_hashes_match_reference_and_ranges() -> None:
    toks = tokens(100, 1)
    got = block_hashes(toks, 16)
    assert [h.hash for h in got] == reference_chain(toks, 16)
    assert [(h.start, h.end) for h in got] == [(16 * i, 16 * (i + 1)) for i in range(6)]


def test_chained_hashes_are_the_block_hashes_alone() -> None:
    for n in (0, 15, 16, 33, 100):
        toks = tokens(n, 4)
        assert chained_hashes(toks, 16) == reference_chain(toks, 16) == [h.hash for h in block_hashes(toks, 16)]
    assert chained_hashes(array("I", tokens(40, 5)), 8) == reference_chain(tokens(40, 5), 8)
    for n in (0, 7, 8, 41):  # ids packed already, as a cache-aware policy packs a prompt
        assert chained_hashes(array("I", tokens(n, 6)).tobytes(), 8) == reference_chain(tokens(n, 6), 8)
    with pytest.raises(ValueError):
        chained_hashes([1, 2], 0)


def test_each_block_hash_covers_everything_before_it() -> None:
    a = tokens(64, 2)
    b = list(a)
    b[3] += 1  # differs in block 0 only
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert all(x.hash != y.hash for x, y in zip(ha, hb, strict=True))
    c = [*a[:48], a[48] + 1, *a[49:]]  # differs in block 3 only
    hc = block_hashes(c, 16)
    assert [h.hash for h in hc[:3]] == [h.hash for h in ha[:3]]
    assert hc[3].hash != ha[3].hash


def test_partial_block_is_skipped_and_bad_size_rejected() -> None:
    assert block_hashes(tokens(15, 3), 16) == []
    assert len(block_hashes(tokens(33, 3), 16)) == 2
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)


def test_prefix_key_depth_is_capped_and_rounded_to_blocks() -> None:
    toks = tokens(1000, 4)
    chain = reference_chain(toks, 16)
    assert prefix_key(toks, 16, 256) == chain[15]
    assert prefix_key(toks, 16, 260) == chain[15]  # rounded down to whole blocks
    assert prefix_key(toks[:40], 16, 256) == chain[1]  # capped by the prompt
    # the key ignores everything after the depth
    assert prefix_key(toks[:256] + tokens(50, 5), 16, 256) == prefix_key(toks, 16, 256)


def test_short_prompt_is_hashed_whole() -> None:
    short = [5, 6, 7]
    assert prefix_key(short, 16, 256) == xxhash.xxh3_64_intdigest(struct.pack("<3I", *short), seed=0)
    assert prefix_key([5, 6, 7], 16, 256) != prefix_key([5, 6, 8], 16, 256)
    assert prefix_key([], 16, 256) == xxhash.xxh3_64_intdigest(b"", seed=0)


def test_string_key_is_xxh3_of_utf8() -> None:
    assert string_key("user-é") == xxhash.xxh3_64_intdigest("user-é".encode(), seed=0)


def test_same_values_in_another_process() -> None:
    toks = tokens(300, 6)
    code = (
        "import json,sys; from gateway.policies.hashing import block_hashes, prefix_key;"
        "t=json.load(sys.stdin); print(json.dumps([[h.hash for h in block_hashes(t,16)],"
        " prefix_key(t,16,256)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(toks), capture_output=True, text=True,
        env=env, timeout=60, check=True,
    )
    other = json.loads(out.stdout)
    assert other == [[h.hash for h in block_hashes(toks, 16)], prefix_key(toks, 16, 256)]
