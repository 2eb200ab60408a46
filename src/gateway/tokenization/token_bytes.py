"""The bytes each token of a byte-level BPE vocabulary stands for, for the streamed relay.

``tokenizers.decoders.DecodeStream`` decodes its window of ids twice per emitted token
(the window, then the new prefix), each a walk through the decoder chain with a string
per token: the largest native cost of a relayed token. For a tokenizer whose decoder is
``ByteLevel`` alone (Qwen, Llama 3) the text of a run of ids is the UTF-8 of their
bytes joined, with invalid sequences replaced (``from_utf8_lossy``), so an incremental
detokenizer can keep the bytes not yet shown and decode only those
(``IncrementalDetokenizer``). This module answers which bytes an id stands for:

* a vocabulary token: its characters through GPT-2's byte alphabet reversed; a token
  with a character outside that alphabet is its own UTF-8, as the decoder does;
* an added token: its content (nothing for a special one when special tokens are
  skipped); an id the tokenizer does not know: nothing (``decode`` skips it).

An id's bytes are looked up the first time it is met and kept (at most the vocabulary):
a lookup costs about what one ``DecodeStream`` step does. ``for_backend`` checks that the
decoder is ``ByteLevel`` alone and that these bytes give ``decode``'s text on every added
token and a sample of the vocabulary; anything else keeps ``DecodeStream``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization.fast_bpe import byte_decoder

_SAMPLE_STRIDE = 997  # every this many ids of the vocabulary are checked against ``decode``


class TokenBytes:
    """Per tokenizer and ``skip_special_tokens``: ``table.get(id)`` is the id's bytes once
    met; ``fill(id)`` looks up one not met yet."""

    __slots__ = ("_added", "_alphabet", "_id_to_token", "_skip", "_special", "table")

    def __init__(
        self, backend: BackendTokenizer, skip_special_tokens: bool, id_to_token: Callable[[int], str | None] | None = None
    ) -> None:
        # The vocabulary's pieces: the backend's model, or tables kept beside a backend that
        # has no model of its vocabulary (``vocabulary_table``); added tokens from the backend.
        self._id_to_token = id_to_token or backend.id_to_token
        self._skip = skip_special_tokens
        added = backend.get_added_tokens_decoder()
        self._added = {i: t.content.encode() for i, t in added.items()}
        self._special = frozenset(i for i, t in added.items() if t.special)
        self._alphabet = byte_decoder()
        self.table: dict[int, bytes] = {}

    def fill(self, token_id: int) -> bytes:
        """The bytes of ``token_id``, looked up and kept."""
        raw = self._lookup(token_id)
        self.table[token_id] = raw
        return raw

    def _lookup(self, token_id: int) -> bytes:
        content = self._added.get(token_id)
        if content is not None:
            return b"" if self._skip and token_id in self._special else content
        piece = self._id_to_token(token_id) if token_id >= 0 else None
        if piece is None:
            return b""
        alphabet = self._alphabet
        if all(c in alphabet for c in piece):
            return bytes([alphabet[c] for c in piece])
        return piece.encode()

    def text(self, ids: Sequence[int]) -> str:
        """What ``decode(ids)`` gives, from these bytes (the build's check)."""
        table = self.table
        return b"".join([table.get(i) or self.fill(i) for i in ids]).decode("utf-8", "replace")


def for_backend(backend: BackendTokenizer, skip_special_tokens: bool) -> TokenBytes | None:
    """The bytes of ``backend``'s ids when its decoder is ``ByteLevel`` alone and they
    give ``decode``'s text on its added tokens and a sample of its vocabulary; else None."""
    decoder = backend.decoder
    if decoder is None or json.loads(decoder.__getstate__()).get("type") != "ByteLevel":
        return None
    if type(backend.model).__name__ != "BPE" or getattr(backend.model, "byte_fallback", False):
        return None
    out = TokenBytes(backend, skip_special_tokens)
    size = backend.get_vocab_size(with_added_tokens=True)
    ids = sorted({*backend.get_added_tokens_decoder(), *range(0, size, _SAMPLE_STRIDE), size - 1})
    for token_id in ids:
        if out.text([token_id]) != backend.decode([token_id], skip_special_tokens=skip_special_tokens):
            return None
    if out.text(ids) != backend.decode(ids, skip_special_tokens=skip_special_tokens):
        return None

    return out


__all__ = ["TokenBytes", "for_backend"]
