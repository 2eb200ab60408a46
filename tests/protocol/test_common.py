"""Request pieces the OpenAI endpoints share (protocol/common.py): null means default,
JSON and schema bounds checked without recursion, stop/logit_bias/rid/regex rules, tools
and response formats."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.protocol import limits
from gateway.protocol.common import (
    MAX_REQUEST_ID,
    AllowedTool,
    FunctionDefinition,
    ResponseFormat,
    SamplingRequest,
    check_logit_bias,
    check_regex,
    check_rid,
    check_schema_bounds,
    check_schema_text,
    check_stop,
    json_text_too_deep,
    schema_depth,
    stop_list,
)
from gateway.protocol.errors import validation_error_to_gateway


def _param(model: type[Any], body: dict[str, Any]) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(body)
    err = validation_error_to_gateway(exc.value)
    return err.param, err.message


def test_null_means_the_default_and_extras_are_ignored() -> None:
    req = SamplingRequest.model_validate({"n": None, "stream": None, "min_tokens": None, "temperature": None, "x": 1})
    assert (req.n, req.stream, req.min_tokens, req.temperature) == (1, False, 0, None)
    assert not hasattr(req, "x")


def test_json_depth_is_found_without_parsing_and_strings_do_not_count() -> None:
    assert not json_text_too_deep("[[[]]]", limit=3)
    assert json_text_too_deep("[[[[]]]]", limit=3)
    assert not json_text_too_deep('["[[[[[[", "{{{{{{"]', limit=3)  # brackets inside strings
    assert not json_text_too_deep('["\\"[[[[[["]', limit=3)  # an escaped quote does not end the string
    assert json_text_too_deep("[" * 100_000, limit=limits.MAX_JSON_DEPTH)  # no recursion, no crash


def test_schema_depth_stops_counting_past_the_limit() -> None:
    assert schema_depth(1) == 0 and schema_depth({}) == 1 and schema_depth({"a": [{"b": 1}]}) == 3
    deep: Any = 0
    for _ in range(10_000):
        deep = [deep]
    assert schema_depth(deep, limit=5) == 6


def test_schema_bounds() -> None:
    ok = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert check_schema_bounds(ok, "s") is ok
    with pytest.raises(ValueError, match="bytes when serialized"):
        check_schema_bounds({"enum": ["x" * limits.MAX_SCHEMA_BYTES]}, "the schema")
    nested: dict[str, Any] = {}
    for _ in range(limits.MAX_SCHEMA_DEPTH + 1):
        nested = {"a": nested}
    with pytest.raises(ValueError, match="nested deeper"):
        check_schema_bounds(nested, "the schema")


def test_schema_text_and_regex_must_be_usable() -> None:
    assert check_schema_text(None) is None and check_schema_text("true") == "true"
    assert check_schema_text(json.dumps({"type": "object"})) is not None
    for bad, match in [("{", "not valid JSON"), ("[1]", "must be a JSON object"), ("x" * (limits.MAX_SCHEMA_BYTES + 1), "larger")]:
        with pytest.raises(ValueError, match=match):
            check_schema_text(bad)
    assert check_regex(r"\d+") == r"\d+" and check_regex(None) is None
    with pytest.raises(ValueError, match="does not compile"):
        check_regex("(unclosed")


def test_stop_rid_and_logit_bias_rules() -> None:
    assert stop_list(None) == [] and stop_list("x") == ["x"] and stop_list(["a", "b"]) == ["a", "b"]
    assert check_stop("x") == "x"
    with pytest.raises(ValueError, match="empty"):
        check_stop(["a", ""])
    with pytest.raises(ValueError, match="at most"):
        check_stop(["s"] * (limits.MAX_STOP_SEQUENCES + 1))
    assert check_rid(["a", "b"]) == ["a", "b"] and check_rid(None) is None
    for bad in ["", "x" * (MAX_REQUEST_ID + 1), "line\nbreak", ["ok", ""]]:
        with pytest.raises(ValueError, match="printable"):
            check_rid(bad)
    assert check_logit_bias({"007": 5, "3": -100}) == {"7": 5.0, "3": -100.0}  # keys normalised
    for bad, match in [({"x": 1}, "not a token id"), ({"-1": 1}, "not a token id"), ({"1": 101}, "between")]:
        with pytest.raises(ValueError, match=match):
            check_logit_bias(bad)


def test_sampling_request_field_rules_name_the_field() -> None:
    assert _param(SamplingRequest, {"stream_options": {"include_usage": True}})[0] == "stream_options"
    assert _param(SamplingRequest, {"n": True})[0] == "n"  # JSON true is not 1
    assert _param(SamplingRequest, {"stop_token_ids": [1, -2]})[0] == "stop_token_ids"
    assert _param(SamplingRequest, {"ebnf": "x" * (limits.MAX_SCHEMA_BYTES + 1)})[0] == "ebnf"
    assert _param(SamplingRequest, {"logit_bias": {"a": 1}})[0] == "logit_bias"
    streamed = SamplingRequest.model_validate({"stream": True, "stream_options": {"include_usage": True}})
    assert streamed.include_usage_in_stream and not streamed.continuous_usage
    assert not SamplingRequest.model_validate({}).include_usage_in_stream


def test_tools_and_response_formats() -> None:
    assert FunctionDefinition.model_validate({"name": "a.b-c_1", "parameters": {"type": ["object", "null"]}})
    for body, param in [
        ({"name": "has space"}, "name"),
        ({"name": "f", "parameters": {"type": "array"}}, "parameters"),
    ]:
        assert _param(FunctionDefinition, body)[0] == param
    assert AllowedTool.model_validate({"type": "function", "name": "flat"}).function_name == "flat"
    assert AllowedTool.model_validate({"function": {"name": "nested"}}).function_name == "nested"
    assert _param(ResponseFormat, {"type": "json_schema"})[0] == "json_schema"
    fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})
    assert fmt.json_schema is not None and fmt.json_schema.schema_ == {"type": "object"} and fmt.json_schema.name == "response"
