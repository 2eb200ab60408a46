"""What a tokenizer helper process runs: whole tokenizers built from their parts, and encodes
with them.

A model that joins a serving process at run time gets a tokenizer without its BPE merges
(``backend_parts.merges_later``): tiktoken takes most texts, and the merges' native build
holds the GIL of the process that runs it for hundreds of milliseconds, a thread cannot
help. The texts tiktoken does not take are encoded by a helper process that builds the
whole tokenizer from the same parts (``hold``) and answers encodes (``encode_held``); the
serving process never builds it. These functions run in that process; they keep what they
built in this module's table, one entry a model.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization.backend_parts import BackendParts
from gateway.tokenization.special_text import sharing_model
from gateway.tokenization.vocabulary_table import unreached_pieces

PackedIds = tuple[bytes, bytes]
"""Ids of several texts: each text's count and all ids, as two ``array("I")``s (one copy
each to unpickle, where lists of a hundred thousand ints take a long native call)."""

_HELD: dict[str, list[BackendTokenizer | None]] = {}  # key -> [the whole tokenizer, its plain copy (made on demand)]


def hold(key: str, parts: BackendParts, post_processor: Any) -> int:
    """Build the whole tokenizer of ``parts`` with ``post_processor`` (the serving process's
    BOS/EOS settings) and keep it as ``key``; the helper's process id."""
    backend = parts.build()
    backend.post_processor = post_processor
    backend.no_truncation()
    backend.no_padding()
    _HELD[key] = [backend, None]
    return os.getpid()


def release(key: str) -> None:
    """Forget ``key``'s tokenizer (its model is gone)."""
    _HELD.pop(key, None)


def unreached(key: str) -> bytes:
    """``vocabulary_table.unreached_pieces`` of ``key``'s whole tokenizer. Raises KeyError when
    ``key`` is not held here."""
    backend = _HELD[key][0]
    assert backend is not None
    return unreached_pieces(backend)


def encode_held(key: str, texts: Sequence[str], add_special_tokens: bool, plain: bool) -> PackedIds:
    """The ids of ``texts`` from ``key``'s whole tokenizer (``plain``: special-token strings
    read as text). Raises KeyError when ``key`` is not held here."""
    held = _HELD[key]
    if plain and held[1] is None:
        held[1] = sharing_model(held[0])  # type: ignore[arg-type]
    backend = held[1] if plain else held[0]
    assert backend is not None
    encodings = backend.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
    counts, ids = array("I"), array("I")
    for encoding in encodings:
        counts.append(len(encoding.ids))
        ids.extend(encoding.ids)
    return counts.tobytes(), ids.tobytes()


def unpack(packed: PackedIds) -> list[list[int]]:
    """``encode_held``'s answer as one list of ids a text."""
    counts, ids = array("I"), array("I")
    counts.frombytes(packed[0])
    ids.frombytes(packed[1])
    out: list[list[int]] = []
    at = 0
    for count in counts:
        out.append(ids[at : at + count].tolist())
        at += count
    return out
