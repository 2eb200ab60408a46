"""Which reasoning and tool-call parsers a chat request gets."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.parsers.base import ReasoningParser, ToolCallParser
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.reasoning import ThinkTagReasoningParser, prompt_opens_think_block
from gateway.protocol.chat import ChatCompletionRequest
from gateway.tokenization import Tokenizer


@dataclass(frozen=True)
class ChatParsers:
    """Factories for one request's per-choice parsers, plus what the worker must be told."""

    reasoning_enabled: bool
    enable_thinking: bool
    separate_reasoning: bool
    tool_names: tuple[str, ...] | None
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
        if self.tool_names is None:
            return None
        return HermesToolParser(self.tool_names)


def choose_parsers(tokenizer: Tokenizer, model_type: str, req: ChatCompletionRequest) -> ChatParsers:
    """Reasoning parsing for models whose vocabulary has think tags (Qwen3 and kin);
    Hermes-style tool calls when the request declares tools and does not say 'none'."""
    think_end = tokenizer.token_id("</think>")
    kwargs = req.chat_template_kwargs or {}
    enable_thinking = bool(kwargs.get("enable_thinking", True))
    reasoning = think_end is not None and tokenizer.token_id("<think>") is not None
    names: tuple[str, ...] | None = None
    if req.tools and req.effective_tool_choice != "none":
        names = tuple(t.function.name for t in req.tools)
    return ChatParsers(
        reasoning_enabled=reasoning and enable_thinking and req.separate_reasoning,
        enable_thinking=enable_thinking,
        separate_reasoning=req.separate_reasoning,
        tool_names=names,
        think_end_id=think_end,
    )
