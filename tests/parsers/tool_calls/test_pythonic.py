"""Llama 4's pythonic calls (parsers/tool_calls/pythonic.py): keyword calls read without
evaluating anything, JSON spellings accepted, anything else content."""

from __future__ import annotations

import json

import pytest

from gateway.parsers.tool_calls.pythonic import PythonicToolParser, read_call
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS


def test_one_call_is_read_as_name_and_json_arguments() -> None:
    name, args = read_call("ns.get_weather(city='Paris', days=3, metric=true, tags=('a',), extra={'k': None}, n=null)")
    assert name == "ns.get_weather"
    assert json.loads(args) == {"city": "Paris", "days": 3, "metric": True, "tags": ["a"], "extra": {"k": None}, "n": None}


@pytest.mark.parametrize("source", ["f(1)", "f(**kw)", "x + 1", "f(a=open('x').read())", "f(a=b)", "(lambda: 1)()", "f(" * 200])
def test_anything_but_a_plain_keyword_call_is_refused(source: str) -> None:
    with pytest.raises(ValueError):
        read_call(source)


def test_a_list_of_calls_whole_and_split_with_the_python_markers() -> None:
    def make() -> PythonicToolParser:
        return PythonicToolParser(tools=TOOLS)

    text = '[get_weather(city="Paris", days=3), get_time(zone="CET")]'
    assert assert_tool_split_invariant(make, text) == ("", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})])
    wrapped = '<|python_start|>[get_time(zone="CET")]<|python_end|>'
    assert make().parse(wrapped)[1][0].name == "get_time"
    assert make().parse("[1, 2, 3] are numbers") == ("[1, 2, 3] are numbers", [])
