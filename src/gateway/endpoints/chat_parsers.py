"""Which reasoning and tool-call parsers a chat request gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.parsers.base import ReasoningParser, ToolCallParser
from gateway.parsers.constrained import tool_choice_constraint
from gateway.parsers.reasoning import ThinkTagReasoningParser, prompt_opens_think_block
from gateway.parsers.registry import tool_parser_for_choice
from gateway.protocol.chat import ChatCompletionRequest
from gateway.tokenization import Tokenizer

# Qwen and Hermes-style models write <tool_call>{json}</tool_call>.
DEFAULT_TOOL_FORMAT = "hermes"


@dataclass(frozen=True)
class ChatParsers:
    """Factories for one request's per-choice parsers, plus what the worker must be told."""

    reasoning_enabled: bool
    enable_thinking: bool
    separate_reasoning: bool
    tool_choice: str | dict[str, Any]
    tools: tuple[dict[str, Any], ...]
    think_end_id: int | None
    constraint: tuple[str, str] | None = None

    def new_reasoning(self, prompt_text: str) -> ReasoningParser | None:
        if not self.reasoning_enabled:
            return None
        return ThinkTagReasoningParser(
            starts_in_reasoning=prompt_opens_think_block(prompt_text),
            enable_thinking=self.enable_thinking,
            separate_reasoning=self.separate_reasoning,
        )

    def new_tools(self) -> ToolCallParser | None:
        """auto: the model's own format; required/named: the JSON the constraint forces."""
        return tool_parser_for_choice(self.tool_choice, list(self.tools), DEFAULT_TOOL_FORMAT)


def choose_parsers(tokenizer: Tokenizer, model_type: str, req: ChatCompletionRequest) -> ChatParsers:
    """Reasoning parsing for models whose vocabulary has think tags (Qwen3 and kin);
    tool-call parsing per tool_choice, with the decoding constraint that required
    and named choices need."""
    think_end = tokenizer.token_id("</think>")
    kwargs = req.chat_template_kwargs or {}
    enable_thinking = bool(kwargs.get("enable_thinking", True))
    reasoning = think_end is not None and tokenizer.token_id("<think>") is not None
    tools = tuple(req.tools_json())
    choice = req.tool_choice_json()
    constraint = tool_choice_constraint(list(tools), choice, parallel_tool_calls=req.parallel_tool_calls) if tools else None
    return ChatParsers(
        reasoning_enabled=reasoning and enable_thinking and req.separate_reasoning,
        enable_thinking=enable_thinking,
        separate_reasoning=req.separate_reasoning,
        tool_choice=choice,
        tools=tools,
        think_end_id=think_end,
        constraint=tuple(constraint) if constraint is not None else None,  # type: ignore[arg-type]
    )
