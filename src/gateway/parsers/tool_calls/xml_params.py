"""XML-style tool calls whose parameters are written one by one as text.

Three families share the shape "function name, then ``name -> value`` pairs":

* Qwen3-Coder (``qwen3_coder``)::

    <tool_call>
    <function=NAME>
    <parameter=P>
    value
    </parameter>
    </function>
    </tool_call>

* GLM-4.5 / 4.6 (``glm45``) ``<tool_call>NAME\\n<arg_key>P</arg_key>\\n<arg_value>value</arg_value>\\n</tool_call>``
  and GLM-4.7 (``glm47``), the same without the newlines
  (``<tool_call>NAME<arg_key>P</arg_key><arg_value>value</arg_value></tool_call>``);
  one parser reads both, whitespace between the parts being optional.
* MiniMax-M2 (``minimax_m2``)::

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="P">value</parameter>
    </invoke>
    </minimax:tool_call>

Values are typed by the tool's JSON schema (``values.typed_value``). Qwen3-Coder's
template puts the value on its own line, so one newline directly after the
opening tag and one before the closing tag belong to the markup, not the value.
Arguments stream a parameter at a time: each finished parameter appends
``"P": value`` to the arguments object, which closes with the call.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.parsers.tool_calls.section import (
    CallView,
    SectionToolParser,
    SectionView,
    hold_back,
    skip_ws,
)
from gateway.parsers.tool_calls.values import object_prefix, typed_value


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


class _XmlParams(SectionToolParser):
    """Shared reading of ``<open-param NAME> value <close-param>`` pairs."""

    structure_chars = frozenset("<>")

    param_open: re.Pattern[str]
    param_close: str
    value_open: str | None = None  # GLM: <arg_key>K</arg_key> then <arg_value>
    value_close: str = ""
    strip_newline = False

    def _pairs(self, function: str, body: str, *, closed: bool) -> tuple[list[tuple[str, Any]], bool]:
        """Pairs in ``body``; False when the body cannot be this format's parameters."""
        pairs: list[tuple[str, Any]] = []
        i = 0
        while True:
            i = skip_ws(body, i)
            if i == len(body):
                return pairs, True
            match = self.param_open.match(body, i)
            if match is None:
                rest = body[i:]
                pattern = self.param_open.pattern
                literal = pattern.split("(")[0].replace("\\", "")
                if not closed and (literal.startswith(rest) or rest.startswith(literal)):
                    return pairs, True
                return pairs, False
            key = match.group(1).strip()
            j = match.end()
            if self.value_open is not None:
                close_key = body.find(self.param_close, j)
                if close_key == -1:
                    return pairs, not closed
                key = body[j:close_key].strip()
                j = skip_ws(body, close_key + len(self.param_close))
                if not body.startswith(self.value_open, j):
                    rest = body[j:]
                    return pairs, not closed and self.value_open.startswith(rest)
                j += len(self.value_open)
                end = body.find(self.value_close, j)
                close_len = len(self.value_close)
            else:
                end = body.find(self.param_close, j)
                close_len = len(self.param_close)
            if end == -1:
                return pairs, not closed
            value = body[j:end]
            if self.strip_newline:
                value = _strip_one_newline(value)
            schema = self.specs.property_schema(function, key)
            pairs.append((key, typed_value(value, schema)))
            i = end + close_len


