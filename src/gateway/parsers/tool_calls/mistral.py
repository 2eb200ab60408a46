"""Mistral ``[TOOL_CALLS]`` tool calls, both generations of the format.

* Tokenizer v3 to v7 (Mistral 7B v0.3, Mixtral 8x22B, Mistral Large 2, Small 3.1):
  ``[TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]``.
* Tokenizer v11 and later (Mistral Small 3.2, Magistral, Devstral, Ministral 3):
  ``[TOOL_CALLS]f[ARGS]{...}``, repeated for each call; v13 may put
  ``[CALL_ID]id`` between the name and ``[ARGS]`` (the id is not kept: the
  gateway issues OpenAI call ids).

Both follow ``mistral-common``'s tokenizer classes. ``[TOOL_CALLS]`` is a
control token, so the reply is decoded with special tokens kept.
"""

from __future__ import annotations

import re

from gateway.parsers.tool_calls.json_calls import arguments_view
from gateway.parsers.tool_calls.llama import scan_call_list
from gateway.parsers.tool_calls.section import (
    INCOMPLETE,
    MISMATCH,
    SectionToolParser,
    SectionView,
    expect,
    skip_ws,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


class MistralToolParser(SectionToolParser):
    markers = (TOOL_CALLS,)
    needs_special_tokens = True

    def scan(self, section: str, *, final: bool) -> SectionView:
        i = skip_ws(section, len(TOOL_CALLS))
        if i == len(section):
            return SectionView(status="incomplete")
        if section[i] in "[{":
            return scan_call_list(section, i, final=final, cache=self.cache(final))
        view = SectionView(status="incomplete")
        while True:
            match = _NAME.match(section, i)
            if match is None:
                return SectionView(status="invalid") if i < len(section) else view
            name, i = match.group(), match.end()
            if i == len(section):
                return view
            at = expect(section, i, CALL_ID)
            if at == INCOMPLETE:
                return view
            if at != MISMATCH:
                j = section.find("[", at)
                if j == -1:
                    return view
                i = j
            at = expect(section, i, ARGS)
            if at == INCOMPLETE:
                return view
            if at == MISMATCH:
                return SectionView(status="invalid")
            try:
                call, end = arguments_view(section, skip_ws(section, at), name, self.cache(final))
            except ValueError:
                return SectionView(status="invalid")
            view.calls.append(call)
            if end is None:
                return view
            j = skip_ws(section, end)
            nxt = expect(section, j, TOOL_CALLS)
            if (nxt == INCOMPLETE and not final and j < len(section)) or (j == len(section) and not final):
                return view
            if nxt >= 0:
                i = nxt
                continue
            view.status, view.end = "complete", end
            return view
