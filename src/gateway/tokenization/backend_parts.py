"""A BPE ``tokenizer.json`` cut into parts that another process parses and this one
rebuilds the HF tokenizer from, without one long stall.

``tokenizers`` parses a ``tokenizer.json`` in one native call that holds the GIL for as
long as the parse takes (its Python binding releases the GIL in encoding and training,
not in ``from_str``/``from_file``/``from_buffer``); for a 150k-token vocabulary that is
hundreds of milliseconds in which no other thread of the process runs, the event loop
included. Nearly all of that time is the BPE model (the JSON's vocabulary and merges):
the rest of the file, without them, parses in well under a millisecond.

So a child process reads the file and hands back (``split_backend``): the file without
the model's vocabulary and merges and without the added tokens (the *shell*), the
vocabulary as one flat string and the merges as positions in it (a few MB that unpickle
in one copy each), and the added tokens. ``BackendParts.build`` then makes the vocabulary dict and the merge list in
small steps (another thread may take the GIL between any two), parses the shell, sets
the model from those Python objects (one native call still, about half of the whole
file's parse), and adds the added tokens as the file's parse does. ``split_backend``
rebuilds the tokenizer itself and compares its serialization with the file's parse: any
difference (a model that is not BPE, an option it does not know) gives None, and the
caller parses the file whole.

Most of the model's build is its merges, and a process whose encodes go through tiktoken
(``fast_bpe``) needs them only for the texts tiktoken does not take. ``merges_later`` builds
the tokenizer around a vocabulary-only BPE model (decoding, id and token look-ups are the
same: they read the vocabulary alone) and ``whole`` gives the tokenizer with the merges,
built from the same parts the first time something must encode with it, unless
``encode_elsewhere`` names another process that holds it (``elsewhere``): then that build
never happens in this one.
"""

from __future__ import annotations

import json
import threading
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, models
from tokenizers import Tokenizer as BackendTokenizer

