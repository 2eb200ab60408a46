"""Think-tag reasoning parsers: one-shot rules, streaming equals one-shot at any split."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.parsers import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    ThinkTagReasoningParser,
    prompt_opens_think_block,
)


def stream(
    parser: ThinkTagReasoningParser, chunks: list[str]
) -> tuple[str, str, list[tuple[str, str]]]:
    steps = [parser.feed(c) for c in chunks] + [parser.finish()]
    return "".join(r for r, _ in steps), "".join(c for _, c in steps), steps


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(text[last:p])
        last = p
    pieces.append(text[last:])
    return pieces


@pytest.mark.parametrize(
    ("text", "starts_in", "reasoning", "content"),
    [
        (
            "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
            False,
            "Let me think.",
            "The answer is 4.",
        ),
        ("  \n<think>a</think>b", False, "a", "b"),
        ("The answer is 4.", False, None, "The answer is 4."),
        ("  leading space kept", False, None, "  leading space kept"),
        ("<think>\n\n</think>\n\nHello", False, None, "Hello"),
        ("<think>cut short by max_tokens", False, "cut short by max_tokens", ""),
        ("text then <think>late</think>", False, None, "text then <think>late</think>"),
        ("thinking\n</think>\n\nanswer", True, "thinking", "answer"),
        ("<think>thinking</think>answer", True, "thinking", "answer"),
        ("only reasoning, no end tag", True, "only reasoning, no end tag", ""),
        ("", True, None, ""),
        ("a</think>b</think>c", True, "a", "b</think>c"),
    ],
)
def test_one_shot_rules(text: str, starts_in: bool, reasoning: str | None, content: str) -> None:
    parser = Qwen3ReasoningParser(starts_in_reasoning=starts_in)
    assert parser.parse(text) == (reasoning, content)
    streamed_reasoning, streamed_content, _ = stream(
        Qwen3ReasoningParser(starts_in_reasoning=starts_in), list(text)
    )
    assert (streamed_reasoning, streamed_content) == (reasoning or "", content)


def test_tags_split_across_deltas() -> None:
    parser = Qwen3ReasoningParser()
    steps = [parser.feed(c) for c in ["<thi", "nk>\nstep one", " </th", "ink", ">\n\nDone", "."]]
    steps.append(parser.finish())
    assert steps[0] == ("", "")  # "<thi" could still open the block: held
    assert steps[1] == ("step one", "")
    assert steps[2] == ("", "")  # " </th" may be the end tag (and the space precedes it)
    assert steps[4] == ("", "Done")
    assert "".join(r for r, _ in steps) == "step one"
    assert "".join(c for _, c in steps) == "Done."


def test_text_that_only_looks_like_a_tag_is_released() -> None:
    parser = Qwen3ReasoningParser()
    assert parser.feed("<th") == ("", "")
    assert parser.feed("ese are my words") == ("", "<these are my words")
    assert parser.in_reasoning is False


def test_disabled_modes_pass_text_through() -> None:
    text = "<think>r</think>c"
    for parser in (
        Qwen3ReasoningParser(enable_thinking=False),
        Qwen3ReasoningParser(separate_reasoning=False),
    ):
        assert parser.parse(text) == (None, text)
        assert parser.feed(text) == ("", text)
        assert parser.finish() == ("", "")


def test_deepseek_r1_starts_in_reasoning_by_default() -> None:
    assert DeepSeekR1ReasoningParser().parse("why\n</think>\nbecause") == ("why", "because")
    assert DeepSeekR1ReasoningParser(starts_in_reasoning=False).parse("plain") == (None, "plain")


def test_prompt_detection() -> None:
    assert prompt_opens_think_block("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think_block("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_think_block("<|im_start|>assistant\n")


def test_in_reasoning_tracks_the_stream() -> None:
    parser = Qwen3ReasoningParser()
    parser.feed("<think>abc")
    assert parser.in_reasoning
    parser.feed("</think>x")
    assert not parser.in_reasoning


@pytest.mark.parametrize(
    ("parser", "chunks", "after"),
    [
        (Qwen3ReasoningParser(), ["<think>", "a", "</think>", "\n\n", "B"], 5),  # past the answer's first character
        (Qwen3ReasoningParser(), ["Plain"], 1),  # no block
        (Qwen3ReasoningParser(), [" ", "<th", "x"], 3),  # a partial tag that was not one
        (Qwen3ReasoningParser(enable_thinking=False), [], 0),
        (DeepSeekR1ReasoningParser(), ["a", "</think>", "B"], 3),
    ],
)
def test_passes_through_once_the_split_is_decided(parser: ThinkTagReasoningParser, chunks: list[str], after: int) -> None:
    for k, chunk in enumerate(chunks):
        assert not parser.passes_through, k
        parser.feed(chunk)
    assert parser.passes_through and len(chunks) == after
    assert parser.feed(" \n<think>x</think> ") == ("", " \n<think>x</think> ")  # from now on: content as generated
    assert parser.finish() == ("", "")


def test_whitespace_after_the_end_tag_keeps_the_parser_in_the_way() -> None:
    parser = Qwen3ReasoningParser()
    parser.feed("<think>a</think>")
    parser.feed("\n")
    assert not parser.passes_through  # the answer's leading whitespace is still dropped
    assert parser.feed("\nB") == ("", "B")
    assert parser.passes_through


FRAGMENTS = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<",
        "</",
        "<th",
        "</thi",
        "nk>",
        "think",
        ">",
        " ",
        "\n",
        "a",
        "bc",
        "é",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(FRAGMENTS, max_size=14),
    cuts=st.lists(st.integers(0, 80), max_size=8),
    starts_in=st.booleans(),
)
def test_streaming_equals_one_shot_for_any_text(
    pieces: list[str], cuts: list[int], starts_in: bool
) -> None:
    text = "".join(pieces)
    reasoning, content = Qwen3ReasoningParser(starts_in_reasoning=starts_in).parse(text)
    streamed_r, streamed_c, steps = stream(
        Qwen3ReasoningParser(starts_in_reasoning=starts_in), split(text, cuts)
    )
    assert streamed_r == (reasoning or "")
    assert streamed_c == content
    # Nothing is ever taken back: every partial concatenation is a prefix of the result.
    so_far_r = so_far_c = ""
    for r, c in steps:
        so_far_r += r
        so_far_c += c
        assert (reasoning or "").startswith(so_far_r) and content.startswith(so_far_c)
