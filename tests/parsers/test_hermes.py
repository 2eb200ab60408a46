"""Hermes/Qwen tool-call parser: one-shot rules, streaming shape, streaming equals one-shot."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from gateway.parsers import HermesToolParser, ToolCall, ToolStreamDelta, aggregate, get_tool_parser


def call_block(
    name: str, args: Any, *, key: str = "arguments", lead: str = "\n", trail: str = "\n"
) -> str:
    return f'<tool_call>{lead}{{"name": {json.dumps(name)}, "{key}": {json.dumps(args)}}}{trail}</tool_call>'


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(text[last:p])
        last = p
    pieces.append(text[last:])
    return pieces


def stream(parser: HermesToolParser, chunks: list[str]) -> list[ToolStreamDelta]:
    return [parser.feed(c) for c in chunks] + [parser.finish()]


def shape(calls: list[ToolCall]) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in calls]


def test_single_call_keeps_the_models_argument_text() -> None:
    text = call_block("get_weather", {"city": "Paris", "days": [1, 2]})
    content, calls = HermesToolParser().parse(text)
    assert content == ""
    assert shape(calls) == [("get_weather", '{"city": "Paris", "days": [1, 2]}')]
    assert calls[0].id.startswith("call_") and len(calls[0].id) == 29


def test_text_before_between_and_after_calls() -> None:
    text = (
        "Let me look that up.\n\n"
        + call_block("a", {"x": 1})
        + "\n"
        + call_block("b", {})
        + "\n\nDone."
    )
    content, calls = HermesToolParser().parse(text)
    assert content == "Let me look that up.Done."
    assert shape(calls) == [("a", '{"x": 1}'), ("b", "{}")]


def test_compact_body_parameters_key_and_missing_arguments() -> None:
    text = '<tool_call>{"name":"f","parameters":{"q":"x"}}</tool_call><tool_call>{"name": "g"}</tool_call>'
    assert shape(HermesToolParser().parse(text)[1]) == [("f", '{"q":"x"}'), ("g", "{}")]


def test_arguments_before_name() -> None:
    text = '<tool_call>\n{"arguments": {"a": "}"}, "name": "f"}\n</tool_call>'
    assert shape(HermesToolParser().parse(text)[1]) == [("f", '{"a": "}"}')]


@pytest.mark.parametrize(
    "block",
    [
        "<tool_call>\nnot json at all\n</tool_call>",
        '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>',  # arguments as a string
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n{"name": "f", "name": "g", "arguments": {}}\n</tool_call>',
        '<tool_call>\n["f", {}]\n</tool_call>',
        "<tool_call>\n{\n</tool_call>",
        "<tool_call></tool_call>",
    ],
)
def test_invalid_blocks_stay_content_in_both_modes(block: str) -> None:
    text = "Before " + block + " after"
    content, calls = HermesToolParser().parse(text)
    assert calls == [] and content == text
    for cuts in ([], list(range(len(text))), [len(text) // 2], [9, 20, 33]):
        got_content, got_calls = aggregate(stream(HermesToolParser(), split(text, cuts)))
        assert (got_content, got_calls) == (text, [])


@pytest.mark.parametrize(
    ("block", "content"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>', "Beforeafter"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1}} junk\n</tool_call>', "Beforeafter"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": 1', "Before"),  # cut off
    ],
)
def test_json_broken_after_the_call_was_announced(block: str, content: str) -> None:
    """The documented divergence: one-shot sees content, streaming keeps what it sent."""
    text = "Before " + block + (" after" if block.endswith("</tool_call>") else "")
    assert HermesToolParser().parse(text) == (text, [])
    parser = HermesToolParser()
    got_content, got_calls = aggregate(stream(parser, list(text)))
    assert got_content == content
    assert [c.name for c in got_calls] == ["f"] and '{"a": 1}'.startswith(got_calls[0].arguments)
    assert parser.calls_started == 1 and parser.completed == []


def test_unknown_function_is_content_when_tool_names_given() -> None:
    text = call_block("rm_rf", {})
    assert HermesToolParser(tool_names=["get_weather"]).parse(text) == (text, [])
    assert aggregate(stream(HermesToolParser(tool_names=["get_weather"]), list(text))) == (text, [])
    assert len(HermesToolParser().parse(text)[1]) == 1


def test_valid_call_without_end_tag_at_end_of_output() -> None:
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
    content, calls = HermesToolParser().parse(text)
    assert content == "Sure." and shape(calls) == [("f", '{"a": 1}')]
    got_content, got_calls = aggregate(stream(HermesToolParser(), list(text)))
    assert got_content == "Sure." and shape(got_calls) == [("f", '{"a": 1}')]


def test_streaming_delta_shape() -> None:
    text = "Hi " + call_block("get_weather", {"city": "Paris"}) + call_block("f", {"k": [1, 2]})
    parser = HermesToolParser()
    deltas = stream(parser, [text[i : i + 3] for i in range(0, len(text), 3)])
    fragments = [f for d in deltas for f in d.tool_calls]
    firsts = [f for f in fragments if f.id is not None]
    assert [(f.index, f.name) for f in firsts] == [(0, "get_weather"), (1, "f")]
    assert all(f.name is None for f in fragments if f.id is None)
    assert len({f.id for f in firsts}) == 2
    for index, expected in ((0, '{"city": "Paris"}'), (1, '{"k": [1, 2]}')):
        assert "".join(f.arguments for f in fragments if f.index == index) == expected
    # OpenAI streaming shape, accepted by the official SDK's delta type.
    first = firsts[0].to_openai()
    assert first["type"] == "function" and first["function"]["name"] == "get_weather"
    ChoiceDeltaToolCall.model_validate(first)
    later = next(f for f in fragments if f.id is None).to_openai()
    assert set(later) == {"index", "function"} and set(later["function"]) == {"arguments"}
    ChoiceDeltaToolCall.model_validate(later)
    assert (
        firsts[0].to_protocol().model_dump(exclude_none=True)["function"]["name"] == "get_weather"
    )
    assert parser.calls_started == 2
    assert shape(parser.completed) == [("get_weather", '{"city": "Paris"}'), ("f", '{"k": [1, 2]}')]
    assert "".join(d.content for d in deltas) == "Hi"


def test_nothing_leaks_before_a_tag_is_decided() -> None:
    parser = HermesToolParser()
    assert parser.feed("Checking <tool") == ToolStreamDelta(content="Checking")  # " <tool" held
    out = parser.feed('_call>\n{"name": "f", "argu')
    assert out.content == "" and out.tool_calls == []  # name known, arguments not started
    out = parser.feed('ments": {"a": ')
    assert [(f.name, f.arguments) for f in out.tool_calls] == [("f", '{"a": ')]
    out = parser.feed("1}}\n</tool_call>\n\nok")
    assert [f.arguments for f in out.tool_calls] == ["1}"] and out.content == "ok"
    assert parser.finish() == ToolStreamDelta()


def test_partial_tag_that_is_not_a_tag_is_released() -> None:
    parser = HermesToolParser()
    assert parser.feed("a <tool") == ToolStreamDelta(content="a")
    assert parser.feed("box>") == ToolStreamDelta(content=" <toolbox>")


def test_long_arguments_stream_linearly_and_exactly() -> None:
    args = {"code": "print('x')\n" * 400, "path": "a.py"}
    text = call_block("write_file", args)
    deltas = stream(HermesToolParser(), [text[i : i + 4] for i in range(0, len(text), 4)])
    _, calls = aggregate(deltas)
    assert json.loads(calls[0].arguments) == args


def test_registry_names_give_hermes() -> None:
    for name in ("hermes", "qwen", "qwen25", "qwen3"):
        assert isinstance(get_tool_parser(name), HermesToolParser)
    with pytest.raises(KeyError, match=r"known: .*hermes"):
        get_tool_parser("nope")


# ---------------------------------------------------------------- properties

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
PLAIN = st.text(alphabet=st.sampled_from(list('ab <>/_tool\n é{}"')), max_size=12)


@st.composite
def call_texts(draw: st.DrawFn) -> tuple[str, Any]:
    name = draw(NAMES)
    args = draw(st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3))
    indent = draw(st.sampled_from([None, 1]))
    args_text = json.dumps(args, indent=indent, ensure_ascii=draw(st.booleans()))
    key = draw(st.sampled_from(["arguments", "parameters"]))
    name_first = draw(st.booleans())
    pairs = [f'"name": {json.dumps(name)}', f'"{key}": {args_text}']
    if not name_first:
        pairs.reverse()
    ws = draw(st.sampled_from(["", "\n", " ", "\n\n"]))
    body = ws + "{" + ", ".join(pairs) + "}" + ws
    return f"<tool_call>{body}</tool_call>", (name, args, args_text)


@st.composite
def outputs(draw: st.DrawFn) -> tuple[str, list[tuple[str, Any, str]]]:
    parts: list[str] = [draw(PLAIN)]
    expected = []
    for _ in range(draw(st.integers(0, 3))):
        block, call = draw(call_texts())
        parts += [block, draw(PLAIN)]
        expected.append(call)
    text = "".join(parts)
    assume(
        text.count("<tool_call>") == len(expected) and text.count("</tool_call>") == len(expected)
    )
    return text, expected


@settings(max_examples=250, deadline=None)
@given(sample=outputs(), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_streaming_equals_one_shot(
    sample: tuple[str, list[tuple[str, Any, str]]], cuts: list[int]
) -> None:
    text, expected = sample
    content, calls = HermesToolParser().parse(text)
    assert [(c.name, c.arguments) for c in calls] == [(n, a) for n, _, a in expected]
    assert [json.loads(c.arguments) for c in calls] == [obj for _, obj, _ in expected]

    deltas = stream(HermesToolParser(), split(text, cuts))
    streamed_content, streamed_calls = aggregate(deltas)
    assert streamed_content == content
    assert shape(streamed_calls) == shape(calls)
    # Content is never taken back: each partial concatenation is a prefix of the result.
    so_far = ""
    for delta in deltas:
        so_far += delta.content
        assert content.startswith(so_far)
        assert "<tool_call>" not in delta.content


NOISE = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<tool",
        "_call>",
        "</tool_",
        '{"name": "f", "arguments": {',
        '{"name": "f", "arguments": {"a": 1}}',
        '<tool_call>{"name": "h", "arguments": {}}</tool_call>',
        '{"name": "g"',
        '"a": [1, "}"]',
        "}",
        "}}",
        ", ",
        "x",
        " ",
        "\n",
        "{",
    ]
)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(NOISE, max_size=12), cuts=st.lists(st.integers(0, 150), max_size=10))
def test_arbitrary_text_agrees_unless_a_sent_call_broke(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces)
    content, calls = HermesToolParser().parse(text)
    parser = HermesToolParser()
    deltas = stream(parser, split(text, cuts))
    streamed_content, streamed_calls = aggregate(deltas)
    if parser.calls_started == len(parser.completed):  # no announced call turned invalid
        assert streamed_content == content
        assert shape(streamed_calls) == shape(calls)
    so_far = ""
    for delta in deltas:
        so_far += delta.content
        assert streamed_content.startswith(so_far)
