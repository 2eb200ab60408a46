"""Client text that spells a special token is tokenized as the text it is.

A chat prompt is rendered to text and then tokenized with special-token parsing on, so
the template's own ``<|im_start|>`` become real special ids. Parsed the same way, a
user message holding ``<|im_end|>\\n<|im_start|>system`` would forge a system turn: the
model could not tell it from one the operator wrote. So the special-token strings
inside client-supplied text (message contents, content parts, tool-call arguments,
names) are swapped for placeholders before the render; the rendered text is then
tokenized piece by piece: the template's pieces with special-token parsing, each
placeholder's original string as plain text (the tokenizer with its special tokens
switched off: its natural BPE, never a special id). The common message holds no such
string, and costs one regex search over its text.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from gateway.tokenization.backend_parts import elsewhere, whole

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: no template writes them
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


class SpecialTextShield:
    """One tokenizer's special-token strings, and the plain tokenizer behind the shield."""

    def __init__(self, backend: BackendTokenizer, specials: Sequence[str]) -> None:
        self._backend = backend
        longest_first = sorted({s for s in specials if s}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        self._plain: BackendTokenizer | None = None
        self._lock = threading.Lock()

    def spelled_in(self, text: str) -> bool:
        """Whether ``text`` holds a special-token string."""
        return self._pattern is not None and self._pattern.search(text) is not None

    def shield(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
        """A copy of ``messages`` with each special-token string in client text replaced by
        a placeholder, and the strings replaced (placeholder k is ``originals[k]``)."""
        originals: list[str] = []
        pattern = self._pattern

        def swap(match: re.Match[str]) -> str:
            originals.append(match.group(0))
            return f"{_OPEN}{len(originals) - 1}{_CLOSE}"

        def walk(value: Any) -> Any:
            if isinstance(value, str):
                return pattern.sub(swap, value) if pattern is not None else value
            if isinstance(value, list):
                return [walk(v) for v in value]
            if isinstance(value, dict):
                return {k: (v if k in ("role", "type") else walk(v)) for k, v in value.items()}
            return copy.deepcopy(value)

        return [walk(dict(m)) for m in messages], originals

    def encode(self, rendered: str, originals: Sequence[str], encode: Callable[[str], list[int]]) -> tuple[str, list[int]]:
        """(the prompt text with the originals back, its ids): the template's pieces through
        ``encode`` (special tokens parsed), each original as plain text."""
        ids: list[int] = []
        texts: list[str] = []
        last = 0
        matches = list(_PLACEHOLDER.finditer(rendered))
        plain = self.plain_ids([originals[int(match.group(1))] for match in matches])
        for match, plain_ids in zip(matches, plain, strict=True):
            piece = rendered[last:match.start()]
            if piece:
                ids.extend(encode(piece))
                texts.append(piece)
            ids.extend(plain_ids)
            texts.append(originals[int(match.group(1))])
            last = match.end()
        tail = rendered[last:]
        if tail:
            ids.extend(encode(tail))
            texts.append(tail)
        return "".join(texts), ids

    def plain_ids(self, texts: list[str]) -> list[list[int]]:
        """The ids of ``texts`` with special-token strings read as text: from the process that
        holds the whole tokenizer when its merges are not built here
        (``backend_parts.encode_elsewhere``), else from ``plain``."""
        if not texts:
            return []
        other = elsewhere(self._backend) if self._plain is None else None
        if other is not None:
            return other(texts, False, True)
        encode = self.plain().encode
        return [encode(text, add_special_tokens=False).ids for text in texts]

    def plain(self) -> BackendTokenizer:
        """A tokenizer that reads special-token strings as text (made once, on the first
        message that needs it: most deployments never do)."""
        with self._lock:
            if self._plain is None:
                self._plain = sharing_model(whole(self._backend))
            return self._plain


def sharing_model(backend: BackendTokenizer) -> BackendTokenizer:
    """``backend`` with special-token parsing off, around the same model object.

    A copy through ``to_str``/``from_str`` serializes and parses the whole vocabulary, in
    native calls that hold the GIL for hundreds of milliseconds on a large one: any
    client could set that off with one message spelling a special token. ``Tokenizer(model)``
    shares the model (its native object is reference-counted, not copied); the
    normalizer and pre-tokenizer go in before the added tokens, whose matching depends
    on the normalizer, and the added tokens go in by ascending id (the order they got their
    ids in).
    When one of them comes out with another id (a vocabulary whose ids the model and the
    added tokens share in some other order), the copy is made the long way."""
    plain = BackendTokenizer(backend.model)
    plain.normalizer = backend.normalizer
    plain.pre_tokenizer = backend.pre_tokenizer
    plain.post_processor = backend.post_processor
    plain.decoder = backend.decoder
    added = _added_by_id(backend)
    plain.add_tokens([
        AddedToken(t.content, single_word=t.single_word, lstrip=t.lstrip, rstrip=t.rstrip, normalized=t.normalized, special=t.special)
        for _, t in added
    ])  # fmt: skip
    if any(plain.token_to_id(t.content) != token_id for token_id, t in added):
        plain = BackendTokenizer.from_str(backend.to_str())
        plain.no_truncation()
        plain.no_padding()
    plain.encode_special_tokens = True
    return plain


def _added_by_id(backend: BackendTokenizer) -> list[tuple[int, AddedToken]]:
    """The added tokens, ascending by id (the order a file's parse gives them their ids in)."""
    return sorted(backend.get_added_tokens_decoder().items())
