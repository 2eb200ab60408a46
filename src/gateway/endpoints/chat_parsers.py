"""Which reasoning and tool-call parsers a chat request gets.

The model's own formats were settled when it was loaded (``--tool-call-parser``
/ ``--reasoning-parser``, ``auto`` by default: ``ModelEntry.tool_call_parser``
and ``reasoning_parser``); the request picks among them: ``tool_choice``
``none`` turns tool parsing off, ``required`` and named functions switch to the
JSON the decoding constraint forces, ``enable_thinking``/``thinking`` false and
``separate_reasoning`` false turn reasoning splitting off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.endpoints.parser_guard import GuardedReasoningParser, GuardedToolParser
from gateway.parsers.base import ReasoningParser, ToolCallParser
from gateway.parsers.constrained import tool_choice_constraint
from gateway.parsers.reasoning_tokens import ReasoningTokenCounter
from gateway.parsers.registry import (
    needs_special_tokens,
    reasoning_parser_for_request,
    tool_parser_for_choice,
)
from gateway.pipeline.catalog import ModelEntry
from gateway.protocol.chat import ChatCompletionRequest

_END_TAGS = {"kimi": "◁/think▷"}
_START_TAGS = {"kimi": "◁think▷"}


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
    think_start_id: int | None = None
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    keep_special_tokens: bool = False
    parallel_tool_calls: bool = True

    def new_reasoning(self, prompt_text: str) -> ReasoningParser | None:
        if not self.reasoning_enabled:
            return None
        parser = reasoning_parser_for_request(
            self.reasoning_parser,
            chat_template_kwargs=dict(self.chat_template_kwargs),
            separate_reasoning=self.separate_reasoning,
            prompt_text=prompt_text,
        )
        return GuardedReasoningParser(parser) if parser is not None else None

    def reasoning_counter(self, parser: ReasoningParser | None) -> ReasoningTokenCounter | None:
        """A counter of the reasoning tokens of the sample ``parser`` splits (None when
        no reasoning is split, or the model's think tags are not single tokens)."""
        if parser is None or self.think_end_id is None:
            return None
        opened = parser.starts_in_reasoning  # a GuardedReasoningParser answers for the one it wraps
        return ReasoningTokenCounter(self.think_start_id, self.think_end_id, starts_in_reasoning=opened)

    def new_tools(self) -> ToolCallParser | None:
        """auto: the model's own format; required/named: the JSON the constraint forces."""
        parser = tool_parser_for_choice(self.tool_choice, list(self.tools), self.tool_parser)
        return GuardedToolParser(parser) if parser is not None else None


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """``chat_template_kwargs`` plus ``reasoning_effort`` for templates that read it."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    return kwargs


# The choices of plain requests (no tools, tool_choice, chat_template_kwargs or
# reasoning_effort) by what they depend on: (id of the tokenizer, reasoning parser, tool-call
# parser, separate_reasoning, parallel_tool_calls) -> (that tokenizer, the choice). A few per
# model; cleared if ever this many.
_PLAIN: dict[tuple[int, str | None, str | None, bool, bool], tuple[object, ChatParsers]] = {}
_PLAIN_MAX = 64


def choose_parsers(entry: ModelEntry, req: ChatCompletionRequest) -> ChatParsers:
    """The model's parsers as this request needs them, with the decoding constraint
    that required and named tool choices call for.

    A plain request's choice depends on the model and two flags only: it is made once
    and shared (``ChatParsers`` is frozen; the parsers themselves are made per choice)."""
    if req.tools or req.tool_choice is not None or req.chat_template_kwargs or req.reasoning_effort is not None:
        return _choose(entry, req)
    tokenizer = entry.tokenizer
    key = (id(tokenizer), entry.reasoning_parser, entry.tool_call_parser, req.separate_reasoning, req.parallel_tool_calls)
    hit = _PLAIN.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    parsers = _choose(entry, req)
    if len(_PLAIN) >= _PLAIN_MAX:
        _PLAIN.clear()
    _PLAIN[key] = (tokenizer, parsers)
    return parsers


def _choose(entry: ModelEntry, req: ChatCompletionRequest) -> ChatParsers:
    kwargs = template_kwargs(req)
    enable_thinking = bool(kwargs.get("enable_thinking", kwargs.get("thinking", True)))
    reasoning_name = entry.reasoning_parser
    tools = tuple(req.tools_json())
    choice = req.tool_choice_json()
    constraint = (
        tool_choice_constraint(list(tools), choice, parallel_tool_calls=req.parallel_tool_calls)
        if tools
        else None
    )
    reasoning = reasoning_name is not None and enable_thinking and req.separate_reasoning
    tool_name = entry.tool_call_parser if choice == "auto" and tools else None
    end_tag = _END_TAGS.get(reasoning_name or "", "</think>")
    think_end_id = entry.tokenizer.token_id(end_tag) if reasoning_name else None
    start_tag = _START_TAGS.get(reasoning_name or "", "<think>")
    think_start_id = entry.tokenizer.token_id(start_tag) if reasoning_name else None
    # Think tags that are special tokens in this vocabulary must survive decoding too.
    special_tags = reasoning and think_end_id is not None and think_end_id in entry.tokenizer.special_token_ids
    return ChatParsers(
        reasoning_enabled=reasoning,
        enable_thinking=enable_thinking,
        separate_reasoning=req.separate_reasoning,
        tool_choice=choice,
        tools=tools,
        think_end_id=think_end_id,
        think_start_id=think_start_id,
        constraint=tuple(constraint) if constraint is not None else None,  # type: ignore[arg-type]
        reasoning_parser=reasoning_name,
        tool_parser=entry.tool_call_parser,
        chat_template_kwargs=tuple(kwargs.items()),
        keep_special_tokens=special_tags
        or needs_special_tokens(tool_name, reasoning_name if reasoning else None),
        parallel_tool_calls=req.parallel_tool_calls,
    )
