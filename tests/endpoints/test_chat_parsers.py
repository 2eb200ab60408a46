"""How a chat request picks its parsers from the model's settled formats."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.endpoints.chat_parsers import choose_parsers, template_kwargs
from gateway.endpoints.parser_guard import GuardedToolParser
from gateway.parsers.constrained import NamedToolCallParser, RequiredToolCallParser
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.tool_calls import MistralToolParser
from gateway.pipeline.catalog import ModelEntry
from gateway.protocol.chat import ChatCompletionRequest
from gateway.tokenization import ChatPromptCache
from gateway.tokenization.tokenizer import Tokenizer
from tests.tokenization.helpers import copy_tokenizer, qwen_files

TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_path(copy_tokenizer(qwen_files(), tmp_path_factory.mktemp("qwen")))


def _entry(tok: Tokenizer, tool: str | None = "hermes", reasoning: str | None = "qwen3") -> ModelEntry:
    return ModelEntry(
        name="m", tokenizer=tok, tokenizer_source="test", max_context_length=4096,
        prompt_cache=ChatPromptCache(tok), tool_call_parser=tool, reasoning_parser=reasoning,
    )


def _inner(parser: object) -> object:
    assert isinstance(parser, GuardedToolParser)
    return parser.inner


def _req(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **kw})


def test_model_formats_and_tool_choice(tokenizer: Tokenizer) -> None:
    auto = choose_parsers(_entry(tokenizer), _req(tools=TOOLS))
    assert isinstance(_inner(auto.new_tools()), HermesToolParser) and auto.reasoning_enabled
    assert not auto.keep_special_tokens and auto.think_end_id == tokenizer.token_id("</think>")
    assert choose_parsers(_entry(tokenizer), _req(tools=TOOLS, tool_choice="none")).new_tools() is None
    assert choose_parsers(_entry(tokenizer), _req()).new_tools() is None
    required = choose_parsers(_entry(tokenizer), _req(tools=TOOLS, tool_choice="required"))
    assert isinstance(_inner(required.new_tools()), RequiredToolCallParser) and required.constraint is not None
    named = choose_parsers(_entry(tokenizer), _req(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "b"}}))
    assert isinstance(_inner(named.new_tools()), NamedToolCallParser)
    mistral = choose_parsers(_entry(tokenizer, "mistral", None), _req(tools=TOOLS))
    assert isinstance(_inner(mistral.new_tools()), MistralToolParser) and mistral.keep_special_tokens
    assert not mistral.reasoning_enabled and mistral.new_reasoning("") is None
    # special tokens are kept only when a format parser will actually run
    assert not choose_parsers(_entry(tokenizer, "mistral", None), _req()).keep_special_tokens


def test_allowed_tools_and_parallel_calls(tokenizer: Tokenizer) -> None:
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "b"}}]}}
    chosen = choose_parsers(_entry(tokenizer), _req(tools=TOOLS, tool_choice=allowed, parallel_tool_calls=False))
    assert [t["function"]["name"] for t in chosen.tools] == ["b"]
    assert chosen.tool_choice == "required" and not chosen.parallel_tool_calls
    assert chosen.constraint is not None and '"maxItems": 1' in chosen.constraint[1] and '"a"' not in chosen.constraint[1]


def test_thinking_switches_and_template_inputs(tokenizer: Tokenizer) -> None:
    off = choose_parsers(_entry(tokenizer), _req(chat_template_kwargs={"enable_thinking": False}))
    assert not off.reasoning_enabled and off.new_reasoning("") is None
    assert not choose_parsers(_entry(tokenizer), _req(separate_reasoning=False)).reasoning_enabled
    opened = choose_parsers(_entry(tokenizer), _req()).new_reasoning("<|im_start|>assistant\n<think>\n")
    assert opened is not None and opened.parse("why</think>so") == ("why", "so")
    assert template_kwargs(_req(reasoning_effort="low", chat_template_kwargs={"x": 1})) == {"x": 1, "reasoning_effort": "low"}
    assert template_kwargs(_req(reasoning_effort="low", chat_template_kwargs={"reasoning_effort": "high"})) == {"reasoning_effort": "high"}




def test_plain_requests_share_one_choice_per_model_and_flags(tokenizer: Tokenizer) -> None:
    """No tools, tool_choice, template kwargs or reasoning effort: the choice depends on the
    model's parsers and two flags only, so it is made once; anything else is chosen afresh."""
    entry = _entry(tokenizer)
    plain = choose_parsers(entry, _req())
    assert choose_parsers(_entry(tokenizer), _req(chat_template_kwargs={})) is plain
    assert plain.reasoning_enabled and plain.think_end_id == tokenizer.token_id("</think>") and plain.tool_choice == "none"
    assert choose_parsers(entry, _req(separate_reasoning=False)) is not plain
    assert not choose_parsers(entry, _req(separate_reasoning=False)).reasoning_enabled
    assert choose_parsers(entry, _req(parallel_tool_calls=False)).parallel_tool_calls is False
    assert choose_parsers(_entry(tokenizer, reasoning=None), _req()).reasoning_enabled is False
    assert choose_parsers(entry, _req(chat_template_kwargs={"enable_thinking": False})).reasoning_enabled is False
    assert choose_parsers(entry, _req(reasoning_effort="low")) is not plain
    other = Tokenizer.from_path(tokenizer.path)
    assert choose_parsers(_entry(other), _req()) is not plain
