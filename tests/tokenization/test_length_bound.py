"""The length bound never claims more tokens than the tokenizer makes (it may reject a
prompt before tokenizing it, so it must be safe), and refuses tokenizers it cannot bound."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from gateway.tokenization import Tokenizer
from gateway.tokenization.length_bound import length_bound

from .helpers import PROPERTY, multilingual_text

# Texts built to compress well: runs of the characters the longest tokens are made of,
# decomposed Hangul (NFC composes three characters into one) and combining marks.
RUNS = st.lists(st.sampled_from([" ", "-", "=", "\n", "/", "\u1100\u1161\u11a8", "e\u0301", "a", "//"]), max_size=400).map("".join)


def test_qwen_bound_is_known(qwen: Tokenizer) -> None:
    bound = qwen.length_bound
    assert bound is not None and bound.chars_per_token == 128 and bound.compose_factor == 3
    assert qwen.length_bound_ready
    assert bound.min_tokens(" " * 128 * 10) == 10  # ASCII: normalization changes nothing
    assert bound.min_tokens("\u1100" * 384 * 10) == 10  # may compose: a factor of 3


@PROPERTY
@given(text=st.one_of(RUNS, multilingual_text(), st.text(max_size=2000)), special=st.booleans())
def test_bound_never_exceeds_the_real_count(qwen: Tokenizer, text: str, special: bool) -> None:
    bound = qwen.length_bound
    assert bound is not None
    assert bound.min_tokens(text * 20) <= len(qwen.encode(text * 20, add_special_tokens=special))


def test_worst_case_run_is_tight_enough_to_reject_the_hopeless(qwen: Tokenizer) -> None:
    text = " " * 1_000_000
    bound = qwen.length_bound
    assert bound is not None
    assert bound.min_tokens(text) <= len(qwen.encode(text, add_special_tokens=False))
    assert bound.min_tokens(text) > 7000  # a 1 MB prompt is refused for an 8k-token model


def test_tokenizers_that_drop_characters_get_no_bound() -> None:
    wordpiece = BackendTokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert length_bound(wordpiece) is None  # a whole unknown word is one token
    bpe = BackendTokenizer(models.BPE({"a": 0, "b": 1}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()  # drops whitespace
    assert length_bound(bpe) is None
    stripped = BackendTokenizer(models.BPE({"a": 0}, merges=[]))
    stripped.normalizer = normalizers.Strip()
    assert length_bound(stripped) is None
    plain = BackendTokenizer(models.BPE({"a": 0, "aa": 1}, merges=[("a", "a")]))
    plain.pre_tokenizer = pre_tokenizers.ByteLevel()
    bound = length_bound(plain)
    assert bound is not None and bound.chars_per_token == 2 and bound.compose_factor == 1