SEPARATOR = "\x00"
"""Joins the vocabulary's pieces (a piece that holds it: no parts)."""
STEP = 8192
"""Entries put into the vocabulary dict or the merge list per native call."""
_BPE_OPTIONS = frozenset(
    {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges"}
)
_ADDED_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


@dataclass(frozen=True, slots=True)
class BackendParts:
    """A BPE tokenizer.json in parts that are cheap to pickle (see the module's docstring)."""

    shell: str  # the file without the model's vocabulary and merges, without added tokens
    options: dict[str, Any]  # the BPE model's options (``models.BPE`` keywords)
    pieces: str  # the vocabulary's pieces, SEPARATOR between them
    ids: bytes  # their ids, an ``array("I")``
    merges: bytes  # left and right of every merge, in order, as positions in ``pieces`` (an ``array("I")``)
    added: tuple[tuple[int, str, dict[str, bool]], ...]  # (id, content, flags) in the file's order

    def build(self, *, merges: bool = True) -> BackendTokenizer:
        """The tokenizer these parts came from (without ``merges``: its BPE model knows the
        vocabulary alone, and encodes differently). Raises ValueError when an added token
        gets another id than it had in the file."""
        vocab, pairs = self.objects(merges=merges)
        return self.assemble(vocab, pairs)

    def objects(self, *, merges: bool = True) -> tuple[dict[str, int], list[tuple[str, str]]]:
        """The vocabulary dict and the merge list, made in steps of ``STEP`` entries."""
        pieces = self.pieces.split(SEPARATOR) if self.pieces else []
        ids = array("I")
        ids.frombytes(self.ids)
        vocab: dict[str, int] = {}
        for start in range(0, len(pieces), STEP):
            vocab.update(zip(pieces[start : start + STEP], ids[start : start + STEP], strict=True))
        halves = array("I")
        halves.frombytes(self.merges if merges else b"")
        pairs: list[tuple[str, str]] = []
        for start in range(0, len(halves), 2 * STEP):
            chunk = halves[start : start + 2 * STEP]
            pairs.extend(zip(map(pieces.__getitem__, chunk[0::2]), map(pieces.__getitem__, chunk[1::2]), strict=True))
        return vocab, pairs

    def assemble(self, vocab: dict[str, int], pairs: list[tuple[str, str]]) -> BackendTokenizer:
        """The tokenizer around ``models.BPE(vocab, pairs)`` (the native calls only)."""
        backend = BackendTokenizer.from_str(self.shell)
        backend.model = models.BPE(vocab, pairs, **self.options)
        backend.add_tokens([AddedToken(content, **flags) for _, content, flags in self.added])
        for token_id, content, _ in self.added:
            if backend.token_to_id(content) != token_id:
                raise ValueError(f"added token {content!r} got id {backend.token_to_id(content)}, not {token_id}")
        return backend


_LATER: weakref.WeakKeyDictionary[BackendTokenizer, tuple[BackendParts, dict[str, int], list[tuple[str, str]]]] = (
    weakref.WeakKeyDictionary()
)
"""Tokenizers built without their merges, and what the whole one is built from: the parts,
and the vocabulary dict and merge list already made from them."""
_WHOLE: weakref.WeakKeyDictionary[BackendTokenizer, BackendTokenizer] = weakref.WeakKeyDictionary()
_WHOLE_LOCK = threading.Lock()

EncodeMany = Callable[[Sequence[str], bool, bool], list[list[int]]]
"""``(texts, add_special_tokens, plain)`` -> each text's ids, from a tokenizer with its merges
held by another process (``plain``: special-token strings in the texts are read as text)."""
_ELSEWHERE: weakref.WeakKeyDictionary[BackendTokenizer, EncodeMany] = weakref.WeakKeyDictionary()


def merges_later(parts: BackendParts) -> BackendTokenizer:
    """The tokenizer of ``parts`` around a vocabulary-only model: it decodes and looks ids
    and tokens up as the whole one does, but only ``whole`` of it encodes as the file says.
    The vocabulary dict and the merge list are made here, in steps (call it off the event
    loop), and kept (tens of MB for a 150k vocabulary), so that the whole one's build holds
    the GIL for its native calls alone, wherever it happens."""
    vocab, pairs = parts.objects()
    backend = parts.assemble(vocab, [])
    with _WHOLE_LOCK:
        _LATER[backend] = (parts, vocab, pairs)
    return backend


def defer_model(backend: BackendTokenizer, parts: BackendParts) -> None:
    """Have ``whole`` build ``backend``'s whole tokenizer from ``parts`` (or ``encode_elsewhere``
    send its encodes to a process that holds it): for a tokenizer made here without a model
    of its vocabulary (``vocabulary_table``), which cannot encode as its file says."""
    with _WHOLE_LOCK:
        _LATER[backend] = (parts, {}, [])


def merges_deferred(backend: BackendTokenizer) -> bool:
    """Whether ``backend`` came from ``merges_later`` (its encodes must go through ``whole``)."""
    with _WHOLE_LOCK:
        return backend in _LATER or backend in _WHOLE


def deferred_parts(backend: BackendTokenizer) -> BackendParts | None:
    """The parts of a ``merges_later`` tokenizer whose whole one is not built here yet (what
    another process builds it from), else None."""
    with _WHOLE_LOCK:
        later = _LATER.get(backend)
    return later[0] if later is not None else None


def encode_elsewhere(backend: BackendTokenizer, encode: EncodeMany) -> None:
    """From now on the texts that need ``backend``'s merges are encoded by ``encode`` (another
    process holding the whole tokenizer): the merges' native build holds the GIL for
    hundreds of milliseconds, which no request should wait behind. The vocabulary dict and
    merge list kept for a build here are let go."""
    with _WHOLE_LOCK:
        if backend in _WHOLE or backend not in _LATER:
            return
        parts = _LATER[backend][0]
        _LATER[backend] = (parts, {}, [])
        _ELSEWHERE[backend] = encode


def elsewhere(backend: BackendTokenizer) -> EncodeMany | None:
    """The encoder ``encode_elsewhere`` gave ``backend``, while its whole tokenizer is not built here."""
    with _WHOLE_LOCK:
        return None if backend in _WHOLE else _ELSEWHERE.get(backend)


def whole(backend: BackendTokenizer) -> BackendTokenizer:
    """The tokenizer that encodes as ``backend``'s file says: ``backend`` itself, or for one
    from ``merges_later`` the tokenizer with the merges, built the first time it is asked
    (the BPE model's native build holds the GIL, as the file's parse would) with
    ``backend``'s post-processor as it is then (the model's BOS/EOS settings may have
    changed it)."""
    with _WHOLE_LOCK:
        found = _WHOLE.get(backend)
        if found is not None:
            return found
        later = _LATER.pop(backend, None)
        if later is None:
            return backend
        parts, vocab, pairs = later
        if not vocab and parts.pieces:  # let go by ``encode_elsewhere``: made again (off the loop, as a fallback)
            vocab, pairs = parts.objects()
        found = parts.assemble(vocab, pairs)
        found.post_processor = backend.post_processor
        found.no_truncation()
        found.no_padding()
        _WHOLE[backend] = found
        return found


def whole_encoder(backend: BackendTokenizer) -> Callable[[str], list[int]]:
    """``whole(backend)``'s ids of a text (``add_special_tokens=False``), or the ids the
    process ``elsewhere`` names gives, found on each call: what tiktoken hands the texts it
    does not take to."""

    def encode(text: str) -> list[int]:
        other = elsewhere(backend)
        if other is not None:
            return other([text], False, False)[0]
        ids: list[int] = whole(backend).encode(text, add_special_tokens=False).ids
        return ids

    return encode


def split_backend(text: str) -> tuple[BackendParts, BackendTokenizer] | None:
    """``text`` (a tokenizer.json) in parts whose ``build`` gives exactly the tokenizer
    ``BackendTokenizer.from_str(text)`` gives (checked here by comparing both
    serializations), and the tokenizer so built; or None. Seconds of CPU for a large
    vocabulary: run it in a process that serves nothing."""
    try:
        parts = _cut(text)
        if parts is None:
            return None
        rebuilt = parts.build()
        same = rebuilt.to_str() == BackendTokenizer.from_str(text).to_str()
    except Exception:  # a shape or an option the rebuild does not take: the file is parsed whole
        return None
    return (parts, rebuilt) if same else None


def _cut(text: str) -> BackendParts | None:
    data = json.loads(text)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        return None
    vocab, merges = model.get("vocab"), model.get("merges")
    options = {k: v for k, v in model.items() if k not in ("type", "vocab", "merges")}
    if not isinstance(vocab, dict) or not isinstance(merges, list) or not set(options) <= _BPE_OPTIONS:
        return None
    options = {k: v for k, v in options.items() if v is not None}  # None: the option's default
    halves: list[str] = []
    for merge in merges:
        pair = merge.split(" ", 1) if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2:
            return None
        halves.extend(pair)
    added = []
    for token in data.get("added_tokens") or []:
        flags = {k: bool(token.get(k)) for k in _ADDED_FLAGS}
        added.append((int(token["id"]), str(token["content"]), flags))
    pieces = list(vocab)
    position = {p: i for i, p in enumerate(pieces)}
    if any(SEPARATOR in p for p in pieces) or any(h not in position for h in halves):
        return None  # a merge of something outside the vocabulary: left to the whole parse
    ids = array("I", (int(vocab[p]) for p in pieces))
    shell = {**data, "model": {**model, "vocab": {}, "merges": []}, "added_tokens": []}
    return BackendParts(
        shell=json.dumps(shell), options=options, pieces=SEPARATOR.join(pieces), ids=ids.tobytes(),
        merges=array("I", map(position.__getitem__, halves)).tobytes(), added=tuple(added),
    )  # fmt: skip
