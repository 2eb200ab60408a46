"""Values written as text, read by the tool's schema (parsers/tool_calls/values.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.parsers.tool_calls.values import declared_types, json_text, object_prefix, typed_value


def test_declared_types_from_type_unions_and_enums() -> None:
    assert declared_types(None) == set() and declared_types({}) == set()
    assert declared_types({"type": "integer"}) == {"integer"}
    assert declared_types({"type": ["string", "null"]}) == {"string", "null"}
    assert declared_types({"anyOf": [{"type": "number"}, {"oneOf": [{"type": "boolean"}]}]}) == {"number", "boolean"}
    assert declared_types({"enum": ["a", 1]}) == {"string", "number"}


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        (" 42 ", {"type": "string"}, " 42 "),  # strings are kept exactly
        ("42", {"type": "integer"}, 42),
        ("3", {"type": "number"}, 3),
        ("True", {"type": "boolean"}, True),  # models write Python's spelling too
        ("none", {"type": ["integer", "null"]}, None),
        ("['a', 'b']", {"type": "array"}, ["a", "b"]),
        ("(1, 2)", {"type": "array"}, [1, 2]),
        ('{"k": 1}', {"type": "object"}, {"k": 1}),
        ("not a number", {"type": "integer"}, "not a number"),  # does not fit: stays text, the call survives
        ("1.5", {"type": "integer"}, "1.5"),
        ("[1, 2]", None, [1, 2]),  # no schema: JSON if it parses
        ("Paris", None, "Paris"),
    ],
)
def test_typed_values(text: str, schema: dict[str, Any] | None, value: Any) -> None:
    assert typed_value(text, schema) == value


def test_object_prefixes_grow_into_the_final_object() -> None:
    one = object_prefix([("city", "Paris")], closed=False)
    two = object_prefix([("city", "Paris"), ("days", 3)], closed=False)
    final = object_prefix([("city", "Paris"), ("days", 3)], closed=True)
    assert two.startswith(one) and final.startswith(two) and final == '{"city": "Paris", "days": 3}'
    assert object_prefix([], closed=True) == "{}"
    assert json_text("é") == '"é"'  # not escaped to \\u00e9
