"""Responses and Conversations request models: input items, tools, what is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.protocol.limits import MAX_INPUT_ITEMS
from gateway.protocol.responses_api import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    ResponsesRequest,
)


def test_input_forms() -> None:
    assert ResponsesRequest.model_validate({"input": "hi"}).input_items() == [{"type": "message", "role": "user", "content": "hi"}]
    assert ResponsesRequest.model_validate({"input": ""}).input_items() == []
    items = ResponsesRequest.model_validate({"input": [{"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "c", "output": "o"}]})
    assert [i["type"] for i in items.input_items()] == ["message", "function_call_output"]  # a bare message gets its type
    assert ResponsesRequest.model_validate({"input": "x", "conversation": {"id": "conv_1"}}).conversation_id == "conv_1"
    assert ResponsesRequest.model_validate({"input": "x", "conversation": "conv_2"}).conversation_id == "conv_2"


def test_tools() -> None:
    req = ResponsesRequest.model_validate({"input": "x", "tools": [
        {"type": "function", "name": "f"},
        {"type": "mcp", "server_label": "s", "server_url": "http://127.0.0.1/mcp", "allowed_tools": {"tool_names": ["a"]}},
    ]})
    assert req.tools is not None and req.tools[1].allowed_names() == ["a"]


@pytest.mark.parametrize("body", [
    {"input": [{"type": "message", "role": "robot", "content": "x"}]},
    {"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
    {"input": [{"type": "function_call", "name": "f"}]},  # no call_id
    {"input": [{"type": "file_search_call"}]},
    {"input": "x", "tools": [{"type": "web_search"}]},
    {"input": "x", "tools": [{"type": "mcp", "server_url": "http://h/mcp"}]},  # no server_label
    {"input": "x", "tools": [{"type": "mcp", "server_label": "s", "server_url": "http://h/mcp", "require_approval": "always"}]},
    {"input": "x", "previous_response_id": "r", "conversation": "c"},
    {"input": "x", "max_output_tokens": 0},
])
def test_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate(body)


def test_conversation_bodies() -> None:
    assert ConversationCreate.model_validate({}).items is None
    assert ConversationUpdate.model_validate({"metadata": None}).metadata == {}  # null clears it
    with pytest.raises(ValidationError):
        ItemsCreate.model_validate({"items": []})
    with pytest.raises(ValidationError):
        ConversationCreate.model_validate({"items": [{"type": "message", "role": "user", "content": "x"}] * 21})


@pytest.mark.parametrize("item", [{"type": {"a": 1}}, {"type": [1]}, {"role": {"a": 1}, "content": "x"}, {"role": ["user"], "content": "x"}])
def test_fields_of_the_wrong_json_type_are_validation_errors(item: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ResponsesRequest.model_validate({"input": [item]})


def test_input_items_are_counted_before_any_is_validated() -> None:
    item = {"role": "user", "content": "hi"}
    assert len(ResponsesRequest(input=[item] * MAX_INPUT_ITEMS).input) == MAX_INPUT_ITEMS
    with pytest.raises(ValidationError, match=f"input may hold at most {MAX_INPUT_ITEMS} items"):
        ResponsesRequest(input=[item] * (MAX_INPUT_ITEMS + 1))
    with pytest.raises(ValidationError, match="at most"):  # counted before the items: a list of anything
        ResponsesRequest(input=[7] * (MAX_INPUT_ITEMS + 1))
