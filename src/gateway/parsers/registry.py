"""Parser names, per-request construction, and the choice of parsers for a model.

Names: each format has the gateway's own name plus the names SGLang
(``--tool-call-parser`` / ``--reasoning-parser``) and SMG use for it, so
operators keep their flags. Parsers keep per-choice state, so every lookup
returns a fresh instance: one reasoning parser and one tool parser per choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.parsers.base import ReasoningParser, ToolCallParser
from gateway.parsers.constrained import NamedToolCallParser, RequiredToolCallParser
from gateway.parsers.harmony_reasoning import HarmonyReasoningParser
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.reasoning import (
    DeepSeekR1ReasoningParser,
    KimiReasoningParser,
    MiniMaxAppendThinkReasoningParser,
    Qwen3ReasoningParser,
    ThinkingModelReasoningParser,
    ThinkTagReasoningParser,
    prompt_opens_think_block,
)
from gateway.parsers.tool_calls import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    DeepSeekV32ToolParser,
    Glm45ToolParser,
    Glm47ToolParser,
    HarmonyToolParser,
    JsonToolParser,
    KimiK2ToolParser,
    LlamaJsonToolParser,
    MiniMaxM2ToolParser,
    MistralToolParser,
    PassthroughToolParser,
    PythonicToolParser,
    Qwen3CoderToolParser,
)

ToolFactory = Callable[..., ToolCallParser]
ReasoningFactory = Callable[..., ReasoningParser]

# name -> class; the first name of each group is the gateway's canonical one.
TOOL_PARSER_GROUPS: dict[str, tuple[ToolFactory, tuple[str, ...]]] = {
    "hermes": (HermesToolParser, ("qwen", "qwen25", "qwen2_5", "qwen3", "qwen2")),
    "qwen3_coder": (Qwen3CoderToolParser, ("qwen_coder", "qwen3-coder", "qwen3_xml")),
    "llama3": (LlamaJsonToolParser, ("llama", "llama31", "llama32", "llama3_json")),
    "pythonic": (PythonicToolParser, ("llama4", "llama4_pythonic")),
    "mistral": (MistralToolParser, ()),
    "deepseekv3": (DeepSeekV3ToolParser, ("deepseek", "deepseek_v3", "deepseekr1")),
    "deepseekv31": (DeepSeekV31ToolParser, ("deepseek31", "deepseek_v31")),
    "deepseekv32": (DeepSeekV32ToolParser, ("deepseek32", "deepseek_v32")),
    "kimi_k2": (KimiK2ToolParser, ("kimik2", "kimi")),
    "glm45": (Glm45ToolParser, ("glm45_moe", "glm4_moe", "glm4", "glm")),
    "glm47": (Glm47ToolParser, ("glm47_moe",)),
    "minimax-m2": (MiniMaxM2ToolParser, ("minimax_m2", "minimax")),
    "gpt-oss": (HarmonyToolParser, ("gpt_oss", "harmony")),
    "json": (JsonToolParser, ()),
    "passthrough": (PassthroughToolParser, ()),
}

REASONING_PARSER_GROUPS: dict[str, tuple[ReasoningFactory, tuple[str, ...]]] = {
    "qwen3": (Qwen3ReasoningParser, ("qwen", "deepseek-v3", "deepseek_v3", "deepseek-v31")),
    "qwen3-thinking": (ThinkingModelReasoningParser, ("qwen3_thinking",)),
    "deepseek-r1": (DeepSeekR1ReasoningParser, ("deepseek_r1", "step3", "kimi_k2")),
    "kimi": (KimiReasoningParser, ()),
    "glm45": (Qwen3ReasoningParser, ("glm45_moe", "glm4_moe", "glm47")),
    "minimax": (ThinkingModelReasoningParser, ("minimax_m2", "minimax-m2")),
    "minimax-append-think": (MiniMaxAppendThinkReasoningParser, ("minimax_append_think",)),
    "gpt-oss": (HarmonyReasoningParser, ("gpt_oss", "harmony")),
}

NO_REASONING = "none"

TOOL_PARSERS: dict[str, ToolFactory] = {
    alias: cls for name, (cls, aliases) in TOOL_PARSER_GROUPS.items() for alias in (name, *aliases)
}
REASONING_PARSERS: dict[str, ReasoningFactory] = {
    alias: cls
    for name, (cls, aliases) in REASONING_PARSER_GROUPS.items()
    for alias in (name, *aliases)
}


def reasoning_parser_names() -> list[str]:
    """Every accepted reasoning parser name (aliases included), plus ``none``."""
    return sorted([*REASONING_PARSERS, NO_REASONING])


def tool_parser_names() -> list[str]:
    return sorted(TOOL_PARSERS)


def canonical_tool_parser(name: str) -> str:
    """The gateway's own name for a tool parser name or alias (KeyError if unknown)."""
    cls = _tool_factory(name)
    return next(n for n, (c, aliases) in TOOL_PARSER_GROUPS.items() if name in (n, *aliases) or c is cls)


