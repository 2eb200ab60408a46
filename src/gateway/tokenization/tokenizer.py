"""The tokenizer handle every other layer uses.

Built on HF ``tokenizers.Tokenizer`` (Rust, releases the GIL while encoding) plus the
model's ``tokenizer_config.json`` / ``generation_config.json``, so that encode/decode,
special tokens and EOS ids match what HF transformers' fast tokenizer gives for the
same model, without paying for a transformers tokenizer object per model.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.processors import TemplateProcessing

from gateway.tokenization.backend_parts import (
    BackendParts,
    elsewhere,
    merges_deferred,
    split_backend,
    whole,
    whole_encoder,
)
from gateway.tokenization.errors import TokenizerLoadError, TokenizerTooLarge
from gateway.tokenization.fast_bpe import FastBpe, FastBpePlan, build_fast_bpe, plan_fast_bpe
from gateway.tokenization.length_bound import LengthBound, length_bound
from gateway.tokenization.special_text import SpecialTextShield
from gateway.tokenization.token_bytes import TokenBytes
from gateway.tokenization.token_bytes import for_backend as token_bytes_for
from gateway.tokenization.vocabulary_table import VocabularyTable, table_of

if TYPE_CHECKING:
    from gateway.tokenization.chat_template import ChatTemplate, PreparedRender

ParseFile = Callable[[Path], BackendTokenizer]
"""Makes the HF tokenizer of a ``tokenizer.json`` file (``Tokenizer.from_path``'s ``parse``)."""

# Files that make up a tokenizer folder (the hub download and worker zips use these).
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
    "chat_template.json",
)

# transformers stores "no limit" as a huge sentinel (int(1e30)); we report None instead.
_NO_LIMIT = 10**18
# token_id() answers kept per tokenizer (cleared when full).
_TOKEN_ID_MEMO = 4096
# Built encoders and bounds per backend object (kept alive with them, so an id is never
# reused): tokenizers that share one parsed backend (one per tokenizer file in a process
# that starts several gateways, as a test run does) build them once.
_BUILT: dict[tuple[str, int], tuple[BackendTokenizer, Any]] = {}
_BUILT_MAX = 16
_BUILT_LOCK = threading.Lock()


def _built(kind: str, backend: BackendTokenizer, build: Any) -> Any:
    """``build(backend)``, once per backend object and kind."""
    key = (kind, id(backend))
    with _BUILT_LOCK:
        found = _BUILT.get(key)
    if found is not None and found[0] is backend:
        return found[1]
    value = build(backend)
    with _BUILT_LOCK:
        if len(_BUILT) >= _BUILT_MAX:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = (backend, value)
    return value


_NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path.name} is not a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    """A special-token entry in tokenizer_config is a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _int_ids(value: Any) -> list[int]:
    """``eos_token_id`` in generation/model config is an int, a list of ints or null."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _chat_template_sources(folder: Path | None, config: Mapping[str, Any]) -> dict[str, str]:
    """Named chat templates, as transformers finds them (``chat_template.jinja`` wins)."""
    templates: dict[str, str] = {}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        templates["default"] = raw
    elif isinstance(raw, list):
        for entry in raw:
            if isinstance(entry, Mapping) and isinstance(entry.get("template"), str):
                templates[str(entry.get("name", "default"))] = str(entry["template"])
    if folder is not None:
        separate = _read_json(folder / "chat_template.json").get("chat_template")
        if isinstance(separate, str) and "default" not in templates:
            templates["default"] = separate
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            templates["default"] = jinja_file.read_text(encoding="utf-8")
    return templates


@functools.cache
def _byte_alphabet() -> frozenset[str]:
    """The characters of GPT-2's byte-level alphabet."""
    from gateway.tokenization.fast_bpe import byte_decoder

    return frozenset(byte_decoder())


# A text this short is encoded holding the GIL (``encode``, no thread pool): releasing it
# around a short piece of work only invites another thread to take the GIL first, and the
# event loop then waits for it, far longer than the encode itself under load. Longer texts go through ``encode_batch_fast``, which
# releases the GIL and skips offsets.
HOLD_GIL_CHARS = 2048
# An id list up to this long is decoded holding the GIL (``decode``), for the same reason; a
# longer one through ``decode_batch``, which releases it.
HOLD_GIL_IDS = 2048


