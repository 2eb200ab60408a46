"""tiktoken as the encoder of byte-level BPE vocabularies, only where its ids are exact.

HF ``tokenizers`` spends most of a long prompt's encode in its pre-tokenizer's
Oniguruma regex: ~3.7 ms of CPU for a 2,176-token prompt, about 2 µs per word, where
``tiktoken`` (the same split pattern through Rust's regex engine, then rank-ordered
BPE) takes 0.34 ms (docs/BENCHMARKS.md, issue 18 round 6). Qwen's and Llama-3's
vocabularies were born as tiktoken rank tables, so both encoders agree on them; this
module uses tiktoken only where that agreement is checked, and ``None`` sends the
caller back to the HF encoder:

* the HF pipeline must be the one tiktoken implements: an NFC normalizer or none, the
  pre-tokenizer ``Sequence[Split(regex, Isolated), ByteLevel(no prefix space, no
  regex)]``, a plain BPE model (no dropout, no subword prefix or suffix, no byte
  fallback), and added tokens that neither strip whitespace nor need word context;
* only texts of printable ASCII plus tab, newline and carriage return are encoded
  here: NFC is the identity on them, and both regex engines' ``\\p{L}``, ``\\p{N}`` and
  ``\\s`` agree on ASCII (Unicode tables of different versions could differ elsewhere);
* added tokens are cut out first as HF does for tokens without strip flags (those that
  skip normalization, then the normalized ones, each pass leftmost, longest first) and
  the pieces between them are encoded alone;
* a self-check at build time encodes every ASCII token of the vocabulary (each one as
  its own pre-token: the cases where rank-ordered and merge-ordered BPE could differ)
  and a prose sample with both encoders; any difference disables this encoder.

Building it walks the vocabulary and runs that check (~1.4 s of CPU, once per process
and tokenizer): do it off the event loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

_SAFE_BYTES = bytes([9, 10, 13, *range(0x20, 0x7F)])  # printable ASCII, tab, LF, CR
_SAMPLE = (
    "The quick brown fox jumps over the lazy dog; it's 12:45, isn't it? I'll say we'd "
    "they've    spaces\t\ttabs\n\nnew lines\r\n  trailing  \n"
    "def f(x):\n    return x**2 + 3.14159 # comment\n{\"json\": [1, 2, 3], 'k': null}\n"
    "URLs like https://example.com/a?b=c&d=e#f, e-mail a.b@c.org, C++ & C#, 1,000,000.\n"
    "ALL CAPS WORDS, MiXeD cAsE, snake_case_names, camelCaseNames, 0xDEADBEEF...!!!???"
)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character that stands for each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _split_pattern(pre: Mapping[str, Any] | None) -> str | None:
    """The Split regex when the pre-tokenizer is exactly what tiktoken does, else None."""
    if pre is None or pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, level = steps
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    pattern = (split.get("pattern") or {}).get("Regex")
    if not isinstance(pattern, str):
        return None
    if level.get("type") != "ByteLevel" or level.get("add_prefix_space") or level.get("use_regex"):
        return None
    return pattern


def _model_ok(model: Any) -> bool:
    return (
        type(model).__name__ == "BPE" and getattr(model, "dropout", 0) is None
        and not getattr(model, "byte_fallback", True) and not getattr(model, "continuing_subword_prefix", "x")
        and not getattr(model, "end_of_word_suffix", "x")
    )  # fmt: skip


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


class FastBpe:
    """``encode(text)``: the HF ids of ``text`` (``add_special_tokens=False``), or None
    when this text must go through the HF encoder."""

    def __init__(
        self, encoding: Any, added_ids: Mapping[str, int], *, plain_specials: bool, normalized: Collection[str] = ()
    ) -> None:
        self.plain_specials = plain_specials  # add_special_tokens=True adds nothing: the same ids serve both
        self._ordinary = encoding.encode_ordinary
        self._added_ids = dict(added_ids)
        # HF cuts the added tokens that skip normalization out of the raw text first, then
        # the normalized ones out of each piece left (NFC is the identity on the texts taken
        # here), each pass leftmost, longest first. One compiled alternation per pass, longest
        # first: at a position Python's ``re`` takes the first alternative that matches (so the
        # longest) and ``finditer`` scans leftmost first without overlaps (~1 µs for a short
        # chat render, where a loop over the tokens at every candidate position took ~6).
        raw = [t for t in self._added_ids if t not in normalized]
        self._cuts = tuple(c for c in (_alternation(raw), _alternation([t for t in self._added_ids if t in normalized])) if c)
        # The characters the tokens start with: a text holding none of them has no added
        # token, which ``in`` tells in a fraction of a microsecond where a regex scan of a
        # 2K-token prompt takes ~110 µs.
        self._starts = sorted({t[0] for t in self._added_ids})

    def encode(self, text: str) -> list[int] | None:
        if not text.isascii() or text.encode("ascii").translate(None, _SAFE_BYTES):
            return None  # a character outside printable ASCII, tab, LF and CR
        if not self._cuts or not any(c in text for c in self._starts):
            ids: list[int] = self._ordinary(text)
            return ids
        out: list[int] = []
        self._cut(text, self._cuts, out)
        return out

    def _cut(self, text: str, cuts: tuple[Callable[[str], Iterator[re.Match[str]]], ...], out: list[int]) -> None:
        """Append the ids of ``text``: the added tokens the first cut finds, the pieces
        between them through the next cuts, then the BPE."""
        if not cuts:
            out.extend(self._ordinary(text))
            return
        cut, rest = cuts[0], cuts[1:]
        added = self._added_ids
        start = 0  # the text not encoded yet starts here
        for found in cut(text):
            at = found.start()
            if at > start:
                self._cut(text[start:at], rest, out)
            out.append(added[found.group()])
            start = found.end()
        if start < len(text):
            self._cut(text[start:], rest, out)


def _alternation(tokens: Collection[str]) -> Callable[[str], Iterator[re.Match[str]]] | None:
    """``finditer`` of one regex matching any of ``tokens``, longest first; None for none."""
    if not tokens:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))).finditer


def _merges_in_rank_order(vocab: Mapping[str, int], merges: list[Any]) -> bool:
    """Whether merge i creates the token of rank i's order: each merge makes a token of a
    higher rank than every earlier merge's (so one merge per token) and than its parts.
    Then "lowest merge index first" (HF) is "lowest rank of the merged token first"
    (tiktoken) whenever the pair is HF's merge for that token; the self-check covers the rest."""
    previous = -1
    for merge in merges:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        rank = vocab.get(left + right)
        if rank is None or rank <= previous or vocab.get(left, rank) >= rank or vocab.get(right, rank) >= rank:
            return False
        previous = rank
    return True