def canonical_reasoning_parser(name: str) -> str | None:
    if name == NO_REASONING:
        return None
    _reasoning_factory(name)
    return next(n for n, (_, aliases) in REASONING_PARSER_GROUPS.items() if name in (n, *aliases))


def _tool_factory(name: str) -> ToolFactory:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise KeyError(
            f"unknown tool parser {name!r}; known: {', '.join(tool_parser_names())}"
        ) from None


def _reasoning_factory(name: str) -> ReasoningFactory:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise KeyError(
            f"unknown reasoning parser {name!r}; known: {', '.join(reasoning_parser_names())}"
        ) from None


def needs_special_tokens(tool_parser: str | None, reasoning_parser: str | None) -> bool:
    """Whether these parsers read markers that are special tokens (decode keeping them)."""
    needs = False
    if tool_parser is not None:
        needs |= bool(getattr(_tool_factory(tool_parser), "needs_special_tokens", False))
    if reasoning_parser is not None and reasoning_parser != NO_REASONING:
        needs |= _reasoning_factory(reasoning_parser) is HarmonyReasoningParser
    return needs


def get_reasoning_parser(
    name: str,
    *,
    starts_in_reasoning: bool | None = None,
    enable_thinking: bool = True,
    separate_reasoning: bool = True,
) -> ReasoningParser:
    """A fresh reasoning parser; ``KeyError`` names the known parsers if ``name`` is unknown."""
    cls = _reasoning_factory(name)
    return cls(
        starts_in_reasoning=starts_in_reasoning,
        enable_thinking=enable_thinking,
        separate_reasoning=separate_reasoning,
    )


def get_tool_parser(
    name: str,
    *,
    tool_names: Iterable[str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ToolCallParser:
    """A fresh tool-call parser. ``tools`` (OpenAI tool dicts) restrict which functions
    count as calls and type XML-style argument values by their schemas."""
    factory = _tool_factory(name)
    if factory is HermesToolParser:
        names = tool_names if tools is None else [str(_fn(t).get("name")) for t in tools]
        return HermesToolParser(tool_names=names)
    return factory(tool_names, tools=tools)


def _fn(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function", tool)
    return fn if isinstance(fn, Mapping) else {}


def reasoning_parser_for_request(
    name: str | None,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    separate_reasoning: bool = True,
    prompt_text: str | None = None,
) -> ReasoningParser | None:
    """The reasoning parser for one chat choice, or None when the model has none.

    Thinking counts as disabled when the request's ``chat_template_kwargs`` set
    ``enable_thinking`` (Qwen3, GLM) or ``thinking`` (DeepSeek V3.1) to false.
    The parser starts inside the reasoning block when the parser's model always
    does (DeepSeek-R1, thinking-only models) or the rendered prompt opened it.
    """
    if name is None or name == NO_REASONING:
        return None
    kwargs = chat_template_kwargs or {}
    enable = bool(kwargs.get("enable_thinking", kwargs.get("thinking", True)))
    cls = _reasoning_factory(name)
    opens = prompt_text is not None and prompt_opens_think_block(
        prompt_text, getattr(cls, "start_tag", "<think>")
    )
    default = bool(getattr(cls, "default_starts_in_reasoning", False))
    return get_reasoning_parser(
        name,
        starts_in_reasoning=default or opens,
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
    return get_tool_parser(default_parser, tools=tools)


@dataclass(frozen=True, slots=True)
class ParserDefaults:
    reasoning: str | None = None
    tool: str | None = None


def default_parsers(model_type: str | None, model_name: str = "") -> ParserDefaults:
    """Parsers from ``model_type`` and the model's name alone (no template at hand);
    ``detect.detect_parsers`` also reads the chat template and vocabulary."""
    from gateway.parsers.detect import ModelFacts, detect_parsers

    found = detect_parsers(ModelFacts(model_type=model_type or "", name=model_name))
    return ParserDefaults(found.reasoning, found.tool)


__all__ = [
    "NO_REASONING",
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ParserDefaults",
    "ThinkTagReasoningParser",
    "canonical_reasoning_parser",
    "canonical_tool_parser",
    "default_parsers",
    "get_reasoning_parser",
    "get_tool_parser",
    "needs_special_tokens",
    "reasoning_parser_for_request",
    "reasoning_parser_names",
    "tool_parser_for_choice",
    "tool_parser_names",
]