class Tokenizer:
    """Encode/decode and special-token facts for one model. Safe to share across threads."""

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        name: str = "",
        path: Path | None = None,
        config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
        special_tokens_map: Mapping[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        # A gateway never truncates or pads silently (tokenizer.json may ask for both).
        backend.no_truncation()
        backend.no_padding()
        self.name = name
        self.path = path
        self.config: dict[str, Any] = dict(config or {})
        # The model files that came with the tokenizer (a worker's GetTokenizer zip and a
        # hub download carry both): the model's own context length and sampling defaults
        # are read from them (``pipeline.model_facts``); empty when absent.
        self.model_config: dict[str, Any] = dict(model_config or {})
        self.generation_config: dict[str, Any] = dict(generation_config or {})
        folder = path.parent if path is not None and path.is_file() else path
        self._chat_template_sources = _chat_template_sources(folder, self.config)
        self._chat_templates: dict[str, ChatTemplate] = {}
        self._lock = threading.Lock()
        self._token_ids: dict[str, int | None] = {}
        self._token_bytes: dict[bool, TokenBytes | None] = {}
        # A run-time-joined model's vocabulary may live in Python tables beside a backend
        # that has no model of it (``vocabulary_table``): look-ups and decodes read them.
        self._table: VocabularyTable | None = table_of(backend)
        # The tokenizer that encodes: ``backend`` itself, unless it was built without its
        # merges (``backend_parts.merges_later``: the fast encoder takes most texts, and the
        # merges' build would stall the event loop while a model joins); then the whole one,
        # built on the first encode that needs it (``_encoding``).
        self._encoder: BackendTokenizer | None = None if merges_deferred(backend) else backend

        named = dict(special_tokens_map or {})
        named.update({k: v for k, v in self.config.items() if k in _NAMED_SPECIAL_TOKENS})
        self._named_special: dict[str, str] = {}
        for key in _NAMED_SPECIAL_TOKENS:
            content = _token_content(named.get(key))
            if content is not None:
                self._named_special[key] = content

        self._added: dict[int, AddedToken] = dict(backend.get_added_tokens_decoder())
        # Read once like the added tokens above (the backend is never changed after this):
        # the request path asks for it several times per request, and the backend counts
        # its whole vocabulary on every ask.
        self._vocab_size = (
            self._table.size if self._table is not None else int(backend.get_vocab_size(with_added_tokens=True))
        )
        self.special_token_ids: frozenset[int] = frozenset(
            i for i, tok in self._added.items() if tok.special
        )
        bos = self._named_special.get("bos_token")
        self.bos_token_id: int | None = self._token_to_id(bos) if bos is not None else None
        self._apply_bos_eos_flags()

        eos_ids: set[int] = set()
        eos = self._named_special.get("eos_token")
        if eos is not None and (eos_id := self._token_to_id(eos)) is not None:
            eos_ids.add(eos_id)
        eos_ids.update(_int_ids((generation_config or {}).get("eos_token_id")))
        eos_ids.update(_int_ids((model_config or {}).get("eos_token_id")))
        self._eos_token_ids = frozenset(eos_ids)

        limit = self.config.get("model_max_length")
        self.model_max_length: int | None = (
            int(limit) if isinstance(limit, int | float) and 0 < limit < _NO_LIMIT else None
        )

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_path(cls, path: str | Path, name: str | None = None, parse: ParseFile | None = None) -> Tokenizer:
        """Load from a tokenizer folder or a ``tokenizer.json`` file (configs read from beside it).
        ``parse`` makes the HF tokenizer from the ``tokenizer.json`` file (default: parsed here,
        in one native call that holds the GIL throughout)."""
        path = Path(path)
        if path.is_file():
            folder, json_file = path.parent, path
        elif path.is_dir():
            folder, json_file = path, path / "tokenizer.json"
        else:
            raise TokenizerLoadError(f"{path} does not exist")
        if not json_file.is_file():
            raise TokenizerLoadError(f"no tokenizer.json in {folder}")
        try:
            backend = parse(json_file) if parse is not None else BackendTokenizer.from_file(str(json_file))
        except Exception as exc:  # tokenizers raises plain Exception on bad JSON
            raise TokenizerLoadError(f"cannot parse {json_file}: {exc}") from exc
        return cls(
            backend,
            name=name or folder.name,
            path=path,
            config=_read_json(folder / "tokenizer_config.json"),
            generation_config=_read_json(folder / "generation_config.json"),
            model_config=_read_json(folder / "config.json"),
            special_tokens_map=_read_json(folder / "special_tokens_map.json"),
        )

    def _apply_bos_eos_flags(self) -> None:
        """Honour explicit ``add_bos_token``/``add_eos_token`` in tokenizer_config.

        tokenizer.json's post-processor decides by default (as in HF tokenizers and
        transformers 5). When the config states a flag explicitly and the post-processor
        disagrees, the config wins, as transformers' Llama/Gemma-family fast tokenizers
        do: the post-processor is rebuilt as ``[bos] $A [eos]``.
        """
        want_bos = self.config.get("add_bos_token")
        want_eos = self.config.get("add_eos_token")
        if want_bos is None and want_eos is None:
            return
        eos = self._named_special.get("eos_token")
        eos_id = self._token_to_id(eos) if eos is not None else None
        with_special = self.backend.encode("a", add_special_tokens=True).ids
        plain = self.backend.encode("a", add_special_tokens=False).ids
        extra = len(with_special) > len(plain)
        has_bos = extra and self.bos_token_id is not None and with_special[0] == self.bos_token_id
        has_eos = extra and eos_id is not None and with_special[-1] == eos_id
        add_bos = has_bos if want_bos is None else bool(want_bos) and self.bos_token_id is not None
        add_eos = has_eos if want_eos is None else bool(want_eos) and eos_id is not None
        if (add_bos, add_eos) == (has_bos, has_eos):
            return
        bos = self._named_special.get("bos_token")
        single = " ".join(
            ([f"{bos}:0"] if add_bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos else [])
        )
        pair = (
            single
            + " "
            + " ".join(
                ([f"{bos}:1"] if add_bos else []) + ["$B:1"] + ([f"{eos}:1"] if add_eos else [])
            )
        )
        specials = ([(bos, self.bos_token_id)] if add_bos else []) + (
            [(eos, eos_id)] if add_eos else []
        )
        self.backend.post_processor = TemplateProcessing(
            single=single, pair=pair, special_tokens=specials
        )

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``. Use ``add_special_tokens=False`` for rendered chat prompts."""
        fast = self.__dict__.get("fast_bpe")  # once built and checked (off the event loop)
        if fast is not None and (fast.plain_specials or not add_special_tokens):
            # Without the merges here, a text tiktoken does not take whole goes elsewhere whole
            # (one round trip, not one per span).
            found = fast.encode(text) if self._encoder is not None or fast.takes(text) else None
            if found is not None:
                return found
        if self._encoder is None and (other := elsewhere(self.backend)) is not None:
            return other([text], add_special_tokens, False)[0]
        backend = self._encoder or self._encoding()
        if len(text) <= HOLD_GIL_CHARS:
            ids: list[int] = backend.encode(text, add_special_tokens=add_special_tokens).ids
            return ids
        # encode_batch_fast skips offset tracking (ids only) and releases the GIL.
        encoding = backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0]
        ids = encoding.ids
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        """Encode many texts in one call (parallel inside the Rust library). Texts that are
        short together are encoded one by one holding the GIL: ``encode_batch_fast`` hands
        them to the library's thread pool, whose threads sleep between requests, and waking
        them costs several times the work itself for a short chat prompt at concurrency 1."""
        fast = self.__dict__.get("fast_bpe")
        here = self._encoder is not None
        other = None if here else elsewhere(self.backend)
        if fast is not None and (fast.plain_specials or not add_special_tokens):
            found = [fast.encode(t) if here or fast.takes(t) else None for t in texts]
            if all(ids is not None for ids in found):
                return found  # type: ignore[return-value]
            if other is not None:  # the texts tiktoken does not take whole, in one round trip
                fresh = iter(other([t for t, ids in zip(texts, found, strict=True) if ids is None], add_special_tokens, False))
                return [ids if ids is not None else next(fresh) for ids in found]
        if other is not None:
            return other(texts, add_special_tokens, False)
        backend = self._encoder or self._encoding()
        if sum(len(t) for t in texts) <= HOLD_GIL_CHARS:
            encode = backend.encode
            return [encode(t, add_special_tokens=add_special_tokens).ids for t in texts]
        encodings = backend.encode_batch_fast(
            list(texts), add_special_tokens=add_special_tokens
        )
        return [e.ids for e in encodings]

    def encodes_elsewhere(self, text: str) -> bool:
        """Whether encoding ``text`` means a round trip to the process that holds this
        tokenizer's merges (``backend_parts.encode_elsewhere``): the caller may rather wait
        for it on a thread than on the event loop."""
        if self._encoder is not None:
            return False
        fast = self.__dict__.get("fast_bpe")
        return (fast is None or not fast.takes(text)) and elsewhere(self.backend) is not None

    @property
    def merges_elsewhere(self) -> bool:
        """Whether another process holds this tokenizer's merges (they are not built here)."""
        return self._encoder is None and elsewhere(self.backend) is not None

    def build_merges(self) -> None:
        """Build the tokenizer with its merges now if its build was put off (a joining model's
        is): at start-up, before any request, its native build holds the event loop at no
        request's cost, where the first text tiktoken does not take would pay it later.
        Not for one whose merges another process holds (``backend_parts.encode_elsewhere``)."""
        if self._encoder is None and elsewhere(self.backend) is None:
            self._encoding()

    def _encoding(self) -> BackendTokenizer:
        """The tokenizer with the merges (``backend_parts.whole``), built here if nothing
        has asked for it before."""
        found = self._encoder = whole(self.backend)
        return found

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; no ``clean_up_tokenization_spaces`` (it would break streaming).
        A long list goes through ``decode_batch``, which releases the GIL while it decodes
        (``decode`` holds it throughout: about 0.4 ms of one core per thousand ids)."""
        if self._table is not None:  # the bytes of the ids (``vocabulary_table``)
            return self.token_bytes(skip_special_tokens).text(ids)  # type: ignore[union-attr]
        if len(ids) <= HOLD_GIL_IDS:
            return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        text: str = self.backend.decode_batch([list(ids)], skip_special_tokens=skip_special_tokens)[0]
        return text

    def id_to_piece(self, token_id: int) -> str | None:
        """The vocabulary piece of one id (e.g. ``"Ġhello"``), or None if unknown."""
        return self._id_to_token(token_id)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self._id_to_token(i) for i in ids]

    def _id_to_token(self, token_id: int) -> str | None:
        """``backend.id_to_token``, from the vocabulary tables where the backend has no model of them."""
        found: str | None = self.backend.id_to_token(token_id)
        if found is None and self._table is not None:
            return self._table.id_to_token(token_id)
        return found

    def _token_to_id(self, token: str) -> int | None:
        """``backend.token_to_id``, from the vocabulary tables where the backend has no model of them."""
        found: int | None = self.backend.token_to_id(token)
        if found is None and self._table is not None:
            return self._table.token_to_id(token)
        return found

    @property
    def vocabulary_in_tables(self) -> bool:
        """Whether this process keeps the vocabulary in Python tables, without a model of it
        (``vocabulary_table``): every encode is another process's or, failing that, ``build_merges``'."""
        return self._table is not None

    def token_id(self, text: str) -> int | None:
        """The id if ``text`` is exactly one token (and decodes back to itself), else None.

        Memoized: chat requests ask for the think tags and stop strings every time, and an
        encode plus a decode per ask showed up in the gateway's profile."""
        try:
            return self._token_ids[text]
        except KeyError:
            pass
        found = self._lookup_token_id(text)
        if len(self._token_ids) >= _TOKEN_ID_MEMO:
            self._token_ids.clear()  # stop strings come from clients: stay bounded
        self._token_ids[text] = found
        return found

    def _lookup_token_id(self, text: str) -> int | None:
        if not text:
            return None
        if self._encoder is None and self._never_one_token(text):
            return None  # told without the merges (a text tiktoken does not take would need them)
        if self._encoder is None and self._table is not None and self._table.unreached is not None:
            found = self._one_piece(text, self._table.unreached)
            if found is not False:  # told from the tables: no round trip from the event loop's thread
                return found if found is not None and self.decode([found], skip_special_tokens=False) == text else None
        # Through the fast encoder where it takes the text (the same ids), so that asking
        # about a plain-text tag needs no tokenizer with merges.
        ids = self.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            return None
        if self.decode(ids, skip_special_tokens=False) != text:
            return None
        return int(ids[0])

    def _one_piece(self, text: str, unreached: AbstractSet[int]) -> int | bool | None:
        """The id ``text`` encodes to when that is one token, else None, told from the vocabulary
        tables and ``unreached`` (the pieces the model does not encode to themselves); False when
        they cannot tell (an added token in it, characters outside the byte alphabet). With no
        added token in it, a text is one token only when it normalizes and pre-tokenizes to one
        piece (every non-empty piece of byte-alphabet characters is at least one token) that is
        a vocabulary entry the model reaches whole."""
        if any(t.content in text for t in self._added.values()):
            return False
        normalizer, pre = self.backend.normalizer, self.backend.pre_tokenizer
        normalized = normalizer.normalize_str(text) if normalizer is not None else text
        if any(t.content in normalized for t in self._added.values()):
            return False
        pieces = [piece for piece, _ in pre.pre_tokenize_str(normalized)] if pre is not None else [normalized]
        alphabet = _byte_alphabet()
        if any(c not in alphabet for piece in pieces for c in piece):
            return False
        if len(pieces) != 1:
            return None
        found = self._table.token_to_id(pieces[0]) if self._table is not None else None
        return None if found is None or found in unreached else found

    def _never_one_token(self, text: str) -> bool:
        """Whether ``text`` surely encodes to more than one token, told from the vocabulary:
        an encode to one token makes the text's one pre-token a token, so when the text,
        normalized and pre-tokenized, is no vocabulary entry (nor an added token, matched
        whole; none strips whitespace), it is not one token, whatever the merges."""
        added = self._added.values()
        if any(t.content == text or t.lstrip or t.rstrip or t.single_word for t in added):
            return False
        normalizer, pre = self.backend.normalizer, self.backend.pre_tokenizer
        normalized = normalizer.normalize_str(text) if normalizer is not None else text
        image = "".join(piece for piece, _ in pre.pre_tokenize_str(normalized)) if pre is not None else normalized
        return self._token_to_id(image) is None

    # ------------------------------------------------------------------ facts
    @functools.cached_property
    def length_bound(self) -> LengthBound | None:
        """A lower bound on token counts from text length (``tokenization.length_bound``);
        the first read walks the vocabulary (run it off the event loop). None for vocabulary
        tables unless installed (``install_encoders``): it would build the model here."""
        if self._table is not None:
            return None
        return _built("length_bound", self.backend, lambda backend: length_bound(whole(backend)))  # type: ignore[no-any-return]

    @functools.cached_property
    def fast_bpe(self) -> FastBpe | None:
        """tiktoken as this tokenizer's encoder where its ids are exact (``tokenization.fast_bpe``),
        used by ``encode`` once built; the first read checks it (seconds of CPU: run it off the event loop).
        None for vocabulary tables: another process encodes, and tiktoken's table is one native
        call that holds the GIL as long as the vocabulary is large."""
        if self._table is not None:
            return None
        return _built("fast_bpe", self.backend, lambda backend: build_fast_bpe(whole(backend)))  # type: ignore[no-any-return]

    def token_bytes(self, skip_special_tokens: bool) -> TokenBytes | None:
        """The bytes of this vocabulary's ids for the streamed relay's detokenizer
        (``tokenization.token_bytes``), or None where ``DecodeStream`` must decode; checked
        once per ``skip_special_tokens`` (a couple of hundred decodes: ``warm_token_bytes``)."""
        try:
            return self._token_bytes[skip_special_tokens]
        except KeyError:
            found: TokenBytes | None
            if self._table is not None:  # the decode itself: nothing to check it against here
                found = TokenBytes(self.backend, skip_special_tokens, id_to_token=self._id_to_token)
            else:
                found = token_bytes_for(self.backend, skip_special_tokens)
            self._token_bytes[skip_special_tokens] = found
            return found

    def warm_token_bytes(self) -> None:
        """Check the detokenizer's byte tables now (milliseconds), off the event loop and
        before the model takes traffic, not in its first streamed request."""
        self.token_bytes(True)
        self.token_bytes(False)

    def warm_encoders(self) -> None:
        """Build the tiktoken encoder and the length bound now, off the event loop, before
        the model takes traffic. Built lazily instead, in a thread beside the serving loop,
        their long native calls (the vocabulary's serialization and parse, tiktoken's
        table) hold the GIL for long stretches on a busy host, and every request that
        arrives meanwhile waits: a fresh gateway under load answered its first requests
        late while its workers sat idle."""
        _ = self.fast_bpe, self.length_bound

    def encoders_built(self) -> bool:
        """Whether the fast encoder and the length bound are built for this tokenizer's
        backend already (reading them is then free)."""
        backend = self.backend
        with _BUILT_LOCK:
            found = [_BUILT.get((kind, id(backend))) for kind in ("fast_bpe", "length_bound")]
        return all(f is not None and f[0] is backend for f in found)

    def install_encoders(self, plan: FastBpePlan | None, bound: LengthBound | None) -> FastBpe | None:
        """Take what ``encoder_facts_at`` worked out in another process as this tokenizer's
        fast encoder and length bound (what ``fast_bpe`` and ``length_bound`` return from now
        on); the encoder, built from the plan. That holds the GIL for tiktoken's table only
        (about a tenth of a second of one core for 150k tokens), so a tokenizer whose
        vocabulary is in tables takes the bound alone: another process encodes its texts."""
        if self._table is not None:
            plan = None
        fast = _built(
            "fast_bpe", self.backend, lambda backend: plan.build(backend, whole_encoder(backend)) if plan is not None else None
        )
        self.__dict__["fast_bpe"] = fast
        self.__dict__["length_bound"] = _built("length_bound", self.backend, lambda backend: bound)
        return fast  # type: ignore[no-any-return]

    @property
    def fast_bpe_ready(self) -> bool:
        """True once ``fast_bpe`` has been built (or found not to apply)."""
        return "fast_bpe" in self.__dict__

    @property
    def length_bound_ready(self) -> bool:
        """True once ``length_bound`` has been computed (reading it is then free)."""
        return "length_bound" in self.__dict__

    @property
    def vocab_size(self) -> int:
        """Number of ids this tokenizer knows, added tokens included (``len(hf_tokenizer)``)."""
        return self._vocab_size

    @property
    def added_tokens(self) -> Mapping[int, AddedToken]:
        """Added tokens by id (special or not): BPE never merges across these."""
        return self._added

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """EOS ids from tokenizer_config, generation_config.json and config.json, plus merged ones."""
        return self._eos_token_ids

    def merge_eos_token_ids(self, ids: Iterable[int]) -> None:
        """Add EOS ids a worker reported (GetModelInfo); the union is kept."""
        extra = frozenset(int(i) for i in ids)
        with self._lock:
            self._eos_token_ids = self._eos_token_ids | extra

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Named special tokens as strings (what chat templates see as ``bos_token`` etc.)."""
        return dict(self._named_special)

    # ------------------------------------------------------------------ chat template
    @property
    def chat_template_names(self) -> tuple[str, ...]:
        return tuple(self._chat_template_sources)

    def chat_template_sources(self) -> dict[str, str]:
        """The model's chat templates by name, as Jinja source (parser detection reads them)."""
        return dict(self._chat_template_sources)

    def override_chat_template(self, source: str) -> None:
        """Use ``source`` as the only chat template (``--chat-template FILE``)."""
        with self._lock:
            self._chat_template_sources = {"default": source}
            self._chat_templates.clear()

    def chat_template(self, name: str | None = None, *, with_tools: bool = False) -> ChatTemplate:
        """The compiled chat template (cached): ``name``, else ``tool_use`` when tools are
        given and such a template exists, else ``default``."""
        sources = self._chat_template_sources
        if name is None:
            name = "tool_use" if with_tools and "tool_use" in sources else "default"
        found = self._chat_templates.get(name)  # every request: a dict read, no lock, no import
        if found is not None and name in sources:
            return found
        from gateway.tokenization.chat_template import ChatTemplate
        from gateway.tokenization.errors import ChatTemplateError

        if name not in sources:
            available = ", ".join(sorted(sources)) or "none"
            raise ChatTemplateError(
                f"tokenizer {self.name!r} has no chat template {name!r} (available: {available})"
            )
        with self._lock:
            template = self._chat_templates.get(name)
        if template is None:
            template = ChatTemplate(sources[name], special_tokens=self._named_special)
            with self._lock:
                self._chat_templates.setdefault(name, template)
        return template

    def warm_chat_templates(self) -> None:
        """Compile every chat template now (the first compile imports transformers' renderer,
        about a second, which would otherwise stall the first chat request). A template
        that fails to compile is left alone: it fails with a clear error when used."""
        from gateway.tokenization.errors import ChatTemplateError

        for name in self._chat_template_sources:
            with contextlib.suppress(ChatTemplateError):
                self.chat_template(name)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        template_name: str | None = None,
    ) -> str:
        """Render ``messages`` to the prompt text; encode it with ``add_special_tokens=False``."""
        template = self.chat_template(template_name, with_tools=bool(tools))
        return template.render(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )

    def prepare_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        template_name: str | None = None,
    ) -> PreparedRender:
        """``apply_chat_template`` in two halves (``ChatTemplate.prepare``): the inputs made
        ready and the memo asked, without running template code; its ``finish`` runs it."""
        template = self.chat_template(template_name, with_tools=bool(tools))
        return template.prepare(
            messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
        )

    @functools.cached_property
    def special_text(self) -> SpecialTextShield:
        """The shield that keeps special-token strings in client text plain (``special_text``)."""
        return SpecialTextShield(self.backend, [tok.content for tok in self._added.values() if tok.special])

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size})"


