"""Parser names and per-request construction (parsers/registry.py): SGLang's and SMG's
names as aliases, a fresh parser per choice, the parser tool_choice calls for, and the
reasoning parser's start state from the request and the prompt."""

from __future__ import annotations

import pytest

from gateway.parsers.constrained import NamedToolCallParser, RequiredToolCallParser
from gateway.parsers.harmony_reasoning import HarmonyReasoningParser
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.registry import (
    NO_REASONING,
    canonical_reasoning_parser,
    canonical_tool_parser,
    default_parsers,
    get_reasoning_parser,
    get_tool_parser,
    needs_special_tokens,
    reasoning_parser_for_request,
    reasoning_parser_names,
    tool_parser_for_choice,
    tool_parser_names,
)
from gateway.parsers.tool_calls.kimi import KimiK2ToolParser
from tests.parsers.tool_calls.common import TOOLS


def test_aliases_resolve_to_the_canonical_names() -> None:
    assert canonical_tool_parser("qwen25") == "hermes" and canonical_tool_parser("hermes") == "hermes"
    assert canonical_tool_parser("llama4") == "pythonic" and canonical_tool_parser("harmony") == "gpt-oss"
    assert canonical_reasoning_parser("deepseek_r1") == "deepseek-r1" and canonical_reasoning_parser(NO_REASONING) is None
    with pytest.raises(KeyError, match="unknown tool parser 'nope'; known: "):
        canonical_tool_parser("nope")
    with pytest.raises(KeyError, match="unknown reasoning parser"):
        get_reasoning_parser("nope")
    assert NO_REASONING in reasoning_parser_names() and tool_parser_names() == sorted(tool_parser_names())


def test_every_lookup_is_a_fresh_parser() -> None:
    a, b = get_tool_parser("kimi_k2"), get_tool_parser("kimi")
    assert isinstance(a, KimiK2ToolParser) and a is not b
    hermes = get_tool_parser("qwen", tools=TOOLS)
    assert isinstance(hermes, HermesToolParser)
    text = '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'
    assert hermes.parse(text) == (text, [])  # the request's tools restrict what counts as a call


def test_special_token_needs() -> None:
    assert needs_special_tokens("kimi_k2", None) and needs_special_tokens(None, "gpt-oss")
    assert not needs_special_tokens("hermes", "qwen3") and not needs_special_tokens(None, NO_REASONING)
    assert not needs_special_tokens(None, None)


def test_the_parser_tool_choice_calls_for() -> None:
    assert isinstance(tool_parser_for_choice({"function": {"name": "get_time"}}, TOOLS, "hermes"), NamedToolCallParser)
    assert isinstance(tool_parser_for_choice("required", TOOLS, None), RequiredToolCallParser)
    assert isinstance(tool_parser_for_choice("auto", TOOLS, "qwen25"), HermesToolParser)
    assert tool_parser_for_choice("none", TOOLS, "hermes") is None
    assert tool_parser_for_choice("auto", [], "hermes") is None
    assert tool_parser_for_choice("auto", TOOLS, None) is None  # the model has no format of its own


def test_reasoning_for_a_request() -> None:
    assert reasoning_parser_for_request(None) is None and reasoning_parser_for_request(NO_REASONING) is None
    # the prompt opened the think block: the answer starts inside the reasoning
    opened = reasoning_parser_for_request("qwen3", prompt_text="<|im_start|>assistant\n<think>\n")
    assert opened is not None and opened.parse("thoughts</think>answer") == ("thoughts", "answer")
    plain = reasoning_parser_for_request("qwen3", prompt_text="<|im_start|>assistant\n")
    assert plain is not None and plain.parse("answer only") == (None, "answer only")
    off = reasoning_parser_for_request("qwen3", chat_template_kwargs={"enable_thinking": False})
    assert off is not None and off.parse("<think>x</think>y") == (None, "<think>x</think>y")  # thinking disabled
    on = reasoning_parser_for_request("qwen3")
    assert on is not None and on.parse("<think>x</think>y") == ("x", "y")
    r1 = reasoning_parser_for_request("deepseek-r1")  # R1 always starts inside its reasoning
    assert r1 is not None and r1.parse("thinking</think>done") == ("thinking", "done")
    assert isinstance(reasoning_parser_for_request("gpt-oss"), HarmonyReasoningParser)


def test_defaults_from_the_model_type() -> None:
    qwen = default_parsers("qwen3", "Qwen/Qwen3-8B")
    assert canonical_tool_parser(qwen.tool or "") == "hermes" and qwen.reasoning is not None
    assert default_parsers(None) == default_parsers("")
