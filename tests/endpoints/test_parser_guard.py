"""A failing parser degrades to plain content for the rest of the choice, logged, never raised."""

from __future__ import annotations

import logging

import pytest

from gateway.endpoints.parser_guard import GuardedReasoningParser, GuardedToolParser
from gateway.parsers.base import ReasoningParser, ToolCall, ToolCallParser, ToolStreamDelta
from gateway.parsers.constrained import NamedToolCallParser, RequiredToolCallParser
from gateway.parsers.harmony_reasoning import HarmonyReasoningParser
from gateway.parsers.hermes import HermesToolParser
from gateway.parsers.reasoning import Qwen3ReasoningParser


class Exploding(ToolCallParser):
    def __init__(self) -> None:
        self.text = ""

    @property
    def held(self) -> str:
        return self.text

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        raise RuntimeError("bug")

    def feed(self, delta: str) -> ToolStreamDelta:
        self.text += delta
        if "!" in self.text:
            raise RuntimeError("bug")
        return ToolStreamDelta()

    def finish(self) -> ToolStreamDelta:
        raise RuntimeError("bug")


class ExplodingReasoning(ReasoningParser):
    def parse(self, text: str) -> tuple[str | None, str]:
        raise ValueError("bug")

    def feed(self, delta: str) -> tuple[str, str]:
        raise ValueError("bug")

    def finish(self) -> tuple[str, str]:
        raise ValueError("bug")


def test_tool_parser_failure_hands_back_held_text(caplog: pytest.LogCaptureFixture) -> None:
    guard = GuardedToolParser(Exploding())
    with caplog.at_level(logging.ERROR):
        assert guard.feed("held ").content == ""
        assert guard.feed("boom!").content == "held boom!"
        assert guard.feed(" after").content == " after"
        assert guard.finish().content == ""
        assert GuardedToolParser(Exploding()).parse("text") == ("text", [])
    assert "Exploding failed" in caplog.text


def test_reasoning_failure_is_content() -> None:
    guard = GuardedReasoningParser(ExplodingReasoning())
    assert guard.feed("x") == ("", "x")
    assert guard.feed("y") == ("", "y")
    assert GuardedReasoningParser(ExplodingReasoning()).parse("t") == (None, "t")
    assert guard.passes_through  # a failed parser's output is content from then on


def test_passes_through_is_the_inner_parsers() -> None:
    guard = GuardedReasoningParser(Qwen3ReasoningParser())
    guard.feed("<think>a")
    assert not guard.passes_through
    guard.feed("</think>B")
    assert guard.passes_through


def test_working_parser_is_untouched() -> None:
    guard = GuardedToolParser(HermesToolParser())
    out = guard.feed('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    assert out.tool_calls and guard.calls_started == 1


def test_the_guard_reads_and_sets_where_the_inner_parser_starts() -> None:
    inner = Qwen3ReasoningParser()
    guard = GuardedReasoningParser(inner)
    assert not guard.starts_in_reasoning
    guard.starts_in_reasoning = True
    assert inner.starts_in_reasoning and guard.starts_in_reasoning
    assert guard.feed("a</think>b") == ("a", "b")  # read as reasoning from the start
    failed = GuardedReasoningParser(ExplodingReasoning())
    failed.starts_in_reasoning = True  # a parser that splits on no start tag keeps the default
    assert failed.starts_in_reasoning
    failed.feed("x")
    assert not failed.starts_in_reasoning  # failed: the rest is content


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (HermesToolParser(), "answer <tool_"),
        (Qwen3ReasoningParser(), "<thi"),
        (HarmonyReasoningParser(), "<|channel|>analysis<|message|>a<|en"),
        (NamedToolCallParser("f"), '{"a": 1'),
        (RequiredToolCallParser(), '[{"name": "f"'),
    ],
)
def test_what_a_parser_holds_is_public_where_the_guard_reads_it(
    parser: ToolCallParser | ReasoningParser, text: str
) -> None:
    parser.feed(text)
    assert parser.held and text.endswith(parser.held)  # the undecided tail at least
    guard = GuardedToolParser(parser) if isinstance(parser, ToolCallParser) else GuardedReasoningParser(parser)
    assert guard.held == parser.held
