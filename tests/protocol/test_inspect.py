"""``/admin/inspect``'s request (protocol/inspect.py): exactly one input, bounded prefix
settings, and the special-token default of the input kind."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol.errors import validation_error_to_gateway
from gateway.protocol.inspect import InspectRequest


def _error(body: dict[str, Any]) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as exc:
        InspectRequest.model_validate(body)
    err = validation_error_to_gateway(exc.value)
    return err.param, err.message


def test_each_input_kind_alone_is_accepted() -> None:
    assert InspectRequest.model_validate({"prompt": "hi"}).text == "hi"  # the completions alias
    assert InspectRequest.model_validate({"text": "hi"}).special_tokens is True
    chat = InspectRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert chat.special_tokens is False and chat.template_messages()[0]["content"] == "hi"
    ids = InspectRequest.model_validate({"input_ids": [1, 2], "pool": "prefill", "block_size": 16})
    assert (ids.input_ids, ids.pool, ids.block_size, ids.include_tokens) == ([1, 2], "prefill", 16, True)


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({}, "text", "exactly one of"),
        ({"text": "a", "input_ids": [1]}, "text", "exactly one of"),
        ({"messages": []}, "messages", "at least one message"),
        ({"input_ids": []}, "input_ids", "at least one token id"),
        ({"text": "a", "block_size": 0}, "block_size", "greater than or equal to 1"),
        ({"text": "a", "depth_tokens": 1 << 25}, "depth_tokens", "less than or equal to"),
        ({"text": "a", "pool": "gpu"}, "pool", "regular"),
    ],
)
def test_bad_requests_name_the_field(body: dict[str, Any], param: str, text: str) -> None:
    got_param, message = _error(body)
    assert got_param == param and text in message
