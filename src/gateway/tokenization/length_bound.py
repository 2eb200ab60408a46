"""A safe lower bound on a text's token count, from its length alone, before tokenizing.

Tokenizing a 10 MB prompt costs seconds of CPU and hundreds of MB; a prompt that can
never fit the model should be refused before that. The bound: every token covers at
most ``L`` characters of normalized text, where ``L`` is the longest token in the
vocabulary, counted in its own characters (byte-level BPE: one vocabulary character
per byte, and a character is at least one byte; added tokens: their content). NFC/NFKC
normalization can shrink text (a decomposed Hangul syllable, three jamo, becomes one
character; nothing composes more), so such tokenizers get a factor of 3 unless the
text is ASCII, which normalization leaves alone. Hence::

    tokens >= len(text) // (L * factor)

For Qwen3 (``L`` = 128, NFC) that is one token per 128 ASCII characters, or per 384
otherwise: it rejects only the hopeless, never a prompt that might fit. Tokenizers
whose normalizer or pre-tokenizer can drop characters (strip, replace, whitespace
splitting), or whose model can fuse unknown runs into one token (WordPiece, BPE or
Unigram with ``fuse_unk`` and no byte fallback), get no bound (``None``): their prompts
are simply tokenized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

COMPOSING = frozenset({"NFC", "NFKC"})
KEEPS_CHARS = frozenset({"NFD", "NFKD", "Lowercase", "Prepend"}) | COMPOSING
SAFE_PRE = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts"})


@dataclass(frozen=True, slots=True)
class LengthBound:
    chars_per_token: int
    compose_factor: int

    def min_tokens(self, text: str) -> int:
        factor = 1 if self.compose_factor == 1 or text.isascii() else self.compose_factor
        return len(text) // (self.chars_per_token * factor)


def _normalizer_factor(spec: dict[str, Any] | None) -> int | None:
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for part in spec.get("normalizers", []):
            f = _normalizer_factor(part)
            if f is None:
                return None
            factor *= f
        return factor
    if kind not in KEEPS_CHARS:
        return None
    return 3 if kind in COMPOSING else 1


def _pre_tokenizer_safe(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_pre_tokenizer_safe(p) for p in spec.get("pretokenizers", []))
    if kind == "Split":
        return spec.get("behavior") != "Removed"
    return kind in SAFE_PRE


def _model_safe(spec: dict[str, Any]) -> bool:
    kind = spec.get("type")
    if kind == "BPE":
        return bool(spec.get("byte_fallback")) or not spec.get("fuse_unk") or spec.get("unk_token") is None
    if kind == "Unigram":
        return bool(spec.get("byte_fallback"))
    return False


def length_bound(backend: Any) -> LengthBound | None:
    """The bound for one ``tokenizers.Tokenizer``, or None. Reads the components' own
    settings (cheap) and every token once (a few hundred ms for 150k tokens: callers run
    it off the event loop)."""
    def part(component: Any) -> dict[str, Any] | None:
        return json.loads(component.__getstate__()) if component is not None else None

    factor = _normalizer_factor(part(backend.normalizer))
    model = backend.model
    spec = {"type": type(model).__name__, "byte_fallback": getattr(model, "byte_fallback", False),
            "fuse_unk": getattr(model, "fuse_unk", False), "unk_token": getattr(model, "unk_token", None)}
    if factor is None or not _pre_tokenizer_safe(part(backend.pre_tokenizer)) or not _model_safe(spec):
        return None
    size = backend.get_vocab_size(with_added_tokens=True)
    longest = max((len(backend.id_to_token(i) or "") for i in range(size)), default=0)
    if longest <= 0:
        return None
    return LengthBound(longest, factor)
