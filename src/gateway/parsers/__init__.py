"""Reasoning and tool-call parsers: pure text in, structured (streamed) pieces out.

Per generated choice the pipeline runs the reasoning parser first and passes
only its *content* to the tool-call parser. Every parser has a one-shot
``parse(text)`` and a streaming ``feed(delta)`` + ``finish()``; for well-formed
output the streamed pieces concatenate to the one-shot result.
"""

from gateway.parsers.base import (
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolStreamDelta,
    new_tool_call_id,
)
from gateway.parsers.constrained import (
    NamedToolCallParser,
    RequiredToolCallParser,
    aggregate,
    tool_choice_constraint,
)
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.reasoning import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ThinkTagReasoningParser,
    prompt_opens_think_block,
)
from gateway.parsers.registry import (
    ParserDefaults,
    default_parsers,
    get_reasoning_parser,
    get_tool_parser,
    reasoning_parser_for_request,
    reasoning_parser_names,
    tool_parser_for_choice,
    tool_parser_names,
)

__all__ = [
    "DeepSeekR1ReasoningParser",
    "HermesToolParser",
    "NamedToolCallParser",
    "ParserDefaults",
    "Qwen3ReasoningParser",
    "ReasoningParser",
    "RequiredToolCallParser",
    "ThinkTagReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolStreamDelta",
    "aggregate",
    "default_parsers",
    "get_reasoning_parser",
    "get_tool_parser",
    "new_tool_call_id",
    "prompt_opens_think_block",
    "reasoning_parser_for_request",
    "reasoning_parser_names",
    "tool_choice_constraint",
    "tool_parser_for_choice",
    "tool_parser_names",
]
