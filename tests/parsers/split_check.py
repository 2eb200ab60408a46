"""Shared checks: a parser gives the same result for a text whole and split anywhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from gateway.parsers.base import ReasoningParser, ToolCallParser
from gateway.parsers.constrained import aggregate

Calls = list[tuple[str, object]]


def run_tool_stream(parser: ToolCallParser, pieces: Sequence[str]) -> tuple[str, Calls]:
    deltas = [parser.feed(p) for p in pieces]
    deltas.append(parser.finish())
    for d in deltas:  # every call's first fragment names it, later ones only add arguments
        for frag in d.tool_calls:
            assert (frag.id is None) == (frag.name is None)
    content, calls = aggregate(deltas)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def one_shot(parser: ToolCallParser, text: str) -> tuple[str, Calls]:
    content, calls = parser.parse(text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def two_piece_splits(text: str) -> list[list[str]]:
    return [[text[:k], text[k:]] for k in range(len(text) + 1)]


def assert_tool_split_invariant(make: Callable[[], ToolCallParser], text: str) -> tuple[str, Calls]:
    """Whole, one-shot and every two-piece split (plus char by char) agree; returns the result."""
    whole = run_tool_stream(make(), [text])
    assert one_shot(make(), text) == whole
    assert run_tool_stream(make(), list(text)) == whole
    for pieces in two_piece_splits(text):
        assert run_tool_stream(make(), pieces) == whole, pieces
    return whole


def run_reasoning_stream(parser: ReasoningParser, pieces: Sequence[str]) -> tuple[str, str]:
    reasoning, content = [], []
    for p in pieces:
        r, c = parser.feed(p)
        reasoning.append(r)
        content.append(c)
    r, c = parser.finish()
    return "".join(reasoning) + r, "".join(content) + c


def assert_reasoning_split_invariant(make: Callable[[], ReasoningParser], text: str) -> tuple[str, str]:
    whole = run_reasoning_stream(make(), [text])
    r, c = make().parse(text)
    assert ((r or ""), c) == whole
    assert run_reasoning_stream(make(), list(text)) == whole
    for pieces in two_piece_splits(text):
        assert run_reasoning_stream(make(), pieces) == whole, pieces
    return whole


def random_splits(text: str, cuts: Sequence[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    out, last = [], 0
    for p in points:
        out.append(text[last:p])
        last = p
    out.append(text[last:])
    return out
