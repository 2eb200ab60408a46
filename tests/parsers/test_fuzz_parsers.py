"""Random text built from each format's own markers: parsers never raise and never lose text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.parsers.constrained import aggregate
from gateway.parsers.registry import (
    TOOL_PARSER_GROUPS,
    get_tool_parser,
    reasoning_parser_for_request,
    reasoning_parser_names,
)

FRAGMENTS = [
    "<tool_call>", "</tool_call>", "\n", " ", "{", "}", "[", "]", '"name"', '"arguments"', '"parameters"', ":", ",",
    '"get_time"', '"zone"', '"CET"', "<function=get_time>", "</function>", "<parameter=zone>", "</parameter>",
    "<|python_tag|>", ";", "get_time(", "zone=", ")", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]",
    "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>",
    "function", "```json", "```", "<｜DSML｜function_calls>", '<｜DSML｜invoke name="get_time">',
    '<｜DSML｜parameter name="zone" string="true">', "</｜DSML｜parameter>", "</｜DSML｜invoke>",
    "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.get_time:0", "<|tool_call_argument_begin|>",
    "<|tool_call_end|>", "<|tool_calls_section_end|>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<minimax:tool_call>", '<invoke name="get_time">', '<parameter name="zone">', "</invoke>", "</minimax:tool_call>",
    "<|start|>", "assistant", "<|channel|>", "commentary", " to=functions.get_time", "<|constrain|>", "json",
    "<|message|>", "<|call|>", "<|end|>", "final", "analysis", "<think>", "</think>", "◁think▷", "◁/think▷",
    "hello", "é", "'", "\\", "true", "3",
]
TEXTS = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join)
CUTS = st.lists(st.integers(min_value=0, max_value=400), max_size=8)
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]
TEXT_KEEPING = sorted(set(TOOL_PARSER_GROUPS) - {"gpt-oss"})  # Harmony drops message markup by design


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize("name", sorted(TOOL_PARSER_GROUPS))
@settings(max_examples=150, deadline=None)
@given(text=TEXTS, cuts=CUTS)
def test_tool_parsers_never_raise_or_lose_text(name: str, text: str, cuts: list[int]) -> None:
    content, calls = get_tool_parser(name, tools=TOOLS).parse(text)
    if not calls and name in TEXT_KEEPING:
        assert content == text
    parser = get_tool_parser(name, tools=TOOLS)
    deltas = [parser.feed(piece) for piece in _split(text, cuts)]
    deltas.append(parser.finish())
    streamed, streamed_calls = aggregate(deltas)
    if not streamed_calls and name in TEXT_KEEPING:
        assert streamed == text


@pytest.mark.parametrize("name", reasoning_parser_names())
@settings(max_examples=150, deadline=None)
@given(text=TEXTS, cuts=CUTS)
def test_reasoning_parsers_never_raise(name: str, text: str, cuts: list[int]) -> None:
    parser = reasoning_parser_for_request(name)
    if parser is None:
        return
    parser.parse(text)
    streamed = reasoning_parser_for_request(name)
    assert streamed is not None
    for piece in _split(text, cuts):
        streamed.feed(piece)
    streamed.finish()
