"""tool_choice: constraint schemas, the constrained-output parsers, the registry."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.parsers import (
    HermesToolParser,
    NamedToolCallParser,
    Qwen3ReasoningParser,
    RequiredToolCallParser,
    ToolCallParser,
    aggregate,
    default_parsers,
    get_reasoning_parser,
    reasoning_parser_for_request,
    reasoning_parser_names,
    tool_choice_constraint,
    tool_parser_for_choice,
    tool_parser_names,
)
from gateway.protocol import ChatCompletionRequest, InvalidRequestError, sampling_from_chat

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}},
            "required": ["city"],
            "$defs": {"Unit": {"enum": ["c", "f"]}},
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, CLOCK]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(text[last:p])
        last = p
    pieces.append(text[last:])
    return pieces


def stream(parser: ToolCallParser, chunks: list[str]) -> tuple[str, list[tuple[str, str]]]:
    content, calls = aggregate([parser.feed(c) for c in chunks] + [parser.finish()])
    return content, [(c.name, c.arguments) for c in calls]


def test_auto_and_none_need_no_constraint() -> None:
    assert tool_choice_constraint(TOOLS, "auto") is None
    assert tool_choice_constraint(TOOLS, "none") is None
    assert tool_choice_constraint(TOOLS, None) is None


def test_named_function_constrains_to_its_parameters() -> None:
    named = tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert named is not None and named.kind == "json_schema"
    assert json.loads(named.value) == WEATHER["function"]["parameters"]
    bare = tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert bare is not None and json.loads(bare.value) == {"type": "object", "properties": {}}
    with pytest.raises(InvalidRequestError, match="not in tools"):
        tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "nope"}})


def test_required_builds_an_array_of_calls_with_lifted_defs() -> None:
    got = tool_choice_constraint(TOOLS, "required")
    assert got is not None
    schema = json.loads(got.value)
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    assert schema["$defs"] == {"Unit": {"enum": ["c", "f"]}}
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert "$defs" not in schema["items"]["anyOf"][0]["properties"]["parameters"]
    single = tool_choice_constraint(TOOLS, "required", parallel_tool_calls=False)
    assert single is not None and json.loads(single.value)["maxItems"] == 1

    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    validator = jsonschema_rs.validator_for(schema)
    assert validator.is_valid(
        [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}]
    )
    assert validator.is_valid(
        [{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}]
    )
    assert not validator.is_valid([])
    assert not validator.is_valid(
        [{"name": "get_weather", "parameters": {"unit": "c"}}]
    )  # city missing
    assert not validator.is_valid(
        [{"name": "get_weather", "parameters": {"city": "P", "unit": "k"}}]
    )
    assert not validator.is_valid([{"name": "rm", "parameters": {}}])


def test_required_rejects_conflicting_defs_and_empty_tools() -> None:
    other = json.loads(json.dumps(WEATHER))
    other["function"]["name"] = "other"
    other["function"]["parameters"]["$defs"]["Unit"] = {"enum": ["k"]}
    with pytest.raises(InvalidRequestError, match="Unit"):
        tool_choice_constraint([WEATHER, other], "required")
    with pytest.raises(InvalidRequestError):
        tool_choice_constraint([], "required")


def test_pipeline_flow_from_a_chat_request() -> None:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "required"}
    )
    constraint = tool_choice_constraint(
        req.tools_json(), req.tool_choice_json(), parallel_tool_calls=req.parallel_tool_calls
    )
    opts = sampling_from_chat(req).with_constraint(constraint)
    assert opts.constraint is not None and opts.constraint.kind == "json_schema"
    assert isinstance(
        tool_parser_for_choice(req.tool_choice_json(), req.tools_json(), "hermes"),
        RequiredToolCallParser,
    )
    clash = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "tools": TOOLS,
            "tool_choice": "required",
            "regex": "a",
        }
    )
    with pytest.raises(InvalidRequestError):
        sampling_from_chat(clash).with_constraint(
            tool_choice_constraint(clash.tools_json(), "required")
        )


def test_parser_for_each_tool_choice() -> None:
    assert tool_parser_for_choice("none", TOOLS, "hermes") is None
    assert tool_parser_for_choice("auto", [], "hermes") is None
    assert tool_parser_for_choice("auto", TOOLS, None) is None
    auto = tool_parser_for_choice("auto", TOOLS, "hermes")
    assert isinstance(auto, HermesToolParser) and auto.tool_names == {"get_weather", "get_time"}
    named = tool_parser_for_choice(
        {"type": "function", "function": {"name": "get_time"}}, TOOLS, None
    )
    assert isinstance(named, NamedToolCallParser) and named.name == "get_time"
    assert isinstance(tool_parser_for_choice("required", TOOLS, None), RequiredToolCallParser)


# ---------------------------------------------------------------- named


def test_named_output_is_the_arguments_object() -> None:
    text = ' {"city": "Paris", "unit": "c"}\n'
    content, calls = NamedToolCallParser("get_weather").parse(text)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris", "unit": "c"}')
    ]
    parser = NamedToolCallParser("get_weather")
    first = parser.feed(" ")
    assert not first  # whitespace alone decides nothing
    header = parser.feed('{"ci')
    assert header.tool_calls[0].id is not None and header.tool_calls[0].name == "get_weather"
    assert header.tool_calls[0].arguments == '{"ci'
    assert parser.calls_started == 1


def test_named_output_that_is_not_json_is_content() -> None:
    assert NamedToolCallParser("f").parse("I refuse.") == ("I refuse.", [])
    assert stream(NamedToolCallParser("f"), list("I refuse.")) == ("I refuse.", [])
    assert NamedToolCallParser("f").parse("  ") == ("  ", [])


def test_named_truncated_output_keeps_partial_arguments() -> None:
    content, calls = NamedToolCallParser("f").parse('{"a": [1, 2')
    assert content == "" and calls[0].arguments == '{"a": [1, 2'


# ---------------------------------------------------------------- required


def test_required_output_is_a_list_of_calls() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    content, calls = RequiredToolCallParser().parse(text)
    assert content == ""
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]
    assert len({c.id for c in calls}) == 2


def test_required_item_without_parameters_and_garbage() -> None:
    assert [
        (c.name, c.arguments) for c in RequiredToolCallParser().parse('[{"name": "get_time"}]')[1]
    ] == [("get_time", "{}")]
    assert RequiredToolCallParser().parse("no calls here") == ("no calls here", [])
    assert RequiredToolCallParser().parse("[1, 2]") == ("[1, 2]", [])
    kept = RequiredToolCallParser().parse('[{"name": "a", "parameters": {}}, 7]')[1]
    assert [c.name for c in kept] == ["a"]  # a later bad item cannot recall the first


def test_required_streams_each_call() -> None:
    parser = RequiredToolCallParser()
    text = (
        '[\n  {"name": "a", "parameters": {"x": "}]"}},\n  {"parameters": {"y": 2}, "name": "b"}\n]'
    )
    outs = [parser.feed(text[i : i + 5]) for i in range(0, len(text), 5)] + [parser.finish()]
    fragments = [f for o in outs for f in o.tool_calls]
    assert [(f.index, f.name) for f in fragments if f.id] == [(0, "a"), (1, "b")]
    assert "".join(f.arguments for f in fragments if f.index == 0) == '{"x": "}]"}'
    assert "".join(f.arguments for f in fragments if f.index == 1) == '{"y": 2}'
    assert all(not o.content for o in outs)


ARGS = st.dictionaries(
    st.text(max_size=4),
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=3),
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["a", "b_c"]), ARGS, st.booleans()), min_size=1, max_size=3
    ),
    indent=st.sampled_from([None, 2]),
    cuts=st.lists(st.integers(0, 300), max_size=10),
)
def test_required_streaming_equals_one_shot(
    calls: list[tuple[str, dict[str, Any], bool]], indent: int | None, cuts: list[int]
) -> None:
    items = [
        {"name": n, "parameters": a} if name_first else {"parameters": a, "name": n}
        for n, a, name_first in calls
    ]
    text = json.dumps(items, indent=indent)
    content, parsed = RequiredToolCallParser().parse(text)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == [(n, a) for n, a, _ in calls]
    assert stream(RequiredToolCallParser(), split(text, cuts)) == (
        content,
        [(c.name, c.arguments) for c in parsed],
    )


@settings(max_examples=100, deadline=None)
@given(
    args=ARGS, indent=st.sampled_from([None, 2]), cuts=st.lists(st.integers(0, 200), max_size=10)
)
def test_named_streaming_equals_one_shot(
    args: dict[str, Any], indent: int | None, cuts: list[int]
) -> None:
    text = "\n" + json.dumps(args, indent=indent) + "\n"
    content, parsed = NamedToolCallParser("f").parse(text)
    assert content == "" and json.loads(parsed[0].arguments) == args
    assert stream(NamedToolCallParser("f"), split(text, cuts)) == ("", [("f", parsed[0].arguments)])


# ---------------------------------------------------------------- registry and chaining


def test_registry_and_defaults() -> None:
    assert {"deepseek-r1", "qwen3", "qwen3-thinking", "kimi", "glm45", "minimax", "gpt-oss", "none"} <= set(reasoning_parser_names())
    assert "hermes" in tool_parser_names()
    assert isinstance(get_reasoning_parser("qwen3"), Qwen3ReasoningParser)
    with pytest.raises(KeyError, match=r"known: deepseek-r1, .*qwen3"):
        get_reasoning_parser("o1")
    assert default_parsers("qwen3") == default_parsers("qwen3_moe")
    assert (default_parsers("qwen3").reasoning, default_parsers("qwen3").tool) == (
        "qwen3",
        "hermes",
    )
    assert default_parsers("qwen2", "Qwen2.5-7B-Instruct").reasoning is None
    assert default_parsers("qwen2", "Qwen/QwQ-32B").reasoning == "qwen3"
    assert default_parsers("deepseek_v3", "DeepSeek-R1").reasoning == "deepseek-r1"
    assert default_parsers("llama", "Llama-3.1-8B") == default_parsers(None)


def test_reasoning_parser_for_request() -> None:
    assert reasoning_parser_for_request(None) is None
    off = reasoning_parser_for_request("qwen3", chat_template_kwargs={"enable_thinking": False})
    assert off is not None and off.parse("<think>x</think>y") == (None, "<think>x</think>y")
    opened = reasoning_parser_for_request("qwen3", prompt_text="<|im_start|>assistant\n<think>\n")
    assert opened is not None and opened.parse("why</think>because") == ("why", "because")
    kept = reasoning_parser_for_request("qwen3", separate_reasoning=False)
    assert kept is not None and kept.parse("<think>x</think>y") == (None, "<think>x</think>y")


def test_reasoning_then_tools_chain_like_the_pipeline() -> None:
    text = (
        "<think>\nThe user wants weather; call the tool.\n</think>\n\n"
        'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    reasoning_parser, tool_parser = (
        Qwen3ReasoningParser(),
        HermesToolParser(tool_names=["get_weather"]),
    )
    reasoning = ""
    tool_deltas = []
    for i in range(0, len(text), 7):
        r, c = reasoning_parser.feed(text[i : i + 7])
        reasoning += r
        tool_deltas.append(tool_parser.feed(c))
    r, c = reasoning_parser.finish()
    reasoning += r
    tool_deltas += [tool_parser.feed(c), tool_parser.finish()]
    content, calls = aggregate(tool_deltas)
    assert reasoning == "The user wants weather; call the tool."
    assert content == "I will check."
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Paris"}')]
    one_shot_reasoning, one_shot_rest = Qwen3ReasoningParser().parse(text)
    assert one_shot_reasoning == reasoning
    assert HermesToolParser().parse(one_shot_rest)[0] == content
