"""DeepSeek's three tool-call encodings (parsers/tool_calls/deepseek.py): V3's fenced JSON,
V3.1's bare JSON, V3.2's DSML parameters typed by ``string="true|false"``."""

from __future__ import annotations

from gateway.parsers.tool_calls.deepseek import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
    DeepSeekV32ToolParser,
    _dsml_value,
)
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS

PARIS = ("get_weather", {"city": "Paris", "days": 3})
CET = ("get_time", {"zone": "CET"})


def test_v3_fenced_json_calls() -> None:
    text = ('Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
            '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
            '```json\n{"zone": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert assert_tool_split_invariant(lambda: DeepSeekV3ToolParser(tools=TOOLS), text) == ("Let me look.", [PARIS, CET])
    assert DeepSeekV3ToolParser(tools=TOOLS).parse("<｜tool▁calls▁begin｜>garbage")[1] == []


def test_v31_bare_json_calls_and_a_truncated_call_is_content() -> None:
    text = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}'
            '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    assert assert_tool_split_invariant(lambda: DeepSeekV31ToolParser(tools=TOOLS), text) == ("", [PARIS, CET])
    cut = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "C'
    assert DeepSeekV31ToolParser(tools=TOOLS).parse(cut) == (cut, [])


def test_v32_dsml_parameters_are_typed_by_their_string_flag() -> None:
    assert _dsml_value("3", "false") == 3 and _dsml_value("3", "true") == "3"
    assert _dsml_value("[1, 2]", "false") == [1, 2] and _dsml_value("not json", "false") == "not json"
    text = ('Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
            '</｜DSML｜function_calls>')
    assert assert_tool_split_invariant(lambda: DeepSeekV32ToolParser(tools=TOOLS), text) == ("Checking.", [PARIS])
    plain = '<function_calls>\n<invoke name="get_time">\n{"zone": "CET"}\n</invoke>\n</function_calls>'
    assert DeepSeekV32ToolParser(tools=TOOLS).parse(plain)[1][0].name == "get_time"
