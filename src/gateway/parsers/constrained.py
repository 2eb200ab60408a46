"""``tool_choice`` = ``required`` or a named function: constrain the output, then parse it.

With ``auto`` the model decides and the model's own format parser (Hermes...)
finds the calls. With ``required`` or a named function the pipeline instead
constrains decoding with a JSON schema, so the output has a fixed shape that
does not depend on the model family:

* named function ``f``: the whole output is ``f``'s arguments object, so the
  schema is ``f``'s ``parameters`` schema (``{"type": "object"}`` if it has
  none) and the call is ``f(output)``;
* ``required``: the output is a JSON array of ``{"name": ..., "parameters":
  {...}}`` objects, one per call, each item matching one declared tool
  (``anyOf``), at least one item (exactly one if ``parallel_tool_calls`` is
  false); ``$defs`` of the tools' schemas are lifted to the root so their
  ``$ref``s still resolve.

This is SGLang's convention for ``required``; for named functions SGLang's
newer releases reuse the one-item array form, while this gateway constrains
directly to the arguments object (the older SGLang and vLLM convention), so the
streamed arguments are the output text itself. Under a working constraint the
output is always well-formed; should it not be (a truncated output, a worker
ignoring the constraint), the parsers keep what was streamed as the calls'
arguments, and output that never started a call is returned as content.

For these parsers one-shot ``parse`` is defined as the streaming result over
the whole text, so the two modes agree by construction.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gateway.parsers.base import (
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolStreamDelta,
    new_tool_call_id,
)
from gateway.parsers.json_scan import scan_call, skip_ws
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.sampling import Constraint

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def _named(tool_choice: str | Mapping[str, Any] | None) -> str | None:
    if isinstance(tool_choice, Mapping):
        return str(tool_choice["function"]["name"])
    return None


def tool_choice_constraint(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: str | Mapping[str, Any] | None,
    *,
    parallel_tool_calls: bool = True,
) -> Constraint | None:
    """The ``json_schema`` constraint ``tool_choice`` calls for, or None (``auto``/``none``).

    ``tools`` are OpenAI tool dicts (``ChatCompletionRequest.tools_json()``),
    ``tool_choice`` its JSON form (``ChatCompletionRequest.tool_choice_json()``).
    """
    name = _named(tool_choice)
    if name is not None:
        for tool in tools:
            fn = _function(tool)
            if fn.get("name") == name:
                parameters = fn.get("parameters") or EMPTY_PARAMETERS
                return Constraint("json_schema", json.dumps(parameters, ensure_ascii=False))
        raise InvalidRequestError(
            f"tool_choice names function {name!r}, which is not in tools", param="tool_choice"
        )
    if tool_choice != "required":
        return None
    if not tools:
        raise InvalidRequestError("tool_choice 'required' needs tools", param="tool_choice")
    defs: dict[str, Any] = {}
    items: list[dict[str, Any]] = []
    for tool in tools:
        fn = _function(tool)
        params = dict(fn.get("parameters") or EMPTY_PARAMETERS)
        for def_name, def_schema in params.pop("$defs", {}).items():
            if def_name in defs and defs[def_name] != def_schema:
                raise InvalidRequestError(
                    f"tools define $defs/{def_name} differently; "
                    "tool_choice 'required' needs them to agree",
                    param="tools",
                )
            defs[def_name] = def_schema
        items.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [fn["name"]]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return Constraint("json_schema", json.dumps(schema, ensure_ascii=False))


def aggregate(deltas: Sequence[ToolStreamDelta]) -> tuple[str, list[ToolCall]]:
    """Fold streamed results into ``(content, calls)``, as a client assembling chunks would."""
    content = "".join(d.content for d in deltas)
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for fragment in delta.tool_calls:
            if fragment.id is not None:
                calls[fragment.index] = [fragment.id, fragment.name or "", fragment.arguments]
            else:
                calls[fragment.index][2] += fragment.arguments
    return content, [ToolCall(id=c[0], name=c[1], arguments=c[2]) for _, c in sorted(calls.items())]


class _StreamDefinedParser(ToolCallParser):
    """One-shot parse = feeding the whole text to a fresh instance and finishing."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        fresh = self._fresh()
        return aggregate([fresh.feed(text), fresh.finish()])

    @abstractmethod
    def _fresh(self) -> ToolCallParser:
        """A new parser with the same settings and no state."""


