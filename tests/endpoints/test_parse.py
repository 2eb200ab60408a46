"""One-shot parsing (endpoints/parse.py): known parsers only, tools handed to the parser,
and the reasoning parser's starting state taken from the request."""

from __future__ import annotations

import json

import pytest

from gateway.endpoints.parse import parse_reasoning, parse_tool_calls
from gateway.parsers.registry import NO_REASONING, reasoning_parser_names, tool_parser_names
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.parse import ParseReasoningRequest, ParseToolCallsRequest


def test_unknown_parsers_are_refused_listing_the_known_ones() -> None:
    with pytest.raises(InvalidRequestError, match="unknown tool-call parser 'nope'; known: ") as err:
        parse_tool_calls(ParseToolCallsRequest(text="x", parser="nope"))
    assert err.value.param == "parser" and all(name in err.value.message for name in tool_parser_names())
    with pytest.raises(InvalidRequestError, match="unknown reasoning parser"):
        parse_reasoning(ParseReasoningRequest(text="x", parser="nope"))


def test_tool_calls_are_split_from_the_content() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    out = parse_tool_calls(ParseToolCallsRequest(text=text, parser="qwen25"))
    assert out["content"] == "" and [(c["name"], json.loads(c["arguments"])) for c in out["tool_calls"]] == [("f", {"a": 1})]
    plain = parse_tool_calls(ParseToolCallsRequest(text="no calls here", parser="qwen25"))
    assert plain == {"content": "no calls here", "tool_calls": []}


def test_reasoning_is_split_and_the_start_state_can_be_given() -> None:
    assert parse_reasoning(ParseReasoningRequest(text="<think>a</think>b", parser="qwen3")) == {
        "reasoning_content": "a", "content": "b"}
    # a prompt that opened the think block: the text starts inside the reasoning
    opened = parse_reasoning(ParseReasoningRequest(text="a</think>b", parser="qwen3", starts_in_reasoning=True))
    assert opened == {"reasoning_content": "a", "content": "b"}
    closed = parse_reasoning(ParseReasoningRequest(text="a b", parser="qwen3", starts_in_reasoning=False))
    assert closed["content"] == "a b" and not closed["reasoning_content"]
    assert NO_REASONING in reasoning_parser_names()
    assert parse_reasoning(ParseReasoningRequest(text="<think>a</think>b", parser=NO_REASONING)) == {
        "reasoning_content": None, "content": "<think>a</think>b"}
