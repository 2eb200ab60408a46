"""Output constrained by ``tool_choice`` (parsers/constrained.py): the JSON schema each
choice asks the worker for, and the parsers reading the constrained output as calls."""

from __future__ import annotations

import json

import pytest

from gateway.parsers.constrained import (
    NamedToolCallParser,
    RequiredToolCallParser,
    aggregate,
    tool_choice_constraint,
)
from gateway.protocol.errors import InvalidRequestError
from tests.parsers.split_check import assert_tool_split_invariant
from tests.parsers.tool_calls.common import TIME, TOOLS


def test_a_named_choice_constrains_to_that_functions_parameters() -> None:
    c = tool_choice_constraint(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert c is not None and c.kind == "json_schema" and json.loads(c.value) == TIME["function"]["parameters"]
    bare = tool_choice_constraint([{"type": "function", "function": {"name": "f"}}], {"function": {"name": "f"}})
    assert bare is not None and json.loads(bare.value) == {"type": "object", "properties": {}}
    with pytest.raises(InvalidRequestError, match="'nope', which is not in tools"):
        tool_choice_constraint(TOOLS, {"function": {"name": "nope"}})
    assert tool_choice_constraint(TOOLS, "auto") is None and tool_choice_constraint(TOOLS, "none") is None


def test_required_constrains_to_an_array_of_known_calls() -> None:
    c = tool_choice_constraint(TOOLS, "required")
    assert c is not None
    schema = json.loads(c.value)
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    single = json.loads(tool_choice_constraint(TOOLS, "required", parallel_tool_calls=False).value)  # type: ignore[union-attr]
    assert single["maxItems"] == 1
    with pytest.raises(InvalidRequestError, match="needs tools"):
        tool_choice_constraint([], "required")


def test_required_merges_shared_defs_and_refuses_conflicting_ones() -> None:
    def tool(name: str, unit: dict[str, object]) -> dict[str, object]:
        return {"function": {"name": name, "parameters": {"type": "object", "$defs": {"unit": unit}}}}

    merged = json.loads(tool_choice_constraint([tool("a", {"type": "string"}), tool("b", {"type": "string"})], "required").value)  # type: ignore[union-attr]
    assert merged["$defs"] == {"unit": {"type": "string"}}
    with pytest.raises(InvalidRequestError, match=r"\$defs/unit differently"):
        tool_choice_constraint([tool("a", {"type": "string"}), tool("b", {"type": "integer"})], "required")


def test_the_named_parser_streams_the_arguments_object() -> None:
    content, calls = assert_tool_split_invariant(lambda: NamedToolCallParser("get_weather"), '  {"city": "Paris", "days": 3}  ')
    assert content == "" and calls == [("get_weather", {"city": "Paris", "days": 3})]
    assert NamedToolCallParser("f").parse("not json") == ("not json", [])  # a worker that ignored the constraint
    assert NamedToolCallParser("f").parse("   ") == ("   ", [])


def test_the_required_parser_streams_each_call_of_the_array() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, {"name": "get_time", "parameters": {"zone": "CET"}}]'
    content, calls = assert_tool_split_invariant(RequiredToolCallParser, text)
    assert content == "" and calls == [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]
    assert RequiredToolCallParser().parse("plain text") == ("plain text", [])
    assert RequiredToolCallParser().parse('[{"name": "f"}]')[1][0].arguments == "{}"


def test_aggregate_folds_fragments_like_a_client() -> None:
    parser = NamedToolCallParser("get_time")
    deltas = [parser.feed('{"zone"'), parser.feed(': "CET"}'), parser.finish()]
    content, calls = aggregate(deltas)
    assert content == "" and len(calls) == 1 and calls[0].arguments == '{"zone": "CET"}' and calls[0].id.startswith("call_")
