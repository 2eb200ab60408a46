"""tiktoken as the encoder of byte-level BPE vocabularies, only where its ids are exact.

HF ``tokenizers`` spends most of a long prompt's encode in its pre-tokenizer's
Oniguruma regex, where ``tiktoken`` (the same split pattern through Rust's regex
engine, then rank-ordered BPE) is about ten times faster on a long prompt
(``token-gateway bench tokenize``). Qwen's and Llama-3's
vocabularies were born as tiktoken rank tables, so both encoders agree on them; this
module uses tiktoken only where that agreement is checked, and ``None`` sends the
caller back to the HF encoder:

* the HF pipeline must be the one tiktoken implements: an NFC normalizer or none, the
  pre-tokenizer ``Sequence[Split(regex, Isolated), ByteLevel(no prefix space, no
  regex)]``, a plain BPE model (no dropout, no subword prefix or suffix, no byte
  fallback), and added tokens that neither strip whitespace nor need word context;
* only printable ASCII plus tab, newline and carriage return, and the letters of
  Latin-1 and Latin Extended-A (``_LATIN``), go through tiktoken: NFC is the identity on
  them, and both regex engines' ``\\p{L}``, ``\\p{N}`` and ``\\s`` agree on them (Unicode
  tables of different versions could differ elsewhere). In a
  text with other characters, each run of them, widened to the word cuts around it
  (the prefix cache's exact cut between an ASCII letter and " x"), goes through the HF
  encoder and the ASCII between those spans through tiktoken (for the pre-tokenizers
  whose words take their leading space, when no added token is normalized, and after
  a self-check on a mixed sample); otherwise such texts go back to the caller;
* added tokens are cut out first as HF does for tokens without strip flags (those that
  skip normalization, then the normalized ones, each pass leftmost, longest first) and
  the pieces between them are encoded alone;
* a self-check at build time encodes every ASCII and Latin token of the vocabulary (each
  one as its own pre-token: the cases where rank-ordered and merge-ordered BPE could
  differ) and prose samples with both encoders; a difference on ASCII disables this
  encoder, one on Latin letters leaves them to the HF encoder.

Building it walks the vocabulary and runs that check (seconds of CPU, once per process
and tokenizer): do it off the event loop.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

_SAFE_BYTES = bytes([9, 10, 13, *range(0x20, 0x7F)])  # printable ASCII, tab, LF, CR
# Every byte of the texts tiktoken is given: _SAFE_BYTES and the UTF-8 of _LATIN's letters
# (U+00C0..U+017E: a lead byte C3, C4 or C5, then a continuation byte).
_TAKEN_BYTES = _SAFE_BYTES + bytes([0xC3, 0xC4, 0xC5, *range(0x80, 0xC0)])
_SAMPLE = (
    "The quick brown fox jumps over the lazy dog; it's 12:45, isn't it? I'll say we'd "
    "they've    spaces\t\ttabs\n\nnew lines\r\n  trailing  \n"
    "def f(x):\n    return x**2 + 3.14159 # comment\n{\"json\": [1, 2, 3], 'k': null}\n"
    "URLs like https://example.com/a?b=c&d=e#f, e-mail a.b@c.org, C++ & C#, 1,000,000.\n"
    "ALL CAPS WORDS, MiXeD cAsE, snake_case_names, camelCaseNames, 0xDEADBEEF...!!!???"
)


# A chat template writes the same short pieces between its added tokens on every request
# ("\n", "assistant\n", a role and a fixed system prompt): their ids are kept, up to this
# many pieces of at most this many characters; a full table is emptied and fills again
# with what still repeats.
PIECE_MEMO_CHARS = 256
PIECE_MEMO_ENTRIES = 4096


def byte_decoder() -> dict[str, int]:
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
    when this text must go through the HF encoder whole."""

    def __init__(
        self,
        encoding: Any,
        added_ids: Mapping[str, int],
        *,
        plain_specials: bool,
        normalized: Collection[str] = (),
        other: Callable[[str], list[int]] | None = None,
        latin: bool = False,
    ) -> None:
        self.plain_specials = plain_specials  # add_special_tokens=True adds nothing: the same ids serve both
        self._ordinary = encoding.encode_ordinary
        self._pieces: dict[str, tuple[int, ...]] = {}  # see PIECE_MEMO_CHARS
        self._added_ids = dict(added_ids)
        # HF cuts the added tokens that skip normalization out of the raw text first, then
        # the normalized ones out of each piece left (NFC is the identity on the texts taken
        # here), each pass leftmost, longest first. One compiled alternation per pass, longest
        # first: at a position Python's ``re`` takes the first alternative that matches (so the
        # longest) and ``finditer`` scans leftmost first without overlaps (one scan, where a loop
        # over the tokens at every candidate position costs several times more).
        raw = [t for t in self._added_ids if t not in normalized]
        self._cuts = tuple(c for c in (_alternation(raw), _alternation([t for t in self._added_ids if t in normalized])) if c)
        # The characters the tokens start with: a text holding none of them has no added
        # token, which ``in`` tells far sooner than a regex scan of a long prompt.
        self._starts = sorted({t[0] for t in self._added_ids})
        # Texts with other characters: cut between words, the words this encoder takes here,
        # the others through ``other`` (the HF encoder), when word cuts are exact (see
        # ``_mixed``); None: such texts go back to the caller whole.
        self._other = other if not normalized else None
        # With ``latin``, the letters of Latin-1 and Latin Extended-A go through tiktoken
        # too (see ``_LATIN``).
        self.latin = latin
        self._unsafe = (_UNSAFE_LATIN if latin else _UNSAFE_ASCII).search
        self._other_runs = (_OTHER_RUN_LATIN if latin else _OTHER_RUN_ASCII).finditer

    def takes(self, text: str) -> bool:
        """Whether tiktoken takes ``text`` whole (no span of it goes to ``other``)."""
        if text.isascii():
            return not text.encode("ascii").translate(None, _SAFE_BYTES)
        return self.latin and self._unsafe(text) is None

    def encode(self, text: str) -> list[int] | None:
        if not self.takes(text):
            if self._other is None:
                return None  # a character tiktoken does not take here
            out: list[int] = []
            if self._cuts and any(c in text for c in self._starts):
                self._cut(text, self._cuts, out, self._mixed)
            else:
                self._mixed(text, out)
            return out
        if not self._cuts or not any(c in text for c in self._starts):
            ids: list[int] = self._ordinary(text)
            return ids
        out = []
        self._cut(text, self._cuts, out, self._plain)
        return out

    def _plain(self, text: str, out: list[int]) -> None:
        """A piece between added tokens; a short one's ids from the memo (the ids of a
        text are a pure function of it)."""
        if len(text) > PIECE_MEMO_CHARS:
            out.extend(self._ordinary(text))
            return
        pieces = self._pieces
        ids = pieces.get(text)
        if ids is None:
            ids = tuple(self._ordinary(text))
            if len(pieces) >= PIECE_MEMO_ENTRIES:
                pieces.clear()
            pieces[text] = ids
        out.extend(ids)

    def _mixed(self, text: str, out: list[int]) -> None:
        """A text without added tokens that may hold any character: each run of other
        characters widened to the word cuts around it (right after an ASCII letter followed
        by a space and an ASCII letter: the prefix cache's word cut, exact for these
        pre-tokenizers, where a word takes its leading space, and NFC, which never composes
        across "letter | space letter") goes through the HF encoder, the printable ASCII
        between those spans through tiktoken."""
        start = 0  # the text not encoded yet starts here
        end = 0  # where the current span of other characters ends
        for found in self._other_runs(text):
            a, b = found.span()
            if a < end:
                continue  # inside the current span already
            left = _cut_before(text, a, start)
            if left > start:
                out.extend(self._ordinary(text[start:left]))
                start = left
            end = _cut_after(text, b)
            out.extend(self._other(text[start:end]))  # type: ignore[misc]
            start = end
        if start < len(text):
            out.extend(self._ordinary(text[start:]))

    def _cut(
        self,
        text: str,
        cuts: tuple[Callable[[str], Iterator[re.Match[str]]], ...],
        out: list[int],
        leaf: Callable[[str, list[int]], None],
    ) -> None:
        """Append the ids of ``text``: the added tokens the first cut finds, the pieces
        between them through the next cuts, then ``leaf``."""
        if not cuts:
            leaf(text, out)
            return
        cut, rest = cuts[0], cuts[1:]
        added = self._added_ids
        start = 0  # the text not encoded yet starts here
        for found in cut(text):
            at = found.start()
            if at > start:
                self._cut(text[start:at], rest, out, leaf)
            out.append(added[found.group()])
            start = found.end()
        if start < len(text):
            self._cut(text[start:], rest, out, leaf)


