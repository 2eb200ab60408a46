"""Anthropic Messages request models: the blocks served, what is refused and how."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.protocol.errors import GatewayError
from gateway.protocol.messages import (
    CountTokensRequest,
    MessagesRequest,
    anthropic_error,
    anthropic_error_type,
)


def test_blocks_and_system_text() -> None:
    req = MessagesRequest.model_validate({
        "max_tokens": 5, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        ]}],
    })
    assert req.system_text() == "ab"
    block = req.messages[0].content[0]
    assert not isinstance(block, str) and block.plain_text() == "xy"


@pytest.mark.parametrize("body", [
    {"max_tokens": 5, "messages": []},  # no messages
    {"messages": [{"role": "user", "content": "x"}]},  # no max_tokens
    {"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
    {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},  # system is its own field
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
    {"max_tokens": 5, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]},  # Anthropic's range is 0-1
])
def test_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(body)


def test_count_tokens_needs_no_max_tokens() -> None:
    assert CountTokensRequest.model_validate({"messages": [{"role": "user", "content": "x"}]}).max_tokens == 1


def test_error_types() -> None:
    assert anthropic_error_type(413) == "request_too_large" and anthropic_error_type(418) == "api_error"
    assert anthropic_error(GatewayError("slow down", status=429)) == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}


@pytest.mark.parametrize("kind", [{"a": 1}, [1], 5, None])
def test_a_block_type_of_the_wrong_json_type_is_a_validation_error(kind: object) -> None:
    with pytest.raises(ValidationError, match="not supported"):
        MessagesRequest.model_validate({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": kind}]}]})


def test_a_messages_request_past_the_message_bound_is_refused() -> None:
    from gateway.protocol import limits

    over = [{"role": "user", "content": "hi"}] * (limits.MAX_MESSAGES + 1)
    with pytest.raises(ValidationError, match=f"at most {limits.MAX_MESSAGES} messages"):
        MessagesRequest.model_validate({"model": "m", "max_tokens": 4, "messages": over})
