"""Parsers against published chat templates kept as fixtures.

Llama 3.2 and Llama 3.1 JSON, Llama 4 pythonic, gpt-oss (Harmony) and Qwen3-Coder.

For models whose chat template no PyPI package ships, the template text is kept
in ``tests/parsers/fixtures/`` (``fixtures/README.md`` names each file's source
repository, path and commit). Each test renders a conversation with a tool call
and a tool result through the gateway's own ``ChatTemplate`` and checks that the
format's parser reads the call the template writes (or, where the template's
history rendering is not the format it tells the model to use, the instructed
format) back to the same name and arguments, whole and split at every character.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.parsers.detect import ModelFacts, detect_parsers
from gateway.parsers.registry import (
    get_tool_parser,
    needs_special_tokens,
    reasoning_parser_for_request,
)
from gateway.tokenization.chat_template import ChatTemplate
from tests.parsers.split_check import assert_reasoning_split_invariant, assert_tool_split_invariant

FIXTURES = Path(__file__).parent / "fixtures"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
USER = {"role": "user", "content": "Weather in Paris?"}
CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
EXPECTED = [("get_weather", {"city": "Paris", "days": 3})]


def _template(name: str, **special: str) -> ChatTemplate:
    return ChatTemplate((FIXTURES / name).read_text(encoding="utf-8"), special)


def _between(text: str, start: str, end: str) -> str:
    """The text after the last ``start`` that precedes the first ``end``."""
    stop = text.index(end)
    return text[text.rindex(start, 0, stop) + len(start) : stop]


# Llama 3.2 3B's own template (as llama.cpp keeps it) and vLLM's Llama 3.1 JSON one;
# the tool result turn each writes.
LLAMA3_TEMPLATES = {
    "llama3.2-3b-instruct.jinja": '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|>',
    "llama3.1-json-vllm.jinja": '<|start_header_id|>ipython<|end_header_id|>\n\n{"output": "sunny"}<|eot_id|>',
}


@pytest.mark.parametrize("name", list(LLAMA3_TEMPLATES))
def test_llama3_json_template_call_parses_back(name: str) -> None:
    tpl = _template(name, bos_token="<|begin_of_text|>")
    rendered = tpl.render([USER, CALL, RESULT], tools=TOOLS, add_generation_prompt=True)
    # The tool result goes back as an ipython turn, after the call.
    assert LLAMA3_TEMPLATES[name] in rendered
    text = _between(rendered, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|><|start_header_id|>ipython")
    assert text == '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}'
    # Neither template has <|python_tag|>; Llama's config.json model_type decides.
    found = detect_parsers(ModelFacts(model_type="llama", name="meta-llama/Llama-3.2-3B-Instruct", template=tpl.source))
    assert found.tool == "llama3", found.why
    assert assert_tool_split_invariant(lambda: get_tool_parser("llama3", tools=TOOLS), text) == ("", EXPECTED)


def test_llama4_pythonic_template_instructed_call_parses_back() -> None:
    tpl = _template("llama4-pythonic-vllm.jinja", bos_token="<|begin_of_text|>")
    prompt = tpl.render([USER], tools=TOOLS, add_generation_prompt=True)
    assert "[func_name1(params_name1=params_value1, params_name2=params_value2, ...), ...]" in prompt
    found = detect_parsers(ModelFacts(model_type="llama4", name="meta-llama/Llama-4-Scout-17B-16E-Instruct", template=tpl.source))
    assert found.tool == "pythonic", found.why
    # The format the template tells the model to answer in.
    text = '[get_weather(city="Paris", days=3)]'
    assert assert_tool_split_invariant(lambda: get_tool_parser("pythonic", tools=TOOLS), text) == ("", EXPECTED)


def test_llama4_pythonic_template_history_rendering_is_not_the_instructed_format() -> None:
    """The template writes past calls without brackets and with string values unquoted
    (``"%s" | format(value)``): not Python, so the parser keeps it as content, whole."""
    tpl = _template("llama4-pythonic-vllm.jinja", bos_token="<|begin_of_text|>")
    rendered = tpl.render([USER, CALL, RESULT], tools=TOOLS, add_generation_prompt=True)
    assert '<|header_start|>ipython<|header_end|>\n\n"sunny"<|eom|>' in rendered
    text = _between(rendered, "<|header_start|>assistant<|header_end|>\n\n", "<|eom|>")
    assert text == "get_weather(city=Paris, days=3)"
    assert assert_tool_split_invariant(lambda: get_tool_parser("pythonic", tools=TOOLS), text) == (text, [])


def test_gpt_oss_template_call_parses_back() -> None:
    tpl = _template("gpt-oss-120b.jinja")
    found = detect_parsers(ModelFacts(name="openai/gpt-oss-120b", template=tpl.source))
    assert (found.tool, found.reasoning) == ("gpt-oss", "gpt-oss"), found.why
    assert needs_special_tokens("gpt-oss", "gpt-oss")
    rendered = tpl.render([USER, CALL, RESULT], tools=TOOLS, add_generation_prompt=True)
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>' in rendered
    assert rendered.endswith("<|start|>assistant")
    # What the model writes after the generation prompt ``<|start|>assistant``.
    text = _between(rendered, "<|start|>assistant", "<|start|>functions.get_weather")
    assert text == ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", "days": 3}<|call|>'
    assert assert_tool_split_invariant(lambda: get_tool_parser("gpt-oss", tools=TOOLS), text) == ("", EXPECTED)


def test_gpt_oss_template_call_after_analysis_parses_back() -> None:
    """A call with its chain of thought (the ``thinking`` field, kept when no final answer
    follows): the reasoning parser takes the analysis channel, the tool parser the call."""
    tpl = _template("gpt-oss-120b.jinja")
    thinking = {**CALL, "thinking": "Need the forecast."}
    rendered = tpl.render([USER, thinking, RESULT], tools=TOOLS, add_generation_prompt=True)
    start = rendered.index("<|start|>assistant<|channel|>analysis") + len("<|start|>assistant")
    text = rendered[start : rendered.index("<|call|>") + len("<|call|>")]

    def reasoner() -> Any:
        parser = reasoning_parser_for_request("gpt-oss")
        assert parser is not None
        return parser

    reasoning, rest = assert_reasoning_split_invariant(reasoner, text)
    assert reasoning == "Need the forecast."
    assert assert_tool_split_invariant(lambda: get_tool_parser("gpt-oss", tools=TOOLS), rest) == ("", EXPECTED)


def test_qwen3_coder_template_call_parses_back() -> None:
    tpl = _template("qwen3-coder-vllm.jinja")
    found = detect_parsers(ModelFacts(name="Qwen/Qwen3-Coder-30B-A3B-Instruct", template=tpl.source))
    assert found.tool == "qwen3_coder", found.why
    rendered = tpl.render([USER, CALL, RESULT], tools=TOOLS, add_generation_prompt=True)
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<|im_end|>\n" in rendered
    text = _between(rendered, "<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n<tool_response>")
    assert text == "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    # days comes back as a number: the value is typed by the tool's schema.
    assert assert_tool_split_invariant(lambda: get_tool_parser("qwen3_coder", tools=TOOLS), text) == ("", EXPECTED)
