"""The parser interfaces' value types (parsers/base.py): call ids, marker hold-back,
streamed fragments merged per call, and their OpenAI shapes."""

from __future__ import annotations

import re

from gateway.parsers.base import (
    ReasoningParser,
    ToolCall,
    ToolCallDelta,
    ToolStreamDelta,
    new_tool_call_id,
    partial_suffix,
)
from gateway.parsers.tool_calls.passthrough import PassthroughToolParser


def test_call_ids_have_openais_shape_and_differ() -> None:
    ids = {new_tool_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)


def test_partial_suffix_is_the_longest_proper_prefix_of_the_tag_at_the_end() -> None:
    assert partial_suffix("abc <tool", "<tool_call>") == 5
    assert partial_suffix("abc <", "<tool_call>") == 1
    assert partial_suffix("abc <tool_call>", "<tool_call>") == 0  # the whole tag is not held back
    assert partial_suffix("", "<tool_call>") == 0 and partial_suffix("x", "x") == 0


def test_fragments_of_one_call_merge_and_a_new_call_starts_a_new_one() -> None:
    out = ToolStreamDelta()
    assert not out
    out.add_call_fragment(ToolCallDelta(index=0, id="call_a", name="f", arguments='{"a"'))
    out.add_call_fragment(ToolCallDelta(index=0, arguments=": 1}"))
    out.add_call_fragment(ToolCallDelta(index=1, id="call_b", name="g"))
    out.add_call_fragment(ToolCallDelta(index=1, arguments="{}"))
    assert out and [(f.index, f.id, f.arguments) for f in out.tool_calls] == [(0, "call_a", '{"a": 1}'), (1, "call_b", "{}")]
    assert ToolStreamDelta(content="x")


def test_openai_shapes() -> None:
    first = ToolCallDelta(index=0, id="call_a", name="f", arguments="{")
    assert first.to_openai() == {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{"}}
    later = ToolCallDelta(index=0, arguments="}").to_protocol()
    assert later.id is None and later.type is None and later.function.arguments == "}"
    call = ToolCall(id="call_a", name="f", arguments='{"a": 1}').to_protocol()
    assert call.id == "call_a" and call.function.name == "f" and call.function.arguments == '{"a": 1}'


class _Plain(ReasoningParser):
    def parse(self, text: str) -> tuple[str | None, str]:
        return None, text

    def feed(self, delta: str) -> tuple[str, str]:
        return "", delta

    def finish(self) -> tuple[str, str]:
        return "", ""


def test_optional_capabilities_have_defaults_every_parser_answers() -> None:
    plain, calls = _Plain(), PassthroughToolParser()  # neither overrides the defaults
    assert plain.held == "" and calls.held == "" and not plain.passes_through
    assert plain.starts_in_reasoning is False
    plain.starts_in_reasoning = True  # settable on any parser; one that splits on no tag ignores it
    assert plain.feed("x") == ("", "x") and _Plain().starts_in_reasoning is False
