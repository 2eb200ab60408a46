"""Reading JSON call objects and JSON argument objects inside a section.

Complete values are decoded by the standard library's ``raw_decode`` (which
reports where a value ends) and unfinished ones judged by
``partial-json-parser`` (through ``json_scan.prefix_state``); nothing here
counts braces. Argument text is always the model's own slice of the output.
"""

from __future__ import annotations

import json

from gateway.parsers.json_scan import prefix_state, scan_call
from gateway.parsers.tool_calls.section import CallView, GrowthCache

_DECODER = json.JSONDecoder()


def object_end(text: str, i: int, cache: GrowthCache | None = None) -> int | None:
    """End of the JSON object at ``text[i]``; None while unfinished; raises ValueError if invalid."""
    if i >= len(text):
        return None
    if text[i] != "{":
        raise ValueError("not an object")
    if cache is not None:
        skip_decode, skip_check = cache.skip(text, i)
        if skip_decode:
            if skip_check:
                cache.note(text, i, validated=False)
                return None
            if prefix_state(text[i:]) == "invalid":
                raise ValueError("not a JSON prefix")
            cache.note(text, i, validated=True)
            return None
    try:
        value, end = _DECODER.raw_decode(text, i)
    except ValueError:
        if cache is not None and cache.skip(text, i)[1]:
            cache.note(text, i, validated=False)
            return None
        if prefix_state(text[i:]) == "invalid":
            raise
        if cache is not None:
            cache.note(text, i, validated=True)
        return None
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return end


def arguments_view(
    text: str, i: int, name: str | None, cache: GrowthCache | None = None
) -> tuple[CallView, int | None]:
    """The call whose arguments object starts at ``i`` (or is still to come): view and end."""
    end = object_end(text, i, cache)
    if end is None:
        return CallView(name=name, arguments=text[i:]), None
    return CallView(name=name, arguments=text[i:end], done=True), end


def call_object_view(
    text: str, i: int, cache: GrowthCache | None = None
) -> tuple[CallView, int | None]:
    """A ``{"name": ..., "arguments"|"parameters": {...}}`` object at ``i``: view and end.

    Raises ValueError when it cannot be such an object.
    """
    check = True
    if cache is not None:
        _, skip_check = cache.skip(text, i)
        check = not skip_check
        cache.note(text, i, validated=check)
    scan = scan_call(text, i, check_args_prefix=check)
    if scan.status == "invalid":
        raise ValueError("not a call object")
    if scan.args_start is None:
        args = "{}" if scan.status == "complete" else ""
    else:
        stop = scan.args_end if scan.args_end is not None else len(text)
        args = text[scan.args_start : stop]
    if scan.status == "complete":
        if scan.name is None:
            raise ValueError("call object without a name")
        return CallView(name=scan.name, arguments=args, done=True), scan.end
    # The name is only announced once the arguments began: until then a later key
    # could still make the object invalid without anything having been streamed.
    name = scan.name if scan.args_start is not None else None
    return CallView(name=name, arguments=args if name else ""), None
