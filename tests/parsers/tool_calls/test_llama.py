"""Llama 3's JSON calls and SMG's plain JSON (parsers/tool_calls/llama.py)."""

from __future__ import annotations

from gateway.parsers.tool_calls.llama import JsonToolParser, LlamaJsonToolParser
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS

PARIS = ("get_weather", {"city": "Paris", "days": 3})
CET = ("get_time", {"zone": "CET"})


def test_llama_replies_with_or_without_the_python_tag() -> None:
    def make() -> LlamaJsonToolParser:
        return LlamaJsonToolParser(tools=TOOLS)

    assert assert_tool_split_invariant(make, '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}') == ("", [PARIS])
    tagged = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; {"name": "get_time", "parameters": {"zone": "CET"}}'
    assert assert_tool_split_invariant(make, tagged) == ("", [PARIS, CET])
    assert make().parse('Checking. <|python_tag|>{"type": "function", "name": "get_time", "arguments": {"zone": "CET"}}')[0] == "Checking."


def test_json_that_is_not_a_call_is_content() -> None:
    assert LlamaJsonToolParser(tools=TOOLS).parse('{"answer": 42}') == ('{"answer": 42}', [])


def test_plain_json_arrays_of_calls() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, {"name": "get_time", "parameters": {"zone": "CET"}}]'
    assert assert_tool_split_invariant(lambda: JsonToolParser(tools=TOOLS), text) == ("", [PARIS, CET])