# The letters of Latin-1 (without U+00D7 and U+00F7) and Latin Extended-A (without U+017F,
# the long s, which case-folds to "s": the pattern's ``(?i:'s|...)`` could differ between
# regex engines): letters (Lu/Ll) since Unicode 1.1 in both engines' tables, never ``\s``
# or ``\p{N}``, unchanged by NFC (precomposed; a combining mark after one is another
# character, which takes its whole word to the HF encoder). Checked at build time over
# every vocabulary token made of them.
_LATIN = "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u017e"
_UNSAFE_ASCII = re.compile(r"[^\t\n\r\x20-\x7e]")
_UNSAFE_LATIN = re.compile(f"[^\\t\\n\\r\\x20-\\x7e{_LATIN}]")
_OTHER_RUN_ASCII = re.compile(r"[^\t\n\r\x20-\x7e]+")  # characters tiktoken does not take here
_OTHER_RUN_LATIN = re.compile(f"[^\\t\\n\\r\\x20-\\x7e{_LATIN}]+")


def _is_cut(text: str, at: int) -> bool:
    """A word cut right before ``text[at]``: an ASCII letter, a space, an ASCII letter."""
    return 0 < at < len(text) - 1 and text[at] == " " and _ascii_letter(text[at - 1]) and _ascii_letter(text[at + 1])


