"""A run-time-joined model's vocabulary as Python tables: the serving process builds no
native BPE model, nor tiktoken's table, for it.

Each of those is one native call that holds the GIL as long as the vocabulary is large
(the vocabulary-only ``models.BPE`` and tiktoken's ``CoreBPE`` about a tenth of a second
of CPU each at 150,000 entries, more than twice that at 400,000), so a worker that joins
with a large vocabulary would stall every request of the process while they are built.
Where the tokenizer helper process holds the whole tokenizer and encodes every text of
the model (``backend_parts.encode_elsewhere``), this process needs the vocabulary only to
decode and to look ids and tokens up. For a byte-level vocabulary (a ``ByteLevel``
decoder alone, a BPE model without byte fallback) a decode is the UTF-8 of the ids' bytes
(``token_bytes``), so two dicts are all it needs: made from the parts a child process cut
the file into (``backend_parts``), ``STEP`` entries at a time, each a short native call
that another thread may follow.

The tokenizer object itself (``table_backend``) is the file's shell (normalizer,
pre-tokenizer, post-processor, decoder) around a BPE model that knows the added tokens and
the single characters alone: the added tokens get their ids from it, and a one-character
probe (the BOS/EOS settings' check) encodes as with the whole vocabulary. It is registered
as a tokenizer whose merges are put off (``backend_parts.defer_model``), so the helper
process builds the whole one from the same parts, and this process only if the helper
cannot.

Other vocabularies (sentencepiece-style pieces with byte fallback, a ``Metaspace``
decoder: their decode follows the decoder chain's rules, which these tables do not
model) keep the vocabulary-only BPE model of ``backend_parts.merges_later``.
"""

from __future__ import annotations

import json
import weakref
from array import array
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from tokenizers import AddedToken, models
from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization.backend_parts import SEPARATOR, BackendParts, defer_model
from gateway.tokenization.token_bytes import TokenBytes

STEP = 8192
"""Vocabulary entries put into the tables per native call."""
_STEP_CHARS = 4 * STEP  # characters of the pieces' string split per step (about STEP pieces)


class VocabularyTable:
    """The model's vocabulary both ways, without the added tokens (the tokenizer's own
    look-ups check those first, as HF's do)."""

    __slots__ = ("_ids", "_pieces", "size", "unreached")

    def __init__(self, pieces: dict[int, str], ids: dict[str, int], size: int) -> None:
        self._pieces = pieces
        self._ids = ids
        self.size = size  # ids the tokenizer knows, added tokens included (``get_vocab_size(True)``)
        # The pieces the model does not encode to themselves (``unreached_pieces``, told by the
        # process that holds the whole model); None until told: then whether a text is one
        # token is asked of that process.
        self.unreached: AbstractSet[int] | None = None

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary piece of ``token_id`` (e.g. ``"Ġhello"``), or None."""
        return self._pieces.get(token_id)

    def token_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary piece, or None."""
        return self._ids.get(piece)


_TABLES: weakref.WeakKeyDictionary[BackendTokenizer, VocabularyTable] = weakref.WeakKeyDictionary()


def table_of(backend: BackendTokenizer) -> VocabularyTable | None:
    """The vocabulary tables of a tokenizer from ``table_backend``, else None."""
    return _TABLES.get(backend)


def unreached_pieces(backend: BackendTokenizer) -> bytes:
    """The ids (an ``array("I")``) of the vocabulary pieces that ``backend``'s model does not
    encode to themselves alone: what the process that holds the whole model tells this one,
    so that whether a text is one token is told from the tables (a text whose one pre-token is
    a piece the model reaches is that token). One batch encode of every piece."""
    model_only = BackendTokenizer(backend.model)
    vocab = backend.get_vocab(with_added_tokens=False)
    pieces = list(vocab)
    found = model_only.encode_batch_fast(pieces, add_special_tokens=False)
    return array("I", [vocab[p] for p, e in zip(pieces, found, strict=True) if e.ids != [vocab[p]]]).tobytes()


def decodes_from_bytes(parts: BackendParts) -> bool:
    """Whether a decode of this tokenizer is the UTF-8 of its ids' bytes: a ``ByteLevel``
    decoder alone, a BPE model without byte fallback."""
    decoder = json.loads(parts.shell).get("decoder")
    return isinstance(decoder, dict) and decoder.get("type") == "ByteLevel" and not parts.options.get("byte_fallback")


def table_backend(parts: BackendParts, after_step: Callable[[], None] | None = None) -> BackendTokenizer | None:
    """The tokenizer of ``parts`` without a model of its vocabulary, which lives in tables
    (``table_of``) built here in steps (``after_step`` is called after each); None when its
    decode is not the ids' bytes, or its added tokens do not decode as their content (the
    tables' decode would differ)."""
    if not decodes_from_bytes(parts):
        return None
    table, singles = _tables(parts, after_step)
    backend = BackendTokenizer.from_str(parts.shell)
    known = {**singles, **{content: token_id for token_id, content, _ in parts.added}}
    backend.model = models.BPE(known, [], **parts.options)
    backend.add_tokens([AddedToken(content, **flags) for _, content, flags in parts.added])
    for token_id, content, _ in parts.added:
        if backend.token_to_id(content) != token_id:
            return None
    for skip in (True, False):
        plain = TokenBytes(backend, skip, id_to_token=table.id_to_token)
        if any(plain.text([i]) != backend.decode([i], skip_special_tokens=skip) for i, _, _ in parts.added):
            return None
    _TABLES[backend] = table
    defer_model(backend, parts)
    return backend


def _tables(parts: BackendParts, after_step: Callable[[], None] | None) -> tuple[VocabularyTable, dict[str, int]]:
    """The tables of ``parts``' vocabulary, made in steps, and its one-character pieces."""
    ids = array("I")
    ids.frombytes(parts.ids)
    pieces: dict[int, str] = {}
    by_piece: dict[str, int] = {}
    singles: dict[str, int] = {}
    text, at, done = parts.pieces, 0, 0
    while text:
        end = text.find(SEPARATOR, at + _STEP_CHARS)
        chunk = (text[at:] if end < 0 else text[at:end]).split(SEPARATOR)
        chunk_ids = ids[done : done + len(chunk)]
        by_piece.update(zip(chunk, chunk_ids, strict=True))
        pieces.update(zip(chunk_ids, chunk, strict=True))
        singles.update((piece, token_id) for piece, token_id in zip(chunk, chunk_ids, strict=True) if len(piece) == 1)
        done += len(chunk)
        if after_step is not None:
            after_step()
        if end < 0:
            break
        at = end + 1
    if done != len(ids):
        raise ValueError(f"{done} vocabulary pieces for {len(ids)} ids")
    size = len(by_piece) + sum(1 for _, content, _ in parts.added if content not in by_piece)
    return VocabularyTable(pieces, by_piece, size), singles


__all__ = ["STEP", "VocabularyTable", "decodes_from_bytes", "table_backend", "table_of", "unreached_pieces"]
