"""The section-based parser machinery (parsers/tool_calls/section.py): literal matching
across deltas, marker hold-back, the growth cache, the request's tool specs, and the
streaming engine itself on a toy format ``@@name{json}``."""

from __future__ import annotations

import pytest

from gateway.parsers.tool_calls.json_calls import arguments_view
from gateway.parsers.tool_calls.section import (
    INCOMPLETE,
    MISMATCH,
    GrowthCache,
    SectionToolParser,
    SectionView,
    ToolSpecs,
    expect,
    hold_back,
    skip_ws,
)
from tests.parsers.split_check import assert_tool_split_invariant, run_tool_stream
from tests.parsers.tool_calls.common import TOOLS


class _AtCalls(SectionToolParser):
    """``@@name{json}``: one call per section."""

    markers = ("@@",)

    def scan(self, section: str, *, final: bool) -> SectionView:
        brace = section.find("{", 2)
        if brace == -1:
            return SectionView("invalid" if final or len(section) > 40 else "incomplete")
        name = section[2:brace]
        if not self.specs.accepts(name):
            return SectionView("invalid")
        try:
            view, end = arguments_view(section, brace, name, self.cache(final))
        except ValueError:
            return SectionView("invalid")
        if end is None:
            return SectionView("invalid" if final else "incomplete", [view])
        return SectionView("complete", [view], end=end)


def test_literals_are_matched_across_deltas() -> None:
    assert expect("<tool>x", 0, "<tool>") == 6
    assert expect("<to", 0, "<tool>") == INCOMPLETE  # the rest may still come
    assert expect("<tx", 0, "<tool>") == MISMATCH
    assert skip_ws(" \t\n x", 0) == 4 and skip_ws("x", 0) == 0
    assert hold_back("text <tool_c", ["<tool_call>", "[TOOL"]) == 7
    assert hold_back("text", ["<tool_call>"]) == 0


def test_tool_specs_accept_declared_names_and_give_parameter_schemas() -> None:
    specs = ToolSpecs.from_tools(TOOLS)
    assert specs.accepts("get_weather") and not specs.accepts("launch")
    assert specs.property_schema("get_weather", "days") == {"type": "integer"}
    assert specs.property_schema("get_weather", "nope") is None and specs.property_schema("launch", "x") is None
    assert ToolSpecs.from_tools(tool_names=["f"]).accepts("f") and not ToolSpecs.from_tools(tool_names=["f"]).accepts("g")
    assert ToolSpecs.from_tools().accepts("anything") and ToolSpecs.from_tools().property_schema("f", "x") is None


def test_the_growth_cache_skips_work_until_a_close_or_a_doubling() -> None:
    cache = GrowthCache()
    text = '{"a": "' + "x" * 10
    assert cache.skip(text, 0) == (False, False)  # never seen: decode and validate
    cache.note(text, 0, validated=True)
    grown = text + "yyy"
    assert cache.skip(grown, 0) == (True, True)  # no closing bracket arrived, not doubled
    assert cache.skip(grown + "}", 0)[0] is False  # a close arrived: decode again
    assert cache.skip(text + "z" * 30, 0)[1] is False  # doubled: validate again
    cache.clear()
    assert cache.skip(grown, 0) == (False, False)


def test_the_engine_streams_content_and_calls_split_anywhere() -> None:
    text = 'Checking @@get_weather{"city": "Paris", "days": 3} and @@get_time{"zone": "CET"} done'
    content, calls = assert_tool_split_invariant(lambda: _AtCalls(tools=TOOLS), text)
    assert calls == [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]
    assert content.replace(" ", "") == "Checkinganddone"
    parser = _AtCalls(tools=TOOLS)
    run_tool_stream(parser, list(text))
    assert parser.calls_started == 2 and [c.name for c in parser.completed] == ["get_weather", "get_time"]


def test_a_partial_marker_is_held_back_then_released_as_text() -> None:
    parser = _AtCalls(tools=TOOLS)
    first = parser.feed("price @")
    assert first.content == "price"  # "@" may open a section (and the space before a section is dropped)
    second = parser.feed(" 5")
    assert second.content == " @ 5" and not second.tool_calls


@pytest.mark.parametrize("text", ['@@launch{"x": 1}', "@@get_time{not json}", "@@get_time{\"zone\": "])
def test_a_section_that_is_not_a_call_is_content(text: str) -> None:
    assert _AtCalls(tools=TOOLS).parse(text) == (text, [])
