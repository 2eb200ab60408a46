"""Cache isolation between tenants: ``cache_salt`` as a token prefix.

A prefix cache shared by every tenant is a side channel: a tenant who sees a fast
first token (or ``cached_tokens``) for a guessed prefix learns what another tenant
sent. vLLM's answer is ``cache_salt``: requests with different salts never share
cache blocks. SGLang's scheduler API has no salt field, so the gateway makes the
salt part of the token identity itself: a salted prompt starts with
``SALT_TOKENS`` ordinary vocabulary tokens derived from the salt (SHA-256), so two
salts differ from the very first token, and neither the policies' radix trees nor
the workers' radix caches can match across them. Requests with the same salt (or
none) share as before.

The cost, documented in docs/security.md: the worker and the model see those
tokens (``SALT_TOKENS`` more prompt tokens per request, counted in ``prompt_tokens``,
and a short meaningless preamble the model reads before the prompt).
"""

from __future__ import annotations

import hashlib

from gateway.tokenization import Tokenizer

SALT_TOKENS = 4
"""Prefix length: two salts collide on all four with odds of about 1 in vocab**4."""


def effective_salt(key_salt: str | None, request_salt: str | None) -> str | None:
    """The salt a request is cached under: its key's (``--cache-salt-per-key``) and its own, combined."""
    if key_salt and request_salt:
        return f"{key_salt}\x00{request_salt}"
    return key_salt or request_salt


def salt_prefix(salt: str, tokenizer: Tokenizer) -> list[int]:
    """``SALT_TOKENS`` ids derived from ``salt``, never special or added tokens."""
    added = tokenizer.added_tokens
    base = tokenizer.vocab_size
    out: list[int] = []
    counter = 0
    while len(out) < SALT_TOKENS:
        digest = hashlib.sha256(f"{counter}\x00{salt}".encode()).digest()
        counter += 1
        for i in range(0, len(digest) - 3, 4):
            token = int.from_bytes(digest[i : i + 4], "big") % base
            if token not in added and len(out) < SALT_TOKENS:
                out.append(token)
    return out
