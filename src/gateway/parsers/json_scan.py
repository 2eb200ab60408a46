"""Find the parts of a (possibly still incomplete) ``{"name": ..., "arguments": {...}}`` object.

Tool-call streaming needs three facts about a JSON text that is still growing:
is it still a valid prefix, is the function name complete, and where does the
raw text of the arguments value start and (once known) end. Values are parsed
by the standard library's ``json.JSONDecoder.raw_decode`` (which reports where
a complete value ends) and prefixes are judged by ``partial-json-parser``, so
nothing here counts braces by hand; this module only steps over the top-level
``key: value`` pairs between them.

The arguments are kept as the model wrote them (a slice of its output), so the
streamed fragments concatenate to exactly the final ``arguments`` string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from partial_json_parser import Allow, ensure_json
from partial_json_parser.core.exceptions import PartialJSON

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"

ARGUMENT_KEYS = ("arguments", "parameters")
"""Keys accepted for a call's arguments (Hermes/Qwen write ``arguments``; some
models and SGLang's ``required`` convention write ``parameters``)."""

Status = Literal["incomplete", "complete", "invalid"]


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def prefix_state(text: str) -> Status:
    """Whether ``text`` is a complete JSON value, a valid prefix of one, or neither."""
    try:
        _DECODER.decode(text)
        return "complete"
    except ValueError:
        pass
    try:
        json.loads(ensure_json(text, Allow.ALL))
    except PartialJSON:
        return "incomplete"  # e.g. a lone "-": partial, nothing to complete it with yet
    except Exception:  # the library raises assorted errors (IndexError...) on malformed input
        return "invalid"
    return "incomplete"


@dataclass(slots=True)
class CallScan:
    """What is known so far about one call object starting at ``start``.

    ``args_start``/``args_end`` index the raw arguments value in the scanned
    text (``args_end`` None while that value is incomplete); ``end`` is the index
    just after the closing brace once the object is complete.
    """

    status: Status
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    end: int | None = None
    has_args_key: bool = False

    @property
    def args_started(self) -> bool:
        return self.args_start is not None


def scan_call(
    text: str, start: int = 0, *, name_key: str = "name", check_args_prefix: bool = True
) -> CallScan:
    """Scan the call object beginning at ``text[start:]`` (leading whitespace allowed).

    Invalid means: not a JSON object prefix, a name that is not a non-empty
    string, arguments that are not an object, or a repeated name/arguments key.
    ``check_args_prefix=False`` trusts an unfinished arguments value instead of
    re-validating it (a streaming caller re-checks it only now and then, keeping
    a long call's total cost linear rather than quadratic).
    """
    scan = CallScan(status="incomplete")
    n = len(text)
    i = skip_ws(text, start)
    if i == n:
        return scan
    if text[i] != "{":
        return _invalid(scan)
    i += 1
    expect_key = True  # after "{" or ","
    first = True
    while True:
        i = skip_ws(text, i)
        if i == n:
            return scan
        if text[i] == "}" and first:
            scan.status, scan.end = "complete", i + 1
            return scan
        if not expect_key or text[i] != '"':
            return _invalid(scan)
        first = False
        try:
            key, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return scan if prefix_state(text[i:]) == "incomplete" else _invalid(scan)
        i = skip_ws(text, i)
        if i == n:
            return scan
        if text[i] != ":":
            return _invalid(scan)
        i = skip_ws(text, i + 1)
        if i == n:
            return scan
        is_args = key in ARGUMENT_KEYS
        if is_args:
            if scan.has_args_key or text[i] != "{":
                return _invalid(scan)
            scan.has_args_key = True
            scan.args_start = i
        elif key == name_key and (scan.name is not None or text[i] != '"'):
            return _invalid(scan)
        try:
            value, value_end = _DECODER.raw_decode(text, i)
        except ValueError:
            if is_args and not check_args_prefix:
                return scan
            return scan if prefix_state(text[i:]) == "incomplete" else _invalid(scan)
        if key == name_key:
            if not isinstance(value, str) or not value:
                return _invalid(scan)
            scan.name = value
        elif is_args:
            scan.args_end = value_end
        i = skip_ws(text, value_end)
        if i == n:
            return scan
        if text[i] == ",":
            i += 1
            expect_key = True
            continue
        if text[i] == "}":
            scan.status, scan.end = "complete", i + 1
            return scan
        return _invalid(scan)


def _invalid(scan: CallScan) -> CallScan:
    scan.status = "invalid"
    return scan


def parse_call(text: str, *, name_key: str = "name") -> tuple[str, str] | None:
    """``(name, arguments_json)`` if ``text`` is exactly one valid call object, else None.

    ``arguments_json`` is the raw arguments text, or ``"{}"`` when the object has none.
    """
    scan = scan_call(text, name_key=name_key)
    if scan.status != "complete" or scan.name is None or scan.end is None:
        return None
    if text[scan.end :].strip(_WS):
        return None
    if scan.args_start is None or scan.args_end is None:
        return scan.name, "{}"
    return scan.name, text[scan.args_start : scan.args_end]
