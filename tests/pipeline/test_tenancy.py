"""Cache isolation between tenants (pipeline/tenancy.py): the salt a request is cached
under, and the salt's token prefix (deterministic, ordinary vocabulary only, distinct
from the first token for different salts)."""

from __future__ import annotations

from functools import cache

from gateway.pipeline.tenancy import SALT_TOKENS, effective_salt, salt_prefix
from gateway.tokenization import Tokenizer
from tests.tokenization.helpers import qwen_files


@cache
def _qwen() -> Tokenizer:
    return Tokenizer.from_path(qwen_files())


class _TinyVocab:
    """A vocabulary of 6 ids where 0-3 are added tokens: only 4 and 5 may be used."""

    vocab_size = 6
    added_tokens = frozenset({0, 1, 2, 3})


def test_the_key_salt_and_the_request_salt_combine() -> None:
    assert effective_salt(None, None) is None
    assert effective_salt("key", None) == "key"
    assert effective_salt(None, "req") == "req"
    assert effective_salt("key", "req") == "key\x00req"
    assert effective_salt("key", "req") != effective_salt("keyreq", None)  # no concatenation collision
    assert effective_salt("", "") in ("", None)


def test_the_prefix_is_deterministic_and_differs_per_salt() -> None:
    tok = _qwen()
    a = salt_prefix("tenant-a", tok)
    assert len(a) == SALT_TOKENS and a == salt_prefix("tenant-a", tok)
    prefixes = {tuple(salt_prefix(f"tenant-{i}", tok)) for i in range(50)}
    assert len(prefixes) == 50
    firsts = {salt_prefix(f"tenant-{i}", tok)[0] for i in range(50)}
    assert len(firsts) > 45  # salts part from the very first token (radix trees cannot share)


def test_the_prefix_is_ordinary_vocabulary_never_special_tokens() -> None:
    tok = _qwen()
    for i in range(50):
        for token in salt_prefix(f"s{i}", tok):
            assert 0 <= token < tok.vocab_size and token not in tok.added_tokens
    tiny = salt_prefix("x", _TinyVocab())  # type: ignore[arg-type]
    assert len(tiny) == SALT_TOKENS and set(tiny) <= {4, 5}