class NamedToolCallParser(_StreamDefinedParser):
    """Output constrained to the arguments object of one named function."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls_started = 0
        self._state: Literal["start", "args", "content"] = "start"
        self._buf = ""
        self._args_sent = 0
        self._scanned_to = 0  # how much of _buf was looked at for a closing "}"
        self._end: int | None = None  # end of the arguments object once it closed
        self._id = ""

    @property
    def held(self) -> str:
        return self._buf

    def _fresh(self) -> NamedToolCallParser:
        return NamedToolCallParser(self.name)

    def feed(self, delta: str) -> ToolStreamDelta:
        out = ToolStreamDelta()
        if self._state == "content":
            out.content = delta
            return out
        self._buf += delta
        if self._state == "start":
            head = self._buf.lstrip()
            if not head:
                return out
            if not head.startswith("{"):
                self._state = "content"
                out.content, self._buf = self._buf, ""
                return out
            self._buf = head
            self._state = "args"
            self._id = new_tool_call_id()
            self.calls_started = 1
            out.add_call_fragment(ToolCallDelta(index=0, id=self._id, name=self.name))
        self._send_args(out)
        return out

    def finish(self) -> ToolStreamDelta:
        out = ToolStreamDelta()
        if self._state == "start":
            out.content, self._buf = self._buf, ""
            self._state = "content"
        elif self._state == "args":
            self._send_args(out)
        return out

    def _send_args(self, out: ToolStreamDelta) -> None:
        # The object can only close at a "}", so it is re-decoded only when one arrived.
        if self._end is None and "}" in self._buf[self._scanned_to :]:
            try:
                self._end = json.JSONDecoder().raw_decode(self._buf)[1]
            except ValueError:
                pass
        self._scanned_to = len(self._buf)
        # Unfinished: all of it is arguments text except trailing whitespace, which
        # may yet turn out to follow the object.
        end = self._end if self._end is not None else len(self._buf.rstrip())
        if end > self._args_sent:
            out.add_call_fragment(
                ToolCallDelta(index=0, arguments=self._buf[self._args_sent : end])
            )
            self._args_sent = end


class RequiredToolCallParser(_StreamDefinedParser):
    """Output constrained to a JSON array of ``{"name", "parameters"}`` call objects."""

    def __init__(self) -> None:
        self.calls_started = 0
        self._state: Literal["start", "array", "done", "content"] = "start"
        self._buf = ""  # everything from the "[" on
        self._pos = 1  # where the current item (or the whitespace before it) starts
        self._new_item()

    @property
    def held(self) -> str:
        return self._buf

    def _new_item(self) -> None:
        self._header_sent = False
        self._args_sent = 0
        self._checked_len = 0
        self._item_end: int | None = None  # set once the current item's object is closed

    def _fresh(self) -> RequiredToolCallParser:
        return RequiredToolCallParser()

    def feed(self, delta: str) -> ToolStreamDelta:
        out = ToolStreamDelta()
        if self._state == "content":
            out.content = delta
            return out
        if self._state == "done":
            return out
        self._buf += delta
        if self._state == "start":
            head = self._buf.lstrip()
            if not head:
                return out
            if not head.startswith("["):
                self._state = "content"
                out.content, self._buf = self._buf, ""
                return out
            self._buf = head
            self._state = "array"
        self._walk(out)
        return out

    def finish(self) -> ToolStreamDelta:
        out = ToolStreamDelta()
        if self._state == "start":
            out.content, self._buf = self._buf, ""
        self._state = "done"
        return out

    def _walk(self, out: ToolStreamDelta) -> None:
        buf = self._buf
        while self._state == "array":
            if self._item_end is not None:
                j = skip_ws(buf, self._item_end)
                if j == len(buf):
                    return
                if buf[j] != ",":
                    self._state = "done"  # "]" closes the array; anything else is ignored
                    return
                self._pos = j + 1
                self._new_item()
            i = skip_ws(buf, self._pos)
            if i == len(buf):
                return
            if buf[i] == "]":
                self._state = "done"
                return
            check = not self._header_sent or len(buf) - i >= 2 * self._checked_len
            scan = scan_call(buf, i, check_args_prefix=check)
            if check:
                self._checked_len = len(buf) - i
            if scan.status == "invalid":
                if self.calls_started == 0:
                    self._state = "content"  # never looked like calls: hand it all back
                    out.content, self._buf = buf, ""
                else:
                    self._state = "done"  # keep what was streamed
                return
            if scan.args_start is None:
                args = ""
            else:
                stop = scan.args_end if scan.args_end is not None else len(buf.rstrip())
                args = buf[scan.args_start : max(stop, scan.args_start)]
            if not self._header_sent:
                if scan.name is None or not (scan.args_started or scan.status == "complete"):
                    return
                out.add_call_fragment(
                    ToolCallDelta(
                        index=self.calls_started,
                        id=new_tool_call_id(),
                        name=scan.name,
                        arguments=args,
                    )
                )
                self.calls_started += 1
                self._header_sent = True
                self._args_sent = len(args)
            elif len(args) > self._args_sent:
                out.add_call_fragment(
                    ToolCallDelta(index=self.calls_started - 1, arguments=args[self._args_sent :])
                )
                self._args_sent = len(args)
            if scan.status != "complete" or scan.end is None:
                return
            if scan.args_start is None:
                out.add_call_fragment(ToolCallDelta(index=self.calls_started - 1, arguments="{}"))
            self._item_end = scan.end