def _ascii_letter(char: str) -> bool:
    return char.isascii() and char.isalpha()


def _cut_before(text: str, at: int, floor: int) -> int:
    """The last word cut at or before ``at`` (not before ``floor``), else ``floor``."""
    at = text.rfind(" ", floor, at)
    while at > floor:
        if _is_cut(text, at):
            return at
        at = text.rfind(" ", floor, at)
    return floor


def _cut_after(text: str, at: int) -> int:
    """The first word cut at or after ``at``, else the text's end."""
    at = text.find(" ", at)
    while at >= 0:
        if _is_cut(text, at):
            return at
        at = text.find(" ", at + 1)
    return len(text)
# Pre-tokenizer branches that give a word its leading space (so no pre-token holds
# "letter | space letter"): Llama-3's and Qwen's, and GPT-2's.
_WORD_BRANCHES = (r"[^\r\n\p{L}\p{N}]?\p{L}+", r" ?\p{L}+")
_LATIN_SAMPLE = (
    "Ça va? L'été à Zürich, naïve café, Łódź, Ağr\u0131, Ŝi ŝatas ĉion; São Paulo's 'ß 'Ŝ 'Đ "
    "ÀÉÎÕÜàéîõüÿ ĀāĂăĄą Ğğİ\u0131ŁłŒœŠšŽž ĠġĊċ ġġġġ capacitãł"
)
_MIXED_SAMPLE = (
    "Café naïve Zürich über straße ĝĠġ Ünïcödé words and plain ones: 東京 is Tokyo, слово is word, "
    "e\u0301 composed é, a\u00a0b nbsp, tab\x0bvt, x\u2028y, ٣ digits 12 34, emoji 😀 ok ÀÉÎõü then "
    "more ascii words after them, it's l'été, don't stop ça va? ΑΒΓ abc ß ss."
)


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


