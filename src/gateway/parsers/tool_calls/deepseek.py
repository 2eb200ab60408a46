"""DeepSeek tool calls: V3 / R1, V3.1 and V3.2, each as its chat template writes them.

* V3, R1, R1-0528 (``deepseekv3``)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

* V3.1 / V3.1-Terminus / V3.2-Exp (``deepseekv31``)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

* V3.2 (``deepseekv32``), the "DSML" markup of its encoding script::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="P" string="true">text</｜DSML｜parameter>
    <｜DSML｜parameter name="Q" string="false">JSON</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

  ``string="true"`` values are text, others JSON. The same markup without the
  ``｜DSML｜`` prefix, and an invoke whose body is one JSON object instead of
  parameters, are accepted too (both seen in the wild; SGLang reads them).

The closing ``<｜tool▁calls▁end｜>`` may be missing when the stop token ends
the reply right after the last call; a complete last call then closes the
section at the end of the output.
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from typing import Any

from gateway.parsers.tool_calls.json_calls import arguments_view
from gateway.parsers.tool_calls.section import (
    INCOMPLETE,
    MISMATCH,
    CallView,
    SectionToolParser,
    SectionView,
    expect,
    skip_ws,
)
from gateway.parsers.tool_calls.values import object_prefix

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


class _DeepSeekSection(SectionToolParser):
    markers = (CALLS_BEGIN,)
    needs_special_tokens = True

    @abstractmethod
    def _call(self, section: str, i: int, final: bool) -> tuple[CallView, int | None] | None:
        """Read one call after ``<｜tool▁call▁begin｜>``; None while its header is unfinished.
        Each DeepSeek version below spells a call its own way."""

    def scan(self, section: str, *, final: bool) -> SectionView:
        view = SectionView(status="incomplete")
        i = len(CALLS_BEGIN)
        while True:
            i = skip_ws(section, i)
            if i == len(section):
                if final and view.calls:
                    view.status, view.end = "complete", i
                return view
            at = expect(section, i, CALLS_END)
            if at >= 0:
                view.status, view.end = "complete", at
                return view
            begin = expect(section, i, CALL_BEGIN)
            if (at == INCOMPLETE and begin == INCOMPLETE) or begin == INCOMPLETE:
                return view
            if begin == MISMATCH:
                if at == INCOMPLETE:
                    return view
                if view.calls:  # text after the last call: the section ends there
                    view.status, view.end = "complete", i
                    return view
                return SectionView(status="invalid")
            try:
                read = self._call(section, begin, final)
            except ValueError:
                return SectionView(status="invalid")
            if read is None:
                return view
            call, end = read
            view.calls.append(call)
            if end is None:
                return view
            j = skip_ws(section, end)
            close = expect(section, j, CALL_END)
            if close == INCOMPLETE:
                if final and view.calls:
                    call.done = True
                    view.status, view.end = "complete", j
                return view
            if close == MISMATCH:
                return SectionView(status="invalid")
            i = close


class DeepSeekV3ToolParser(_DeepSeekSection):
    def _call(self, section: str, i: int, final: bool) -> tuple[CallView, int | None] | None:
        sep = section.find(SEP, i)
        if sep == -1:
            if CALL_END in section[i:] or len(section) - i > 64:
                raise ValueError("no tool separator")
            return None
        line_end = section.find("\n", sep)
        if line_end == -1:
            return None
        name = section[sep + len(SEP) : line_end].strip()
        j = skip_ws(section, line_end)
        fence = expect(section, j, "```json")
        if fence == INCOMPLETE:
            return CallView(name=name), None
        if fence == MISMATCH:
            raise ValueError("no json fence")
        call, end = arguments_view(section, skip_ws(section, fence), name, self.cache(final))
        if end is None:
            return call, None
        k = skip_ws(section, end)
        close = expect(section, k, "```")
        if close == INCOMPLETE:
            call.done = False
            return call, None
        if close == MISMATCH:
            raise ValueError("no closing fence")
        return call, close


class DeepSeekV31ToolParser(_DeepSeekSection):
    def _call(self, section: str, i: int, final: bool) -> tuple[CallView, int | None] | None:
        sep = section.find(SEP, i)
        if sep == -1:
            if CALL_END in section[i:] or "{" in section[i:]:
                raise ValueError("no tool separator")
            return None
        name = section[i:sep].strip()
        return arguments_view(section, skip_ws(section, sep + len(SEP)), name, self.cache(final))


_DSML = "(?:｜DSML｜)?"
_INVOKE = re.compile(rf'<{_DSML}invoke\s+name="([^"]+)"\s*>')
_INVOKE_END = re.compile(rf"</{_DSML}invoke>")
_PARAM = re.compile(rf'<{_DSML}parameter\s+name="([^"]+)"\s+string="(true|false)"\s*>(.*?)</{_DSML}parameter>', re.S)
_CALLS_END = re.compile(rf"</{_DSML}function_calls>")
_V32_OPEN = ("<｜DSML｜function_calls>", "<function_calls>")
_V32_PARTIALS = ("<｜DSML｜invoke", "<invoke", "</｜DSML｜function_calls>", "</function_calls>")


def _dsml_value(text: str, is_string: str) -> Any:
    if is_string == "true":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


class DeepSeekV32ToolParser(SectionToolParser):
    markers = _V32_OPEN
    structure_chars = frozenset("<>")
    needs_special_tokens = False  # the DSML markup is ordinary text in V3.2's vocabulary

    def scan(self, section: str, *, final: bool) -> SectionView:
        view = SectionView(status="incomplete")
        i = section.index(">") + 1
        while True:
            i = skip_ws(section, i)
            rest = section[i:]
            if not rest:
                if final and view.calls:
                    view.status, view.end = "complete", i
                return view
            end = _CALLS_END.match(section, i)
            if end:
                view.status, view.end = "complete", end.end()
                return view
            invoke = _INVOKE.match(section, i)
            if invoke is None:
                if not final and any(p.startswith(rest) or rest.startswith(p) for p in _V32_PARTIALS):
                    return view
                if view.calls:
                    view.status, view.end = "complete", i
                    return view
                return SectionView(status="invalid")
            name = invoke.group(1)
            body_start = invoke.end()
            close = _INVOKE_END.search(section, body_start)
            body = section[body_start : close.start() if close else len(section)]
            stripped = body.strip()
            if stripped.startswith("{"):
                if close is None:
                    view.calls.append(CallView(name=name))
                    return view
                try:
                    value = json.loads(stripped)
                except ValueError:
                    return SectionView(status="invalid")
                if not isinstance(value, dict):
                    return SectionView(status="invalid")
                view.calls.append(CallView(name=name, arguments=json.dumps(value, ensure_ascii=False), done=True))
            else:
                pairs = [(m.group(1), _dsml_value(m.group(3), m.group(2))) for m in _PARAM.finditer(body)]
                if close is not None and _PARAM.sub("", body).strip():
                    return SectionView(status="invalid")
                view.calls.append(CallView(name=name, arguments=object_prefix(pairs, closed=close is not None), done=close is not None))
            if close is None:
                return view
            i = close.end()
