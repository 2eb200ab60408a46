"""Reasoning parsers of every family: examples, whole vs every split, the switches that turn them off."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.parsers.harmony_reasoning import HarmonyReasoningParser
from gateway.parsers.registry import (
    get_reasoning_parser,
    reasoning_parser_for_request,
    reasoning_parser_names,
)
from tests.parsers.split_check import (
    assert_reasoning_split_invariant,
    random_splits,
    run_reasoning_stream,
)

# (parser name, prompt ends with, model output, expected reasoning, expected content)
CASES: list[tuple[str, str, str, str, str]] = [
    ("qwen3", "<|im_start|>assistant\n", "<think>\nLet me see.\n</think>\n\nIt is 4.", "Let me see.", "It is 4."),
    ("qwen3", "<|im_start|>assistant\n", "No thinking here.", "", "No thinking here."),
    # Qwen3-Thinking-2507's template opens <think> in the prompt
    ("qwen3-thinking", "<|im_start|>assistant\n<think>\n", "Hmm.\n</think>\n\nYes.", "Hmm.", "Yes."),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Hmm.\n</think>\n\nYes.", "Hmm.", "Yes."),
    # DeepSeek-R1: output starts inside the reasoning, with or without the tag
    ("deepseek-r1", "<｜Assistant｜>", "Think first.</think>The answer.", "Think first.", "The answer."),
    ("deepseek-r1", "<｜Assistant｜><think>\n", "<think>Think.</think>Done.", "Think.", "Done."),
    ("kimi", "<|im_assistant|>assistant<|im_middle|>", "◁think▷Short thought.◁/think▷Answer.", "Short thought.", "Answer."),
    ("kimi_k2", "<|im_assistant|>assistant<|im_middle|>", "<think>K2 thinking.</think>Answer.", "K2 thinking.", "Answer."),
    ("glm45", "<|assistant|>", "<think>GLM thinks.</think>\nHello.", "GLM thinks.", "Hello."),
    ("glm45", "<|assistant|><think>", "GLM-4.7 thinks.</think>Hello.", "GLM-4.7 thinks.", "Hello."),
    ("minimax", "]~b]ai\n<think>\n", "Thinking...\n</think>\n\nHi!", "Thinking...", "Hi!"),
    ("minimax-append-think", "]~b]ai\n<think>\n", "Thinking...\n</think>\n\nHi!", "", "<think>Thinking...\n</think>\n\nHi!"),
    # gpt-oss Harmony
    ("gpt-oss", "<|start|>assistant", "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>", "User says hi.", "Hello!"),
    ("gpt-oss", "<|start|>assistant", "<|channel|>analysis<|message|>Need time.<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>", "Need time.", "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>"),
    ("gpt-oss", "<|start|>assistant", "<|channel|>final<|message|>Just the answer.", "", "Just the answer."),
    ("gpt-oss", "", "plain text, no harmony", "", "plain text, no harmony"),
]


def _make(name: str, prompt: str):  # type: ignore[no-untyped-def]
    def make():  # type: ignore[no-untyped-def]
        parser = reasoning_parser_for_request(name, prompt_text=prompt)
        assert parser is not None
        return parser

    return make


@pytest.mark.parametrize(("name", "prompt", "text", "reasoning", "content"), CASES)
def test_reasoning_whole_and_every_split(name: str, prompt: str, text: str, reasoning: str, content: str) -> None:
    assert assert_reasoning_split_invariant(_make(name, prompt), text) == (reasoning, content)


@pytest.mark.parametrize(("name", "prompt", "text", "reasoning", "content"), CASES)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_reasoning_random_splits(name: str, prompt: str, text: str, reasoning: str, content: str, cuts: list[int]) -> None:
    assert run_reasoning_stream(_make(name, prompt)(), random_splits(text, cuts)) == (reasoning, content)


def test_thinking_switched_off_leaves_text_alone() -> None:
    for kwargs in ({"enable_thinking": False}, {"thinking": False}):
        parser = reasoning_parser_for_request("qwen3", chat_template_kwargs=kwargs)
        assert parser is not None and parser.parse("<think>x</think>y") == (None, "<think>x</think>y")
    kept = reasoning_parser_for_request("kimi", separate_reasoning=False)
    assert kept is not None and kept.parse("◁think▷x◁/think▷y") == (None, "◁think▷x◁/think▷y")
    harmony = HarmonyReasoningParser(separate_reasoning=False)
    assert harmony.parse("<|channel|>analysis<|message|>x<|end|>") == (None, "<|channel|>analysis<|message|>x<|end|>")
    assert reasoning_parser_for_request("none") is None


def test_cut_off_reasoning_is_all_reasoning() -> None:
    parser = get_reasoning_parser("deepseek-r1", starts_in_reasoning=True)
    assert parser.parse("still thinking when the tokens ran out") == ("still thinking when the tokens ran out", "")
    harmony = HarmonyReasoningParser()
    assert harmony.parse("<|channel|>analysis<|message|>cut") == ("cut", "")


def test_every_name_builds() -> None:
    for name in reasoning_parser_names():
        parser = reasoning_parser_for_request(name)
        assert name == "none" or parser is not None