@dataclass(frozen=True, slots=True)
class FastBpePlan:
    """What a checked encoder is made of (``plan_fast_bpe``): plain data, so the vocabulary
    walk and the self-check can run in another process and only ``build`` here."""

    pattern: str
    ranks: dict[bytes, int]
    contents: dict[str, int]
    plain: bool
    normalized: frozenset[str]
    latin: bool
    mixed: bool  # texts with other characters: cut at words, the HF encoder between
    sample: tuple[int, ...] = ()  # the HF ids of ``_SAMPLE``, checked against tiktoken's at ``build``

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with the ranks as two flat byte strings (the tokens, their lengths and
        ranks): one copy each to unpickle, where a dict of 150k entries unpickles in one
        long native call that holds the GIL; ``_unpacked_plan`` rebuilds it in steps."""
        keys = list(self.ranks)
        sizes = array("I", map(len, keys))
        ranks = array("I", (self.ranks[k] for k in keys))
        packed = (b"".join(keys), sizes.tobytes(), ranks.tobytes())
        return _unpacked_plan, (
            self.pattern, packed, self.contents, self.plain, self.normalized, self.latin, self.mixed, self.sample,
        )  # fmt: skip

    def build(self, backend: BackendTokenizer, other: Callable[[str], list[int]] | None = None) -> FastBpe | None:
        """The encoder for ``backend`` (the tokenizer the plan was made from, loaded here),
        handing the texts it does not take to ``other`` (default: ``backend``'s encode); None
        when it differs on the prose sample from the ids the plan's tokenizer gave it, or
        those ids do not spell the sample in ``backend``'s vocabulary: not the same tokenizer."""
        import tiktoken

        encoding = tiktoken.Encoding("gateway", pat_str=self.pattern, mergeable_ranks=self.ranks, special_tokens={})
        fast = FastBpe(
            encoding, self.contents, plain_specials=self.plain, normalized=self.normalized,
            other=(other or _hf_encoder(backend)) if self.mixed else None, latin=self.latin,
        )  # fmt: skip
        if not self.sample:
            return fast if fast.encode(_SAMPLE) == backend.encode(_SAMPLE, add_special_tokens=False).ids else None
        # ``backend`` may know its vocabulary alone (``backend_parts.merges_later``): its
        # tokens tell whether the plan's ids are its own.
        if fast.encode(_SAMPLE) != list(self.sample) or _spelled(backend, self.sample) != _SAMPLE.encode():
            return None
        return fast


def _spelled(backend: BackendTokenizer, ids: Sequence[int]) -> bytes | None:
    """The bytes ``ids`` stand for in ``backend``'s byte-level vocabulary (added tokens as
    their text), or None when one is not in it."""
    decode = byte_decoder()
    added = backend.get_added_tokens_decoder()
    out = bytearray()
    for token_id in ids:
        if token_id in added:
            out += added[token_id].content.encode()
            continue
        piece = backend.id_to_token(token_id)
        if piece is None or any(c not in decode for c in piece):
            return None
        out += bytes(decode[c] for c in piece)
    return bytes(out)


_UNPACK_STEP = 8192  # ranks put into the dict per native call


def _unpacked_plan(
    pattern: str, packed: tuple[bytes, bytes, bytes], contents: dict[str, int], plain: bool,
    normalized: frozenset[str], latin: bool, mixed: bool, sample: tuple[int, ...] = (),
) -> FastBpePlan:
    """The plan ``FastBpePlan.__reduce__`` packed, its ranks dict rebuilt a step at a time
    (another thread may take the GIL between steps)."""
    blob, sizes_bytes, ranks_bytes = packed
    sizes, values = array("I"), array("I")
    sizes.frombytes(sizes_bytes)
    values.frombytes(ranks_bytes)
    ranks: dict[bytes, int] = {}
    at = 0
    for start in range(0, len(sizes), _UNPACK_STEP):
        keys = []
        for size in sizes[start : start + _UNPACK_STEP]:
            keys.append(blob[at : at + size])
            at += size
        ranks.update(zip(keys, values[start : start + _UNPACK_STEP], strict=True))
    return FastBpePlan(pattern, ranks, contents, plain, normalized, latin, mixed, sample)


def build_fast_bpe(backend: BackendTokenizer) -> FastBpe | None:
    """A checked tiktoken encoder for this HF tokenizer, or None (not installed, another
    pipeline, or the checks found a difference)."""
    plan = plan_fast_bpe(backend)
    return plan.build(backend) if plan is not None else None


def plan_fast_bpe(backend: BackendTokenizer) -> FastBpePlan | None:
    """The checked plan of a tiktoken encoder for this HF tokenizer, or None (not installed,
    another pipeline, or the checks found a difference). Seconds of CPU, most of it with
    the GIL held in long C calls (the model's JSON, tiktoken's tables): a process that
    serves run it in another process and ``build`` the plan it returns."""
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
    decode = byte_decoder()
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
    # Only tokens made of bytes these texts hold: BPE looks up contiguous pieces of the text's
    # bytes alone, so the others could never be found (the table builds in about half the
    # time for Qwen's vocabulary, in one native call that holds the GIL).
    ranks = {raw: rank for raw, rank in ranks.items() if not raw.translate(None, _TAKEN_BYTES)}
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
    word_cuts = any(branch in pattern for branch in _WORD_BRANCHES) and not normalized
    other = _hf_encoder(backend) if word_cuts else None
    fast = FastBpe(encoding, contents, plain_specials=plain, normalized=normalized, other=other, latin=True)
    # Every token this encoder may meet, each as a whole text (its own pre-token): where a
    # token's rank-order BPE would end on another pair than its HF merge, the two differ here.
    texts = [_SAMPLE, _LATIN_SAMPLE]
    for raw in ranks:
        if raw.isascii():
            if not raw.translate(None, _SAFE_BYTES):
                texts.append(raw.decode("ascii"))
            continue
        try:
            token = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if _UNSAFE_LATIN.search(token) is None:
            texts.append(token)
    theirs = backend.encode_batch_fast(texts, add_special_tokens=False)
    latin = True
    for token, hf in zip(texts, theirs, strict=True):
        if fast.encode(token) != hf.ids:
            if token.isascii():
                return None
            latin = False  # Latin letters stay with the HF encoder; ASCII is checked alone
    mixed = False
    if other is not None:
        fast = FastBpe(encoding, contents, plain_specials=plain, normalized=normalized, other=other, latin=latin)
        mixed = fast.encode(_MIXED_SAMPLE) == backend.encode(_MIXED_SAMPLE, add_special_tokens=False).ids
    sample = tuple(backend.encode(_SAMPLE, add_special_tokens=False).ids)
    return FastBpePlan(pattern, ranks, contents, plain, frozenset(normalized), latin, mixed, sample)


def _hf_encoder(backend: BackendTokenizer) -> Callable[[str], list[int]]:
    encode = backend.encode

    def hf(text: str) -> list[int]:
        ids: list[int] = encode(text, add_special_tokens=False).ids
        return ids

    return hf