def encoder_facts_at(path: str) -> tuple[FastBpePlan | None, LengthBound | None]:
    """The fast encoder's plan and the length bound of the tokenizer at ``path``, loaded as
    ``Tokenizer.from_path`` loads it: what a child process runs, so the vocabulary walks, the
    self-check and their long GIL-holding calls never share a process with an event loop."""
    backend = Tokenizer.from_path(path).backend
    return plan_fast_bpe(backend), length_bound(backend)


def load_facts_at(path: str, max_entries: int = 0) -> tuple[BackendParts | None, FastBpePlan | None, LengthBound | None]:
    """What a child process works out from the ``tokenizer.json`` at ``path`` for a process
    that serves: the file in parts it can rebuild the HF tokenizer from in short steps
    (``backend_parts``; None: it parses the file whole), and, as ``encoder_facts_at``, the
    fast encoder's plan and the length bound of the tokenizer so rebuilt. Raises
    ``TokenizerTooLarge`` when ``max_entries`` (0: no bound) is less than the model's
    vocabulary entries: the serving process builds the model in one call that holds its GIL."""
    json_file = Path(path)
    text = json_file.read_text(encoding="utf-8")
    split = split_backend(text)
    if max_entries:
        entries = len(split[0].ids) // 4 if split is not None else _vocabulary_entries(text)
        if entries > max_entries:
            raise TokenizerTooLarge(
                f"{json_file.name}: a vocabulary of {entries:,} entries, more than the {max_entries:,} this gateway builds"
                " (--max-vocabulary-entries)"
            )
    if split is None:
        backend = Tokenizer.from_path(json_file).backend
        return None, plan_fast_bpe(backend), length_bound(backend)
    parts, rebuilt = split
    backend = Tokenizer.from_path(json_file, parse=lambda _: rebuilt).backend
    return parts, plan_fast_bpe(backend), length_bound(backend)


def _vocabulary_entries(text: str) -> int:
    """Entries of the model's vocabulary in a ``tokenizer.json`` (0 when it has none)."""
    data = json.loads(text)
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    return len(vocab) if isinstance(vocab, dict | list) else 0
