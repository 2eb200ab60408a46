"""XML-style parameter formats (parsers/tool_calls/xml_params.py): Qwen3-Coder, GLM-4.5/4.7
and MiniMax-M2, each value typed by the tool's schema."""

from __future__ import annotations

from gateway.parsers.tool_calls.xml_params import (
    Glm45ToolParser,
    Glm47ToolParser,
    MiniMaxM2ToolParser,
    Qwen3CoderToolParser,
)
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS

PARIS = ("get_weather", {"city": "Paris", "days": 3})
CET = ("get_time", {"zone": "CET"})


def test_qwen3_coder_values_keep_inner_newlines_and_follow_the_schema() -> None:
    text = ("Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
    content, calls = assert_tool_split_invariant(lambda: Qwen3CoderToolParser(tools=TOOLS), text)
    assert content == "Let me check." and calls == [("get_weather", {"city": "New\nYork", "days": 3, "metric": True})]
    bad = "<tool_call>\n<function=launch>\n</function>\n</tool_call>"
    assert Qwen3CoderToolParser(tools=TOOLS).parse(bad) == (bad, [])


def test_glm_formats_with_and_without_newlines() -> None:
    glm45 = ("Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
    assert assert_tool_split_invariant(lambda: Glm45ToolParser(tools=TOOLS), glm45) == ("Checking.", [PARIS])
    glm47 = "<tool_call>get_time<arg_key>zone</arg_key><arg_value>CET</arg_value></tool_call>"
    assert assert_tool_split_invariant(lambda: Glm47ToolParser(tools=TOOLS), glm47) == ("", [CET])


def test_minimax_invokes() -> None:
    text = ('Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
            '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n'
            '<parameter name="zone">CET</parameter>\n</invoke>\n</minimax:tool_call>')
    assert assert_tool_split_invariant(lambda: MiniMaxM2ToolParser(tools=TOOLS), text) == ("Sure.", [PARIS, CET])


def test_string_values_stream_before_their_parameter_closes() -> None:
    parser = Qwen3CoderToolParser(tools=TOOLS)
    parser.feed("<tool_call>\n<function=get_time>\n<parameter=zone>\n")
    early = parser.feed("Europe/Par")
    args = "".join(f.arguments for f in early.tool_calls)
    assert "Europe/Par" in args  # a long string value reaches the client as it is written
