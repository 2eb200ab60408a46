"""Kimi K2's tool-call section (parsers/tool_calls/kimi.py)."""

from __future__ import annotations

from gateway.parsers.tool_calls.kimi import KimiK2ToolParser, function_name
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS


def test_call_ids_name_the_function() -> None:
    assert function_name("functions.get_weather:0") == "get_weather"
    assert function_name(" get_time:12 ") == "get_time"
    assert function_name("functions.ns.tool") == "ns.tool"


def test_a_section_of_calls_whole_and_split() -> None:
    text = ('I will check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
            '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
            '<|tool_call_argument_begin|>{"zone": "CET"}<|tool_call_end|><|tool_calls_section_end|>')
    content, calls = assert_tool_split_invariant(lambda: KimiK2ToolParser(tools=TOOLS), text)
    assert content == "I will check." and calls == [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET"})]


def test_an_unknown_function_or_broken_section_is_content() -> None:
    text = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.launch:0<|tool_call_argument_begin|>{}'
            '<|tool_call_end|><|tool_calls_section_end|>')
    content, calls = KimiK2ToolParser(tools=TOOLS).parse(text)
    assert calls == [] and content == text
