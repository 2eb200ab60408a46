"""The one client-facing error tree (protocol/errors.py): statuses, OpenAI's body with all
four keys, and pydantic errors turned into one 400 that names the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError, model_validator

from gateway.protocol.errors import (
    ContextLengthExceededError,
    GatewayError,
    ModelNotFoundError,
    ParamError,
    QueueFullError,
    QueueTimeoutError,
    ShuttingDownError,
    format_param,
    validation_error_to_gateway,
)


class _Item(BaseModel):
    value: int


class _Body(BaseModel):
    prompt: str | list[int]
    items: list[_Item] = []
    n: int = 1

    @model_validator(mode="after")
    def _rule(self) -> _Body:
        if self.n == 7:
            raise ParamError("n", "seven is not allowed")
        return self


def _err(body: Any) -> GatewayError:
    with pytest.raises(ValidationError) as exc:
        _Body.model_validate(body)
    return validation_error_to_gateway(exc.value)


def test_the_body_always_has_all_four_keys() -> None:
    assert GatewayError("boom").to_dict() == {
        "error": {"message": "boom", "type": "internal_error", "param": None, "code": None}
    }
    err = ContextLengthExceededError("too long", param="messages")
    assert err.status == 400 and err.to_dict()["error"] == {
        "message": "too long", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
    }


def test_overrides_and_subclass_codes() -> None:
    err = GatewayError("x", status=418, type="teapot", code="short", retry_after=2.0)
    assert (err.status, err.type, err.code, err.retry_after) == (418, "teapot", "short", 2.0)
    assert GatewayError("y").status == 500  # the override is per instance
    assert "status=418" in repr(err) and "'teapot'" in repr(err)
    missing = ModelNotFoundError("gpt-x")
    assert (missing.status, missing.code, missing.param, missing.model) == (404, "model_not_found", "model", "gpt-x")
    assert "'gpt-x' does not exist" in missing.message
    assert (QueueFullError("q").status, QueueFullError("q").code) == (429, "queue_full")
    assert (QueueTimeoutError("q").status, ShuttingDownError("s").status) == (408, 503)


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("messages", 0, "content"), "messages.[0].content"),
        (("prompt", "list[int]", 2), "prompt.[2]"),
        (("body", "function-after[_rule()]", "n"), "body.n"),
        (("tool_choice", "NamedToolChoice", "function"), "tool_choice.function"),
        (("str",), None),
    ],
)
def test_params_read_as_openai_writes_them(loc: tuple[Any, ...], param: str | None) -> None:
    assert format_param(loc) == param


def test_a_union_field_gets_one_merged_message() -> None:
    err = _err({"prompt": 5})
    assert err.status == 400 and err.param == "prompt"
    assert err.message.startswith("Invalid 'prompt': ") and "; or " in err.message


def test_the_first_field_is_named_and_the_others_listed() -> None:
    err = _err({"prompt": "x", "items": [{"value": "a"}, {"value": "b"}], "n": "z"})
    assert err.param == "items.[0].value"
    assert "(also invalid: items.[1].value, n)" in err.message


def test_model_level_rules_name_their_field_and_lose_pydantics_prefix() -> None:
    err = _err({"prompt": "x", "n": 7})
    assert err.param == "n" and err.message == "Invalid 'n': seven is not allowed"


def test_a_body_that_is_not_an_object() -> None:
    err = _err([1, 2])
    assert err.param is None and err.message == "Invalid request body: the request body must be a JSON object"