def build_fast_bpe(backend: BackendTokenizer) -> FastBpe | None:
    """A checked tiktoken encoder for this HF tokenizer, or None (not installed, another
    pipeline, or the checks found a difference)."""
    try:
        import tiktoken
    except ImportError:
        return None
    normalizer = _state(backend.normalizer)
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    pattern = _split_pattern(_state(backend.pre_tokenizer))
    if pattern is None or not _model_ok(backend.model):
        return None
    added: dict[int, AddedToken] = dict(backend.get_added_tokens_decoder())
    if any(t.lstrip or t.rstrip or t.single_word for t in added.values()):
        return None
    model = json.loads(backend.model.__getstate__())
    vocab: dict[str, int] = model.get("vocab") or {}
    if not _merges_in_rank_order(vocab, model.get("merges") or []):
        return None
    decode = _byte_decoder()
    ranks: dict[bytes, int] = {}
    for piece, rank in vocab.items():
        if rank in added:
            continue
        try:
            ranks[bytes(decode[c] for c in piece)] = rank
        except KeyError:
            return None  # not a byte-level vocabulary
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    contents = {t.content: i for i, t in added.items() if t.content}
    normalized = {t.content for t in added.values() if t.content and t.normalized}
    try:
        encoding = tiktoken.Encoding("gateway", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    except Exception:  # a pattern tiktoken's regex engine does not take
        return None
    plain = all(
        backend.encode(t, add_special_tokens=True).ids == backend.encode(t, add_special_tokens=False).ids
        for t in ("", "a", _SAMPLE)
    )  # fmt: skip
    fast = FastBpe(encoding, contents, plain_specials=plain, normalized=normalized)
    # Every token this encoder may meet, each as a whole text (its own pre-token): where a
    # token's rank-order BPE would end on another pair than its HF merge, the two differ here.
    texts = [_SAMPLE]
    for raw in ranks:
        if raw.isascii():
            if not raw.translate(None, _SAFE_BYTES):
                texts.append(raw.decode("ascii"))
    theirs = backend.encode_batch_fast(texts, add_special_tokens=False)
    for token, hf in zip(texts, theirs, strict=True):
        if fast.encode(token) != hf.ids:
            return None
    return fast
