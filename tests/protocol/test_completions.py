"""``/v1/completions``' request (protocol/completions.py): the four prompt shapes with one
clear error, the batch they make, and the options the gateway refuses rather than ignore."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol.completions import (
    CompletionRequest,
    are_token_ids,
    check_token_or_text_input,
    prompt_batch,
)
from gateway.protocol.errors import validation_error_to_gateway


@pytest.mark.parametrize(
    ("prompt", "batch"),
    [
        ("hi", ["hi"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_each_prompt_shape_is_a_batch(prompt: Any, batch: list[Any]) -> None:
    assert check_token_or_text_input(prompt, "prompt") is prompt
    assert prompt_batch(prompt) == batch
    assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompts() == batch


@pytest.mark.parametrize(
    "bad", [[], None, 5, [1, "a"], [[]], [[1], []], [-1], [True, False], [[1, -2]], [1.5], {"text": "x"}],
)
def test_other_shapes_get_one_readable_error(bad: Any) -> None:
    with pytest.raises(ValueError, match="prompt must be a string, a list of strings"):
        check_token_or_text_input(bad, "prompt")
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"model": "m", "prompt": bad})
    err = validation_error_to_gateway(exc.value)
    assert err.param == "prompt" and "; or" not in err.message  # one message, not one per union member


def test_defaults_are_openais() -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x"})
    assert (req.max_tokens, req.echo, req.logprobs, req.suffix, req.best_of) == (16, False, None, None, None)


@pytest.mark.parametrize(
    ("fields", "param", "text"),
    [
        ({"suffix": "tail"}, "suffix", "fill-in-the-middle"),
        ({"best_of": 3}, "best_of", "may only equal n"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens", "must not exceed"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": "5"}, "max_tokens", "integer"),
        ({"logprobs": 6}, "logprobs", "less than or equal to 5"),
    ],
)
def test_what_cannot_be_honoured_is_refused(fields: dict[str, Any], param: str, text: str) -> None:
    with pytest.raises(ValidationError) as exc:
        CompletionRequest.model_validate({"model": "m", "prompt": "x", **fields})
    err = validation_error_to_gateway(exc.value)
    assert err.param == param and text in err.message


def test_best_of_equal_to_n_and_an_empty_suffix_are_fine() -> None:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "n": 2, "best_of": 2, "suffix": ""})
    assert req.best_of == 2 and req.suffix is None
    # an explicit null means "the default", as OpenAI treats it
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x", "max_tokens": None}).max_tokens == 16


def test_a_token_id_prompt_is_checked_once_and_kept_as_sent() -> None:
    ids = list(range(100_000))
    assert CompletionRequest.model_validate({"model": "m", "prompt": ids}).prompt is ids  # no second pass, no copy
    batch = [[1, 2], [3]]
    assert CompletionRequest.model_validate({"model": "m", "prompt": batch}).prompt is batch
    for bad in ([1, True], [1, -1], [1, 2.0], [[1], [True]], [[1], []], [1, "a"], [[1], 2]):
        with pytest.raises(ValidationError, match="token ids are non-negative integers"):
            CompletionRequest.model_validate({"model": "m", "prompt": bad})


def test_are_token_ids_refuses_bools_floats_and_negatives() -> None:
    assert are_token_ids([0, 5, 151_643])
    assert not are_token_ids([0, True])
    assert not are_token_ids([1.0])
    assert not are_token_ids([3, -1])
