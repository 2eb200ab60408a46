"""``/parse/tool_calls`` and ``/parse/reasoning``: one-shot parsing of a text, no model involved."""

from __future__ import annotations

from typing import Any

from gateway.parsers.registry import (
    NO_REASONING,
    get_tool_parser,
    reasoning_parser_for_request,
    reasoning_parser_names,
    tool_parser_names,
)
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.parse import (
    ParsedToolCall,
    ParseReasoningRequest,
    ParseReasoningResponse,
    ParseToolCallsRequest,
    ParseToolCallsResponse,
)


def parse_tool_calls(req: ParseToolCallsRequest) -> dict[str, Any]:
    if req.parser not in tool_parser_names():
        raise InvalidRequestError(
            f"unknown tool-call parser {req.parser!r}; known: {', '.join(tool_parser_names())}",
            param="parser",
        )
    parser = get_tool_parser(req.parser, tools=req.tools_json())
    content, calls = parser.parse(req.text)
    return ParseToolCallsResponse(
        content=content,
        tool_calls=[ParsedToolCall(name=c.name, arguments=c.arguments) for c in calls],
    ).to_dict()


def parse_reasoning(req: ParseReasoningRequest) -> dict[str, Any]:
    if req.parser not in reasoning_parser_names():
        raise InvalidRequestError(
            f"unknown reasoning parser {req.parser!r}; known: {', '.join(reasoning_parser_names())}",
            param="parser",
        )
    if req.parser == NO_REASONING:
        return ParseReasoningResponse(reasoning_content=None, content=req.text).to_dict()
    parser = reasoning_parser_for_request(req.parser)
    assert parser is not None
    if req.starts_in_reasoning is not None:  # a parser that splits on no start tag ignores it
        parser.starts_in_reasoning = req.starts_in_reasoning
    reasoning, content = parser.parse(req.text)
    return ParseReasoningResponse(reasoning_content=reasoning, content=content).to_dict()
