"""Argument values written as text (XML-style formats) turned into JSON by the tool's schema.

Qwen3-Coder, GLM-4.x, MiniMax-M2 and DeepSeek-V3.2 write each parameter's value
as bare text: their chat templates print strings as they are and everything
else as JSON (``tojson``). So a value is read by what the tool's JSON schema
declares for that parameter: ``string`` keeps the text, ``integer``/``number``/
``boolean``/``null``/``object``/``array`` parse it (JSON first, then a Python
literal, as models sometimes write ``True`` or single quotes), and a value that
does not parse as its declared type stays a string rather than failing the call.
Without a schema the text is JSON if it parses as JSON, else a string.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from typing import Any

_JSON_TYPES = ("integer", "number", "boolean", "null", "object", "array")


def declared_types(schema: Mapping[str, Any] | None) -> set[str]:
    """The JSON types a parameter schema allows (``type``, ``anyOf``/``oneOf``, ``enum``)."""
    if not schema:
        return set()
    out: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        out.add(kind)
    elif isinstance(kind, list):
        out.update(str(k) for k in kind)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                if isinstance(branch, Mapping):
                    out |= declared_types(branch)
    if not out and isinstance(schema.get("enum"), list):
        for value in schema["enum"]:
            out.add("string" if isinstance(value, str) else "number")
    return out


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(text) from None


def _fits(value: Any, types: set[str]) -> bool:
    checks = {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list | tuple),
        "string": lambda v: isinstance(v, str),
    }
    return any(checks[t](value) for t in types if t in checks)


def typed_value(text: str, schema: Mapping[str, Any] | None) -> Any:
    """The JSON value of one parameter written as ``text``."""
    types = declared_types(schema)
    if types == {"string"}:
        return text
    stripped = text.strip()
    if not types:
        try:
            return json.loads(stripped)
        except ValueError:
            return text
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if "null" in types and stripped.lower() in ("null", "none"):
        return None
    try:
        value = _literal(stripped)
    except ValueError:
        return text
    if isinstance(value, tuple):
        value = list(value)
    if _fits(value, types) or ("number" in types and isinstance(value, int)):
        return value
    return text


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def object_prefix(pairs: Sequence[tuple[str, Any]], *, closed: bool) -> str:
    """``{"k": v, ...`` for the pairs known so far, ``}`` added once the call is closed.

    Built the same way at every step, so each step's text is a prefix of the
    next one and the streamed argument fragments join to the final object.
    """
    body = ", ".join(f"{json_text(k)}: {json_text(v)}" for k, v in pairs)
    text = "{" + body
    return text + "}" if closed else text
