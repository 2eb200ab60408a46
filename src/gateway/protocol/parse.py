"""``POST /parse/tool_calls`` and ``POST /parse/reasoning``: run a parser over a model's text.

For operators debugging a model's output: paste what the model wrote, name a
parser, see what the gateway makes of it (SGLang's ``/parse_function_call`` and
``/separate_reasoning`` and SMG's parse endpoints offer the same).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.protocol import limits
from gateway.protocol.common import RequestModel, Tool
from gateway.protocol.responses import ResponseModel

MAX_PARSE_TEXT_CHARS = 1024 * 1024
"""Longest text a parse request may carry (model outputs are far shorter)."""


class ParseToolCallsRequest(RequestModel):
    text: str = Field(max_length=MAX_PARSE_TEXT_CHARS)
    parser: str = Field(min_length=1, max_length=64)
    tools: list[Tool] | None = Field(default=None, max_length=limits.MAX_TOOLS)

    def tools_json(self) -> list[dict[str, Any]] | None:
        if self.tools is None:
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]


class ParsedToolCall(ResponseModel):
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments


class ParseToolCallsResponse(ResponseModel):
    content: str
    tool_calls: list[ParsedToolCall]


class ParseReasoningRequest(RequestModel):
    text: str = Field(max_length=MAX_PARSE_TEXT_CHARS)
    parser: str = Field(min_length=1, max_length=64)
    starts_in_reasoning: bool | None = None  # the prompt opened the think block (default: the parser's)


class ParseReasoningResponse(ResponseModel):
    reasoning_content: str | None
    content: str

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()  # reasoning_content null is part of the answer
