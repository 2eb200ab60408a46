"""JSON call and argument objects inside a section (parsers/tool_calls/json_calls.py):
where an object ends, unfinished objects judged as prefixes, and call objects named only
once their arguments began."""

from __future__ import annotations

import pytest

from gateway.parsers.tool_calls.json_calls import arguments_view, call_object_view, object_end
from gateway.parsers.tool_calls.section import GrowthCache


def test_object_end() -> None:
    text = 'x{"a": {"b": "}"}} tail'
    assert object_end(text, 1) == text.index(" tail")
    assert object_end('{"a": 1', 0) is None and object_end("", 0) is None
    with pytest.raises(ValueError):
        object_end("[1, 2]", 0)
    with pytest.raises(ValueError):
        object_end('{"a": 1 2', 0)  # cannot become an object


def test_object_end_with_the_growth_cache_agrees_at_the_close() -> None:
    cache = GrowthCache()
    full = '{"city": "' + "P" * 40 + '"}'
    for k in range(1, len(full)):
        assert object_end(full[:k], 0, cache) is None
    assert object_end(full, 0, cache) == len(full)


def test_arguments_view_grows_by_appending() -> None:
    view, end = arguments_view('{"zone": "C', 0, "get_time")
    assert (view.name, view.arguments, view.done, end) == ("get_time", '{"zone": "C', False, None)
    view, end = arguments_view('{"zone": "CET"} more', 0, "get_time")
    assert (view.arguments, view.done, end) == ('{"zone": "CET"}', True, 15)


def test_call_objects() -> None:
    text = '{"name": "get_time", "arguments": {"zone": "CET"}}'
    view, end = call_object_view(text, 0)
    assert (view.name, view.arguments, view.done, end) == ("get_time", '{"zone": "CET"}', True, len(text))
    view, end = call_object_view('{"name": "get_time", "parameters": {}}', 0)
    assert view.arguments == "{}" and view.done
    early, end = call_object_view('{"name": "get_time"', 0)
    assert early.name is None and early.arguments == "" and end is None  # named once the arguments begin
    started, _ = call_object_view('{"name": "get_time", "arguments": {"zo', 0)
    assert started.name == "get_time" and started.arguments == '{"zo'
    no_args, _ = call_object_view('{"name": "f"}', 0)
    assert no_args.arguments == "{}"
    with pytest.raises(ValueError):
        call_object_view('{"arguments": {}}', 0)
    with pytest.raises(ValueError):
        call_object_view("[1]", 0)
