"""The parse endpoints' bodies (protocol/parse.py): bounded inputs, tools as the parsers
take them, and a reasoning answer that always carries ``reasoning_content``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.protocol import limits
from gateway.protocol.parse import (
    MAX_PARSE_TEXT_CHARS,
    ParsedToolCall,
    ParseReasoningRequest,
    ParseReasoningResponse,
    ParseToolCallsRequest,
    ParseToolCallsResponse,
)

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}


def test_tools_are_handed_to_the_parsers_as_plain_dicts_without_nulls() -> None:
    req = ParseToolCallsRequest.model_validate({"text": "x", "parser": "hermes", "tools": [TOOL]})
    tools = req.tools_json()
    assert tools is not None and tools[0]["function"]["name"] == "get_weather"
    assert "description" not in tools[0]["function"]  # unset fields are left out, not null
    assert ParseToolCallsRequest.model_validate({"text": "x", "parser": "hermes"}).tools_json() is None


@pytest.mark.parametrize(
    "body",
    [
        {"text": "x", "parser": ""},
        {"text": "x", "parser": "p" * 65},
        {"text": "x" * (MAX_PARSE_TEXT_CHARS + 1), "parser": "hermes"},
        {"text": "x", "parser": "hermes", "tools": [TOOL] * (limits.MAX_TOOLS + 1)},
    ],
)
def test_empty_or_oversized_inputs_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ParseToolCallsRequest.model_validate(body)


def test_reasoning_request_defaults_to_the_parser_and_answers_keep_null() -> None:
    assert ParseReasoningRequest.model_validate({"text": "a", "parser": "qwen3"}).starts_in_reasoning is None
    assert ParseReasoningResponse(reasoning_content=None, content="a").to_dict() == {"reasoning_content": None, "content": "a"}
    calls = ParseToolCallsResponse(content="", tool_calls=[ParsedToolCall(name="f", arguments='{"a": 1}')])
    assert calls.tool_calls[0].arguments == '{"a": 1}'
