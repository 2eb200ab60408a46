r"""Multi-turn tokenization cache: re-encode only what a conversation added.

A chat client resends its whole history every turn, so turn T's prompt text starts
with (most of) turn T-1's. Tokenizing it from scratch each time costs O(history).

Why reuse is exact: the HF tokenizers pipeline first cuts the text at *added tokens*
(``<|im_start|>``, ``<|im_end|>``, ...) matched on the raw text, then normalizes,
pre-tokenizes and BPE-merges each piece between them on its own; no merge ever
crosses an added token. So if a text is cut right after an added token, the ids of
the whole are the ids of the left part followed by the ids of the right part
(``add_special_tokens=False``, so the post-processor adds nothing).

The cache cuts each text into *chunks* that end right after such a token and keeps
them in a trie (chunk text -> ids, children keyed by the next chunk). A new text walks
the trie as far as its chunks match, reuses those ids, and encodes only the rest (in
one parallel batch call). Cuts are only made where they are provably safe:

* only after added tokens matched on raw text (``normalized=False``) that do not
  swallow following whitespace (``rstrip=False``) and need no word context
  (``single_word=False``);
* the token scan reproduces the library's leftmost-longest matching over every raw
  added token, so a cut is never placed inside a token the library would pick;
* tokenizers whose pre-tokenizer treats the first piece specially (Metaspace
  ``prepend_scheme="first"``) or that have ``single_word`` added tokens get no cuts:
  the cache then only reuses exact repeats.

Plain text prompts (``/v1/completions``, ``/generate``) have no added tokens to cut at,
so ``encode_prompt`` cuts them between words instead: right before a space that sits
between two ASCII letters, once every ``min_text_chunk_chars``. That cut is exact for
byte-level BPE tokenizers whose pre-tokenizer regex attaches a leading space to the
next word (GPT-2's `` ?\p{L}+``, Llama-3/Qwen's ``[^\r\n\p{L}\p{N}]?\p{L}+``) and whose
normalizer is NFC or none: no pre-token ever spans "letter | space letter", and BPE
never merges across pre-tokens. Other tokenizers, and any that fail a self-check at
start, get no word cuts. A shared system prompt (the gsp workload: 2K tokens repeated
by every prompt of a group) is then tokenized once, not once per request.

Memory is bounded by ``max_entries`` chunks and ``max_tokens`` cached ids; the least
recently used chunks are evicted, always leaves first (a chunk's parent is touched
after it, so it is always more recent than its children).
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from gateway.tokenization.tokenizer import Tokenizer

_ROOT = 0
# Chunks this short are also kept by their text alone (their ids do not depend on what
# came before them: every cut is exact), so the ones every conversation ends or starts
# with (the generation prompt, ``\n<|im_start|>assistant\n``) are never re-encoded
# after a new message (a trie miss: the message is new).
SHORT_CHUNK_CHARS = 64
SHORT_CHUNKS = 4096  # at most; the table is emptied when full
_TEXT_ROOT = -1  # plain-text prompts (word cuts) live under their own root
# Once a tokenizer's fast encoder is built (``tokenization.fast_bpe``), a chat this short is
# encoded whole, faster than through the cache, whose saving (a repeated system prompt) is
# worth less than its cut, trie walk and insert at this size.
DIRECT_CHARS = 512
# A text with more characters than this many per token of the length it will be refused at
# (``encode``'s ``refused_at``) is taken as one that will be: encoded whole, past the cache.
# Only a guess (ids are the same either way): prose runs about 4 characters a token, code a
# few more; a text that fits after all only misses the cache this once.
REFUSED_CHARS_PER_TOKEN = 16
_WORD_CUT = re.compile(r"[A-Za-z](?= [A-Za-z])")  # a cut goes right after the match
# pre-tokenizer regexes whose words take their leading space (JSON-escaped, as in tokenizer.json)
_WORD_REGEXES = (r"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", r" ?\\p{L}+")
_SELF_CHECK = (
    "The quick brown fox jumps over the lazy dog while seven wizards quietly judge "
    "boxing matches; a large number of words follow here, and then some more words."
)


@dataclass(frozen=True)
class PrefixCacheStats:
    """Counters for metrics. A *hit* reused at least one cached chunk."""

    lookups: int
    hits: int
    misses: int
    reused_tokens: int
    encoded_tokens: int
    entries: int
    cached_tokens: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def reused_token_fraction(self) -> float:
        total = self.reused_tokens + self.encoded_tokens
        return self.reused_tokens / total if total else 0.0


class _Chunk:
    __slots__ = ("ids", "node_id")

    def __init__(self, node_id: int, ids: array[int]) -> None:
        self.node_id = node_id
        self.ids = ids


def _cut_pattern(tokenizer: Tokenizer) -> tuple[re.Pattern[str] | None, frozenset[str]]:
    """A regex over every raw-matched added token (longest first) and the subset after
    which a cut is safe; (None, {}) if this tokenizer must not be cut at all."""
    added = list(tokenizer.added_tokens.values())
    if any(tok.single_word for tok in added):
        return None, frozenset()
    pre = tokenizer.backend.pre_tokenizer
    state = pre.__getstate__().decode() if pre is not None else ""
    if '"prepend_scheme":"first"' in state.replace(" ", ""):
        return None, frozenset()
    raw = sorted(
        {tok.content for tok in added if not tok.normalized and tok.content}, key=len, reverse=True
    )
    safe = frozenset(
        tok.content for tok in added if not tok.normalized and not tok.rstrip and tok.content
    )
    if not safe:
        return None, frozenset()
    return re.compile("|".join(re.escape(c) for c in raw)), safe


def _word_cuts_exact(tokenizer: Tokenizer) -> bool:
    """Whether cutting between words (before " x" after a letter) keeps ids exact."""
    for tok in tokenizer.added_tokens.values():
        # a cut inside an added token, or next to one that swallows whitespace, would change it
        if any(c.isspace() for c in tok.content) or tok.lstrip or tok.rstrip or tok.single_word:
            return False
    backend = tokenizer.backend
    pre = backend.pre_tokenizer
    state = pre.__getstate__().decode() if pre is not None else ""
    if '"ByteLevel"' not in state or not any(r in state for r in _WORD_REGEXES):
        return False
    norm = backend.normalizer
    if norm is not None and norm.__getstate__().decode().replace(" ", "") != '{"type":"NFC"}':
        return False
    if backend.encode("", add_special_tokens=True).ids:
        return False  # a BOS/EOS template: whole-text encoding only
    whole = tokenizer.encode(_SELF_CHECK, add_special_tokens=False)
    cuts = [m.end() for m in _WORD_CUT.finditer(_SELF_CHECK)]
    pieces = [_SELF_CHECK[a:b] for a, b in zip([0, *cuts], [*cuts, len(_SELF_CHECK)], strict=True)]
    joined = [t for ids in tokenizer.encode_batch(pieces, add_special_tokens=False) for t in ids]
    return joined == whole


class PrefixTokenCache:
    """``encode(text)`` equal to ``tokenizer.encode(text, add_special_tokens=False)``,
    reusing the ids of previously seen prefixes. Thread-safe."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_entries: int = 65536,
        max_tokens: int = 8_000_000,
        min_chunk_chars: int = 32,
        min_text_chunk_chars: int = 1024,
    ) -> None:
        if max_entries < 1 or max_tokens < 1:
            raise ValueError("max_entries and max_tokens must be positive")
        self.tokenizer = tokenizer
        self.min_chunk_chars = min_chunk_chars
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._pattern, self._safe = _cut_pattern(tokenizer)
        self.min_text_chunk_chars = min_text_chunk_chars
        self.word_cuts = _word_cuts_exact(tokenizer)
        self._chunks: OrderedDict[tuple[int, str], _Chunk] = OrderedDict()
        self._short: dict[str, list[int]] = {}  # short chunk text -> its ids, wherever it sits
        self._lock = threading.Lock()
        self._next_id = _ROOT + 1
        self._cached_tokens = 0
        self._lookups = self._hits = self._reused = self._encoded = self._evictions = 0

    @property
    def splits_text(self) -> bool:
        """False when this tokenizer cannot be cut safely (only exact repeats are reused)."""
        return self._pattern is not None

    def split(self, text: str) -> list[str]:
        """The text cut right after safe added tokens (pieces join back to ``text``).

        A cut is skipped while the current chunk is shorter than ``min_chunk_chars``, so
        a chat splits about once per message rather than around every marker. The rule
        looks only at text left of the cut, so a prefix is cut the same way in every
        text that contains it.
        """
        if self._pattern is None:
            return [text] if text else []
        pieces: list[str] = []
        start = 0
        for match in self._pattern.finditer(text):
            if match.group() in self._safe and match.end() - start >= self.min_chunk_chars:
                pieces.append(text[start : match.end()])
                start = match.end()
        if start < len(text):
            pieces.append(text[start:])
        return pieces

    def split_words(self, text: str) -> list[str]:
        """A plain text cut between words, about every ``min_text_chunk_chars`` (cuts
        depend only on the text left of them, so a shared prefix is cut the same way)."""
        pieces: list[str] = []
        start = 0
        while True:
            match = _WORD_CUT.search(text, start + self.min_text_chunk_chars - 1)
            if match is None:
                break
            pieces.append(text[start : match.end()])
            start = match.end()
        if start < len(text):
            pieces.append(text[start:])
        return pieces

    def encode_prompt(self, text: str) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens=True)`` for a plain-text prompt,
        reusing the ids of previously seen prefixes when word cuts are exact."""
        if not self.word_cuts or len(text) < 2 * self.min_text_chunk_chars:
            return self.tokenizer.encode(text, add_special_tokens=True)
        return self._encode_chunks(self.split_words(text), _TEXT_ROOT)

    def encode(self, text: str, refused_at: int = 0) -> list[int]:
        """``refused_at`` (0: none): the id count at which the caller refuses the prompt. A
        prompt that long is not kept (it would evict what is worth keeping), and one far
        longer in characters (``REFUSED_CHARS_PER_TOKEN``) is encoded whole, without the
        cache's cut and walk: only its count is still needed."""
        tokenizer = self.tokenizer
        if len(text) <= DIRECT_CHARS and tokenizer.fast_bpe_ready and tokenizer.fast_bpe is not None:
            # A short text: the fast encoder takes it whole in less time than the cache's
            # cut, walk and insert (not counted as a lookup: the cache is not asked).
            return tokenizer.encode(text, add_special_tokens=False)
        if refused_at and len(text) > refused_at * REFUSED_CHARS_PER_TOKEN:
            return tokenizer.encode(text, add_special_tokens=False)
        return self._encode_chunks(self.split(text), _ROOT, refused_at)

    def new_chars(self, text: str, *, prompt: bool = False, refused_at: int = 0) -> int:
        """The characters of ``text`` that ``encode`` (``encode_prompt`` with ``prompt``)
        would hand the tokenizer: those past the cached chunks it starts with, or all of
        them where the cache would not be asked. Why: a caller that runs a long text's
        encode off the event loop decides by this part, not the whole length; a long prompt
        behind a cached shared prefix is a short encode, cheaper than the thread hop."""
        if prompt:
            if not self.word_cuts or len(text) < 2 * self.min_text_chunk_chars:
                return len(text)
            chunks, parent = self.split_words(text), _TEXT_ROOT
        else:
            if len(text) <= DIRECT_CHARS or (refused_at and len(text) > refused_at * REFUSED_CHARS_PER_TOKEN):
                return len(text)
            chunks, parent = self.split(text), _ROOT
        left = len(text)
        with self._lock:
            for chunk in chunks:
                found = self._chunks.get((parent, chunk))
                if found is None:
                    break
                left -= len(chunk)
                parent = found.node_id
        return left

    def _encode_chunks(self, chunks: list[str], root: int, refused_at: int = 0) -> list[int]:
        ids: list[int] = []
        path: list[tuple[int, str]] = []
        parent = root
        with self._lock:
            for chunk in chunks:
                found = self._chunks.get((parent, chunk))
                if found is None:
                    break
                ids.extend(found.ids)
                path.append((parent, chunk))
                parent = found.node_id
            self._touch(path)
        reused = len(ids)
        rest = chunks[len(path) :]
        encoded = self._encode_rest(rest) if rest else []
        for piece_ids in encoded:
            ids.extend(piece_ids)
        with self._lock:
            self._lookups += 1
            self._hits += 1 if path else 0
            self._reused += reused
            self._encoded += len(ids) - reused
            if rest and not (refused_at and len(ids) >= refused_at):
                self._insert(parent, path, rest, encoded)
        return ids

    def _encode_rest(self, rest: list[str]) -> list[list[int]]:
        """The ids of the chunks the trie did not have: short ones from their own table,
        the others (and new short ones) in one batch."""
        short = self._short
        found = [short.get(chunk) if len(chunk) <= SHORT_CHUNK_CHARS else None for chunk in rest]
        missing = [chunk for chunk, ids in zip(rest, found, strict=True) if ids is None]
        if not missing:
            return [list(ids) for ids in found if ids is not None]
        fresh = iter(self.tokenizer.encode_batch(missing, add_special_tokens=False))
        out: list[list[int]] = []
        for chunk, ids in zip(rest, found, strict=True):
            if ids is None:
                ids = next(fresh)
                if len(chunk) <= SHORT_CHUNK_CHARS:
                    if len(short) >= SHORT_CHUNKS:
                        short.clear()
                    short[chunk] = list(ids)
            else:
                ids = list(ids)
            out.append(ids)
        return out

    def _touch(self, path: list[tuple[int, str]]) -> None:
        # Leaf first, so that every parent ends up more recent than its children.
        for key in reversed(path):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    def _insert(
        self, parent: int, path: list[tuple[int, str]], chunks: list[str], encoded: list[list[int]]
    ) -> None:
        new_path = list(path)
        for chunk, chunk_ids in zip(chunks, encoded, strict=True):
            if len(chunk_ids) > self.max_tokens:
                break
            key = (parent, chunk)
            existing = self._chunks.get(key)
            if existing is None:  # another thread may have inserted it meanwhile
                existing = _Chunk(self._next_id, array("I", chunk_ids))
                self._next_id += 1
                self._chunks[key] = existing
                self._cached_tokens += len(chunk_ids)
            new_path.append(key)
            parent = existing.node_id
        self._touch(new_path)
        self._evict()

    def _evict(self) -> None:
        while self._chunks and (
            len(self._chunks) > self.max_entries or self._cached_tokens > self.max_tokens
        ):
            _, chunk = self._chunks.popitem(last=False)
            self._cached_tokens -= len(chunk.ids)
            self._evictions += 1

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            return PrefixCacheStats(
                lookups=self._lookups,
                hits=self._hits,
                misses=self._lookups - self._hits,
                reused_tokens=self._reused,
                encoded_tokens=self._encoded,
                entries=len(self._chunks),
                cached_tokens=self._cached_tokens,
                evictions=self._evictions,
            )

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._short.clear()
            self._cached_tokens = 0
