"""Kimi K2 tool calls (K2-Instruct, K2-0905, K2-Thinking), as its template writes them::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>

The call id ``functions.NAME:IDX`` carries the function name; the gateway
issues OpenAI call ids of its own. The singular ``<|tool_call_section_begin|>``
spelling, which the model sometimes produces, is accepted as well (SGLang does
too). The markers are special tokens.
"""

from __future__ import annotations

from gateway.parsers.tool_calls.json_calls import arguments_view
from gateway.parsers.tool_calls.section import (
    INCOMPLETE,
    MISMATCH,
    SectionToolParser,
    SectionView,
    expect,
    skip_ws,
)

SECTION_BEGIN = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_END = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"


def function_name(call_id: str) -> str:
    """``functions.get_weather:0`` -> ``get_weather``."""
    name = call_id.strip()
    if ":" in name:
        name = name.rsplit(":", 1)[0]
    return name.removeprefix("functions.")


class KimiK2ToolParser(SectionToolParser):
    markers = SECTION_BEGIN
    needs_special_tokens = True

    def scan(self, section: str, *, final: bool) -> SectionView:
        view = SectionView(status="incomplete")
        i = next(len(m) for m in SECTION_BEGIN if section.startswith(m))
        while True:
            i = skip_ws(section, i)
            if i == len(section):
                if final and view.calls:
                    view.status, view.end = "complete", i
                return view
            ends = [expect(section, i, m) for m in SECTION_END]
            if any(e >= 0 for e in ends):
                view.status, view.end = "complete", max(ends)
                return view
            begin = expect(section, i, CALL_BEGIN)
            if begin == INCOMPLETE or (INCOMPLETE in ends and begin == MISMATCH):
                return view
            if begin == MISMATCH:
                return SectionView(status="invalid")
            arg = section.find(ARG_BEGIN, begin)
            if arg == -1:
                if CALL_END in section[begin:] or len(section) - begin > 256:
                    return SectionView(status="invalid")
                return view
            name = function_name(section[begin:arg])
            try:
                call, end = arguments_view(section, skip_ws(section, arg + len(ARG_BEGIN)), name, self.cache(final))
            except ValueError:
                return SectionView(status="invalid")
            view.calls.append(call)
            if end is None:
                return view
            j = skip_ws(section, end)
            close = expect(section, j, CALL_END)
            if close == INCOMPLETE:
                if final:
                    view.status, view.end = "complete", j
                return view
            if close == MISMATCH:
                return SectionView(status="invalid")
            i = close
