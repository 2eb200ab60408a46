"""Parser names, per-request construction, and defaults by model type.

Parsers keep per-choice state, so every lookup returns a fresh instance: the
pipeline builds one reasoning parser and one tool parser per generated choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.parsers.base import ReasoningParser, ToolCallParser
from gateway.parsers.constrained import NamedToolCallParser, RequiredToolCallParser
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.reasoning import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ThinkTagReasoningParser,
    prompt_opens_think_block,
)

REASONING_PARSERS: dict[str, type[ThinkTagReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek-r1": DeepSeekR1ReasoningParser,
}

TOOL_PARSERS: dict[str, Callable[..., ToolCallParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "qwen25": HermesToolParser,
    "qwen3": HermesToolParser,
}


def reasoning_parser_names() -> list[str]:
    return sorted(REASONING_PARSERS)


def tool_parser_names() -> list[str]:
    return sorted(TOOL_PARSERS)


def get_reasoning_parser(
    name: str,
    *,
    starts_in_reasoning: bool | None = None,
    enable_thinking: bool = True,
    separate_reasoning: bool = True,
) -> ReasoningParser:
    """A fresh reasoning parser; ``KeyError`` names the known parsers if ``name`` is unknown."""
    try:
        cls = REASONING_PARSERS[name]
    except KeyError:
        raise KeyError(
            f"unknown reasoning parser {name!r}; known: {', '.join(reasoning_parser_names())}"
        ) from None
    return cls(
        starts_in_reasoning=starts_in_reasoning,
        enable_thinking=enable_thinking,
        separate_reasoning=separate_reasoning,
    )


def get_tool_parser(name: str, *, tool_names: Iterable[str] | None = None) -> ToolCallParser:
    """A fresh tool-call parser (``tool_names`` restricts which functions count as calls)."""
    try:
        factory = TOOL_PARSERS[name]
    except KeyError:
        raise KeyError(
            f"unknown tool parser {name!r}; known: {', '.join(tool_parser_names())}"
        ) from None
    return factory(tool_names=tool_names)


def reasoning_parser_for_request(
    name: str | None,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    separate_reasoning: bool = True,
    prompt_text: str | None = None,
) -> ReasoningParser | None:
    """The reasoning parser for one chat choice, or None when the model has none.

    Thinking counts as disabled when the request's ``chat_template_kwargs`` set
    ``enable_thinking`` (Qwen3) or ``thinking`` (DeepSeek) to false. Given the
    rendered prompt, the parser starts inside the reasoning block when the
    template opened it.
    """
    if name is None:
        return None
    kwargs = chat_template_kwargs or {}
    enable = bool(kwargs.get("enable_thinking", kwargs.get("thinking", True)))
    opens = None if prompt_text is None else prompt_opens_think_block(prompt_text)
    return get_reasoning_parser(
        name,
        starts_in_reasoning=opens,
        enable_thinking=enable,
        separate_reasoning=separate_reasoning,
    )


def tool_parser_for_choice(
    tool_choice: str | Mapping[str, Any] | None,
    tools: Sequence[Mapping[str, Any]],
    default_parser: str | None,
) -> ToolCallParser | None:
    """The parser matching ``tool_choice`` for one choice (see ``constrained``):

    ``none`` (or no tools) -> None, no parsing; ``auto`` -> the model's own
    format parser (None when the model has none); ``required`` -> the JSON
    array parser; a named function -> the arguments-object parser.
    Pair it with ``tool_choice_constraint`` for the sampling constraint.
    """
    if isinstance(tool_choice, Mapping):
        return NamedToolCallParser(str(tool_choice["function"]["name"]))
    if tool_choice == "required":
        return RequiredToolCallParser()
    if tool_choice == "none" or not tools or default_parser is None:
        return None
    names = [str(t.get("function", t).get("name")) for t in tools]
    return get_tool_parser(default_parser, tool_names=names)


@dataclass(frozen=True, slots=True)
class ParserDefaults:
    reasoning: str | None = None
    tool: str | None = None


# model_type (from the model's config.json) -> default parsers.
_BY_MODEL_TYPE: dict[str, ParserDefaults] = {
    "qwen3": ParserDefaults("qwen3", "hermes"),
    "qwen3_moe": ParserDefaults("qwen3", "hermes"),
    "qwen3_next": ParserDefaults("qwen3", "hermes"),
    "qwen2": ParserDefaults(None, "hermes"),
    "qwen2_moe": ParserDefaults(None, "hermes"),
}


def default_parsers(model_type: str | None, model_name: str = "") -> ParserDefaults:
    """Parsers to use when the operator names none, from ``model_type`` and the model's name.

    Qwen3 models think in ``<think>`` tags and call tools in Hermes format;
    Qwen2/2.5 call tools the same way and QwQ (a Qwen2 model) also thinks;
    DeepSeek-R1 thinks. Anything else gets no parsers (plain content).
    """
    kind = (model_type or "").lower()
    name = model_name.lower()
    if kind.startswith("qwen2") and "qwq" in name:
        return ParserDefaults("qwen3", "hermes")
    if kind in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[kind]
    if kind.startswith("deepseek") and "r1" in name:
        return ParserDefaults("deepseek-r1", None)
    return ParserDefaults()