class Qwen3CoderToolParser(_XmlParams):
    markers = ("<tool_call>",)
    param_open = re.compile(r"<parameter=([^>\n]+)>")
    param_close = "</parameter>"
    strip_newline = True
    _function = re.compile(r"<function=([^>\n]+)>")

    def scan(self, section: str, *, final: bool) -> SectionView:
        i = skip_ws(section, len("<tool_call>"))
        rest = section[i:]
        match = self._function.match(section, i)
        if match is None:
            if not final and ("<function=".startswith(rest) or (rest.startswith("<function=") and ">" not in rest and "\n" not in rest)):
                return SectionView(status="incomplete")
            return SectionView(status="invalid")
        name = match.group(1).strip()
        fn_end = section.find("</function>", match.end())
        body = section[match.end() : fn_end if fn_end != -1 else len(section) - hold_back(section, ("</function>",))]
        pairs, ok = self._pairs(name, body, closed=fn_end != -1)
        if not ok:
            return SectionView(status="invalid")
        if fn_end == -1:
            return SectionView(status="incomplete", calls=[CallView(name=name, arguments=object_prefix(pairs, closed=False))])
        call = CallView(name=name, arguments=object_prefix(pairs, closed=True), done=True)
        j = skip_ws(section, fn_end + len("</function>"))
        if section.startswith("</tool_call>", j):
            return SectionView(status="complete", calls=[call], end=j + len("</tool_call>"))
        if j == len(section) or "</tool_call>".startswith(section[j:]):
            if final:
                return SectionView(status="complete", calls=[call], end=len(section))
            return SectionView(status="incomplete", calls=[call])
        return SectionView(status="invalid")


class Glm45ToolParser(_XmlParams):
    markers = ("<tool_call>",)
    param_open = re.compile(r"<arg_key>()")
    param_close = "</arg_key>"
    value_open = "<arg_value>"
    value_close = "</arg_value>"
    _name = re.compile(r"[^\s<>{}]+")

    def scan(self, section: str, *, final: bool) -> SectionView:
        i = skip_ws(section, len("<tool_call>"))
        match = self._name.match(section, i)
        if match is None:
            if i == len(section) and not final:
                return SectionView(status="incomplete")
            return SectionView(status="invalid")
        name = match.group()
        j = match.end()
        if j == len(section) or (section[j:].strip() == "" and not final):
            return SectionView(status="incomplete")
        end = section.find("</tool_call>", j)
        body = section[j : end if end != -1 else len(section) - hold_back(section, ("</tool_call>",))]
        pairs, ok = self._pairs(name, body, closed=end != -1 or final)
        if not ok:
            return SectionView(status="invalid")
        if end == -1:
            return SectionView(status="incomplete", calls=[CallView(name=name, arguments=object_prefix(pairs, closed=False))])
        call = CallView(name=name, arguments=object_prefix(pairs, closed=True), done=True)
        return SectionView(status="complete", calls=[call], end=end + len("</tool_call>"))


class Glm47ToolParser(Glm45ToolParser):
    """GLM-4.7 writes the same parts without newlines between them; see the module doc."""


class MiniMaxM2ToolParser(_XmlParams):
    markers = ("<minimax:tool_call>",)
    param_open = re.compile(r'<parameter name="([^"]*)">')
    param_close = "</parameter>"
    _invoke = re.compile(r'<invoke name="([^"]*)">')

    def scan(self, section: str, *, final: bool) -> SectionView:
        view = SectionView(status="incomplete")
        i = len("<minimax:tool_call>")
        while True:
            i = skip_ws(section, i)
            rest = section[i:]
            if not rest:
                if final and view.calls:
                    view.status, view.end = "complete", i
                return view
            if rest.startswith("</minimax:tool_call>"):
                view.status, view.end = "complete", i + len("</minimax:tool_call>")
                return view
            match = self._invoke.match(section, i)
            if match is None:
                partial = any(t.startswith(rest) or (rest.startswith(t) and '">' not in rest) for t in ('<invoke name="', "</minimax:tool_call>"))
                if not final and partial:
                    return view
                return SectionView(status="invalid")
            name = match.group(1)
            end = section.find("</invoke>", match.end())
            body = section[match.end() : end if end != -1 else len(section) - hold_back(section, ("</invoke>",))]
            pairs, ok = self._pairs(name, body, closed=end != -1)
            if not ok:
                return SectionView(status="invalid")
            if end == -1:
                view.calls.append(CallView(name=name, arguments=object_prefix(pairs, closed=False)))
                return view
            view.calls.append(CallView(name=name, arguments=object_prefix(pairs, closed=True), done=True))
            i = end + len("</invoke>")
