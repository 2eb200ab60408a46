"""A still-growing ``{"name", "arguments"}`` object (parsers/json_scan.py): prefix states,
where the name and raw arguments are, and a whole call parsed exactly once."""

from __future__ import annotations

import pytest

from gateway.parsers.json_scan import parse_call, prefix_state, scan_call


@pytest.mark.parametrize(
    ("text", "state"),
    [('{"a": 1}', "complete"), ('{"a": [1, 2', "incomplete"), ("-", "incomplete"), ('{"a" 1}', "invalid"), ("}", "invalid")],
)
def test_prefix_states(text: str, state: str) -> None:
    assert prefix_state(text) == state


def test_scans_of_a_growing_call() -> None:
    text = 'x {"name": "get_time", "arguments": {"zone": "CET"}} y'
    done = scan_call(text, 2)
    assert done.status == "complete" and done.name == "get_time" and done.has_args_key
    assert text[done.args_start : done.args_end] == '{"zone": "CET"}' and text[done.end :] == " y"  # type: ignore[index]
    partial = scan_call('{"name": "get_time", "arguments": {"zo')
    assert partial.status == "incomplete" and partial.name == "get_time" and partial.args_started and partial.args_end is None
    named_late = scan_call('{"arguments": {}, "name": "f"}')
    assert named_late.status == "complete" and named_late.name == "f"
    assert scan_call('{"name": 5}').status == "invalid"
    assert scan_call('{"name": "f", "arguments": [1]}').status == "invalid"  # arguments must be an object
    assert scan_call('{"function": "f", "parameters": {}}', name_key="function").name == "f"


def test_parse_call_takes_exactly_one_object() -> None:
    assert parse_call('{"name": "f", "parameters": {"a": 1}}') == ("f", '{"a": 1}')
    assert parse_call(' {"name": "f"} \n') == ("f", "{}")
    assert parse_call('{"name": "f"} trailing') is None
    assert parse_call('{"name": "f", "arguments": {') is None
    assert parse_call('{"arguments": {}}') is None
