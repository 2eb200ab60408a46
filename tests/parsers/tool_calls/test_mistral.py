"""Mistral's ``[TOOL_CALLS]`` formats (parsers/tool_calls/mistral.py): the v3 JSON array and
the v11+ ``name[ARGS]{...}`` form, with or without a call id."""

from __future__ import annotations

from gateway.parsers.tool_calls.mistral import MistralToolParser
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TOOLS

PARIS = ("get_weather", {"city": "Paris", "days": 3})


def _make() -> MistralToolParser:
    return MistralToolParser(tools=TOOLS)


def test_the_array_form() -> None:
    text = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, {"name": "get_time", "arguments": {"zone": "CET"}}]'
    assert assert_tool_split_invariant(_make, text) == ("", [PARIS, ("get_time", {"zone": "CET"})])


def test_the_args_form_with_content_and_a_call_id() -> None:
    text = 'Okay.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"zone": "CET"}'
    assert assert_tool_split_invariant(_make, text) == ("Okay.", [PARIS, ("get_time", {"zone": "CET"})])


def test_no_call_after_the_marker_is_content() -> None:
    content, calls = _make().parse("[TOOL_CALLS] oops, no call")
    assert calls == [] and "oops, no call" in content
