"""Every tool-call format: published examples, whole vs split at every boundary, malformed -> content.

Examples follow each model's chat template / model card (sources named per case).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.parsers.constrained import aggregate
from gateway.parsers.registry import get_tool_parser, tool_parser_names
from tests.parsers.split_check import (
    assert_tool_split_invariant,
    random_splits,
    run_tool_stream,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]

PARIS = ("get_weather", {"city": "Paris", "days": 3})
CET = ("get_time", {"zone": "CET"})

# (parser name, model output, expected content, expected calls)
CASES: list[tuple[str, str, str, list[tuple[str, Any]]]] = [
    # Qwen2.5 / Qwen3 / Hermes 2 Pro templates: <tool_call>\n{json}\n</tool_call>
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>', "Sure.", [PARIS, CET]),
    # Qwen3-Coder chat template (parameters on their own lines)
    ("qwen3_coder", "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>", "Let me check.", [PARIS, CET]),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n</tool_call>", "", [("get_weather", {"city": "New\nYork", "metric": True, "tags": ["a", "b"]})]),
    # Llama 3.1 model card: JSON reply, with and without <|python_tag|>, ';' between calls
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", [PARIS]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; {"name": "get_time", "parameters": {"zone": "CET"}}', "", [PARIS, CET]),
    ("llama", 'Checking. <|python_tag|>{"type": "function", "name": "get_time", "arguments": {"zone": "CET"}}', "Checking.", [CET]),
    # Llama 4 model card: pythonic list, optionally in <|python_start|>…<|python_end|>
    ("pythonic", '[get_weather(city="Paris", days=3), get_time(zone="CET")]', "", [PARIS, CET]),
    ("llama4", '<|python_start|>[get_weather(city="Paris", days=3)]<|python_end|>', "", [PARIS]),
    ("pythonic", "[get_weather(city='Paris', days=3, metric=true, tags=['a'])]", "", [("get_weather", {"city": "Paris", "days": 3, "metric": True, "tags": ["a"]})]),
    # Mistral v3 tokenizer (array) and v11+ (name[ARGS]{...})
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, {"name": "get_time", "arguments": {"zone": "CET"}}]', "", [PARIS, CET]),
    ("mistral", 'Okay.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}', "Okay.", [PARIS, CET]),
    ("mistral", '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"zone": "CET"}', "", [CET]),
    # DeepSeek V3 / R1 template
    ("deepseekv3", 'Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{"zone": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Let me look.", [PARIS, CET]),
    # DeepSeek V3.1 template
    ("deepseekv31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "", [PARIS, CET]),
    ("deepseek31", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}<｜tool▁call▁end｜>', "", [CET]),
    # DeepSeek V3.2 encoding (DSML)
    ("deepseekv32", 'Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="zone" string="true">CET</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>', "Checking.", [PARIS, CET]),
    ("deepseekv32", '<function_calls>\n<invoke name="get_time">\n{"zone": "CET"}\n</invoke>\n</function_calls>', "", [CET]),
    # Kimi K2 template
    ("kimi_k2", 'I will check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|><|tool_calls_section_end|>', "I will check.", [PARIS, CET]),
    # GLM-4.5/4.6 template and GLM-4.7 (no newlines)
    ("glm45", "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>", "Checking.", [PARIS, CET]),
    ("glm47", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time<arg_key>zone</arg_key><arg_value>CET</arg_value></tool_call>", "", [PARIS, CET]),
    # MiniMax-M2 template
    ("minimax-m2", 'Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="zone">CET</parameter>\n</invoke>\n</minimax:tool_call>', "Sure.", [PARIS, CET]),
    # gpt-oss Harmony (after the reasoning parser; and raw, as without one)
    ("gpt-oss", '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}<|call|>', "", [PARIS]),
    ("gpt-oss", '<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"zone": "CET"}<|call|>', "Checking the weather.", [CET]),
    ("gpt-oss", "<|channel|>final<|message|>It is sunny.<|return|>", "It is sunny.", []),
    # SMG's plain JSON
    ("json", '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, {"name": "get_time", "parameters": {"zone": "CET"}}]', "", [PARIS, CET]),
    ("passthrough", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', []),
]

# Output that starts like a call but is not one: all of it comes back as content.
MALFORMED: list[tuple[str, str]] = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>'),
    ("qwen3_coder", "<tool_call>\nnot a function\n</tool_call>"),
    ("llama3", '{"answer": 42}'),
    ("llama3", "<|python_tag|>brave_search.call(query=\"x\")"),
    ("pythonic", "[1, 2, 3] are numbers"),
    ("pythonic", "[get_weather(city=Paris)]"),
    ("mistral", "[TOOL_CALLS] oops, no call"),
    ("deepseekv3", "<｜tool▁calls▁begin｜>garbage"),
    ("deepseekv31", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{not json}<｜tool▁call▁end｜>"),
    ("kimi_k2", "<|tool_calls_section_begin|>nothing here<|tool_calls_section_end|>"),
    ("glm45", "<tool_call>{broken</tool_call>"),
    ("minimax-m2", "<minimax:tool_call>\n<call>x</call>\n</minimax:tool_call>"),
    ("deepseekv32", "<function_calls>\n<bogus/>\n</function_calls>"),
    ("gpt-oss", "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{zone: CET}<|call|>"),
    ("hermes", '<tool_call>\n{"name": "unknown_fn", "arguments": {}}\n</tool_call>'),
    ("qwen3_coder", "<tool_call>\n<function=unknown_fn>\n</function>\n</tool_call>"),
]


def _make(name: str):  # type: ignore[no-untyped-def]
    return lambda: get_tool_parser(name, tools=TOOLS)


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_format_whole_and_every_split(name: str, text: str, content: str, calls: list[tuple[str, Any]]) -> None:
    result = assert_tool_split_invariant(_make(name), text)
    assert result == (content, calls)


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_format_random_splits(name: str, text: str, content: str, calls: list[tuple[str, Any]], cuts: list[int]) -> None:
    assert run_tool_stream(_make(name)(), random_splits(text, cuts)) == (content, calls)


@pytest.mark.parametrize(("name", "text"), MALFORMED)
def test_malformed_is_content(name: str, text: str) -> None:
    content, calls = get_tool_parser(name, tools=TOOLS).parse(text)
    assert calls == []
    assert content == text.strip()
    streamed = run_tool_stream(_make(name)(), [text])
    assert streamed == (text.strip(), [])


@pytest.mark.parametrize(("name", "text"), MALFORMED)
def test_malformed_streams_never_raise_or_lose_text(name: str, text: str) -> None:
    # Split anywhere, the text either comes back as content or as a call already streamed
    # (a stream cannot take back a call it announced; its arguments stay as sent).
    for k in range(len(text) + 1):
        parser = _make(name)()
        content, calls = aggregate([parser.feed(text[:k]), parser.feed(text[k:]), parser.finish()])
        assert content or calls
        if not calls:
            assert content == text.strip()


def test_truncated_call_is_content_one_shot() -> None:
    text = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "C'
    content, calls = get_tool_parser("deepseekv31").parse(text)
    assert (content, calls) == (text, [])


def test_every_name_builds_a_parser() -> None:
    for name in tool_parser_names():
        parser = get_tool_parser(name, tools=TOOLS)
        assert parser.parse("plain text") == ("plain text", [])


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(KeyError, match=r"known: .*qwen3_coder"):
        get_tool_parser("no-such-format")
