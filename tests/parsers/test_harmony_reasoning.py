"""gpt-oss reasoning (parsers/harmony_reasoning.py): the analysis channel is reasoning,
final and preamble messages are content, tool-call messages stay whole for the tool parser."""

from __future__ import annotations

from gateway.parsers.harmony_reasoning import HarmonyReasoningParser
from tests.parsers.split_check import assert_reasoning_split_invariant


def test_analysis_is_reasoning_and_final_is_content() -> None:
    text = "<|channel|>analysis<|message|>User wants the time.<|end|><|start|>assistant<|channel|>final<|message|>It is noon.<|return|>"
    assert assert_reasoning_split_invariant(HarmonyReasoningParser, text) == ("User wants the time.", "It is noon.")
    assert HarmonyReasoningParser().parse(text) == ("User wants the time.", "It is noon.")


def test_tool_call_messages_keep_their_markup_for_the_tool_parser() -> None:
    call = '<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"zone": "CET"}<|call|>'
    reasoning, content = HarmonyReasoningParser().parse("<|channel|>analysis<|message|>Need a tool.<|end|>" + call)
    assert reasoning == "Need a tool." and "to=functions.get_time" in content and '{"zone": "CET"}' in content


def test_text_without_harmony_markup_and_without_separation_is_content() -> None:
    assert HarmonyReasoningParser().parse("plain answer") == (None, "plain answer")
    raw = "<|channel|>analysis<|message|>think<|end|>"
    assert HarmonyReasoningParser(separate_reasoning=False).parse(raw) == (None, raw)


def test_the_parser_knows_when_it_is_still_in_reasoning() -> None:
    parser = HarmonyReasoningParser()
    assert parser.in_reasoning
    parser.feed("<|channel|>analysis<|message|>hmm")
    assert parser.in_reasoning
    parser.feed("<|end|><|start|>assistant<|channel|>final<|message|>ok")
    assert not parser.in_reasoning
