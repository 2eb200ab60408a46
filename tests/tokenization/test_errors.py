"""The tokenization layer's errors (tokenization/errors.py): one base class to catch, and a
not-found error that lists every place looked and why each failed."""

from __future__ import annotations

import pytest

from gateway.tokenization.errors import (
    Attempt,
    ChatTemplateError,
    TokenizationError,
    TokenizerArchiveError,
    TokenizerLoadError,
    TokenizerNotFound,
)


def test_not_found_lists_every_attempt_in_order() -> None:
    attempts = [Attempt("path", "/models/x", "no tokenizer.json"), Attempt("worker", "grpc://w:1", "UNIMPLEMENTED")]
    err = TokenizerNotFound("org/model", attempts)
    assert err.model == "org/model" and err.attempts == tuple(attempts)
    assert str(err) == (
        "no tokenizer found for model 'org/model'; tried:\n"
        "  - path (/models/x): no tokenizer.json\n"
        "  - worker (grpc://w:1): UNIMPLEMENTED"
    )


def test_not_found_with_nothing_tried_says_so() -> None:
    assert str(TokenizerNotFound("m", [])).endswith("tried:\n  (nothing was tried)")


@pytest.mark.parametrize("kind", [TokenizerNotFound, TokenizerLoadError, TokenizerArchiveError, ChatTemplateError])
def test_every_error_is_a_tokenization_error(kind: type[Exception]) -> None:
    err = kind("m", []) if kind is TokenizerNotFound else kind("bad")
    with pytest.raises(TokenizationError):
        raise err


def test_an_attempt_is_a_value() -> None:
    a = Attempt("hub", "org/m", "offline")
    assert a == Attempt("hub", "org/m", "offline") and str(a) == "hub (org/m): offline"
    with pytest.raises(AttributeError):
        a.reason = "other"  # type: ignore[misc]
