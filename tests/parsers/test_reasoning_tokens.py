"""Reasoning tokens are those inside the reasoning block, counted on the real Qwen3 tokenizer."""

from __future__ import annotations

import pytest

from gateway.parsers.reasoning_tokens import ReasoningTokenCounter
from gateway.tokenization import Tokenizer
from tests.tokenization.helpers import qwen_files


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return Tokenizer.from_path(qwen_files(), name="Qwen/Qwen3-0.6B")


def counter(qwen: Tokenizer, *, opened: bool = False) -> ReasoningTokenCounter:
    start, end = qwen.token_id("<think>"), qwen.token_id("</think>")
    assert start is not None and end is not None  # single special tokens in Qwen3's vocabulary
    return ReasoningTokenCounter(start, end, starts_in_reasoning=opened)


def count(qwen: Tokenizer, text: str, *, opened: bool = False, split: int = 0) -> tuple[int, int]:
    """(reasoning tokens, all tokens) of ``text`` as a reply, fed whole or in pieces of ``split``."""
    ids = qwen.encode(text, add_special_tokens=False)
    c = counter(qwen, opened=opened)
    step = split or len(ids)
    for i in range(0, len(ids), step):
        c.feed(ids[i : i + step])
    return c.count, len(ids)


@pytest.mark.parametrize("split", [0, 1, 3])
def test_an_answer_without_a_think_block_has_none(qwen: Tokenizer, split: int) -> None:
    reasoning, total = count(qwen, "Paris is the capital of France.<|im_end|>", split=split)
    assert total > 5 and reasoning == 0


@pytest.mark.parametrize("split", [0, 1, 2])
def test_only_the_block_counts(qwen: Tokenizer, split: int) -> None:
    block = "<think>\nThe user asks for a capital.\n</think>"
    reasoning, _ = count(qwen, block + "\n\nParis.<|im_end|>", split=split)
    assert reasoning == len(qwen.encode(block, add_special_tokens=False))


def test_a_block_opened_by_the_template_counts_from_the_first_token(qwen: Tokenizer) -> None:
    thought = "Short thought.\n"
    reasoning, _ = count(qwen, thought + "</think>\n\nParis.", opened=True)
    assert reasoning == len(qwen.encode(thought + "</think>", add_special_tokens=False))


def test_an_unfinished_block_is_all_reasoning(qwen: Tokenizer) -> None:
    reasoning, total = count(qwen, "<think>\nStill thinking when the length ran out")
    assert reasoning == total


def test_a_think_tag_later_in_the_answer_is_content(qwen: Tokenizer) -> None:
    reasoning, _ = count(qwen, "Answer first. <think>not a block</think> more")
    assert reasoning == 0


def test_done_once_the_count_is_final(qwen: Tokenizer) -> None:
    c = counter(qwen)
    c.feed(qwen.encode("<think>\nhm", add_special_tokens=False))
    assert not c.done
    c.feed(qwen.encode("</think>", add_special_tokens=False))
    assert c.done
    answer = counter(qwen)
    answer.feed(qwen.encode("Paris", add_special_tokens=False)[:1])
    assert answer.done and answer.count == 0
