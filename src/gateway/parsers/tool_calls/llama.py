"""Llama 3.x JSON tool calls: ``{"name": "f", "parameters": {...}}``.

Llama 3.1/3.2/3.3's templates ask for a bare JSON object per call and the model
writes it either as its whole reply or after ``<|python_tag|>``; several calls
are separated by ``;`` (the form SGLang and vLLM accept; the template itself
shows a single call). ``arguments`` is accepted for ``parameters`` (Llama 3.2
often writes it). A reply that merely starts with ``{`` but is not a call
object is content.
"""

from __future__ import annotations

from gateway.parsers.tool_calls.json_calls import call_object_view
from gateway.parsers.tool_calls.section import (
    INCOMPLETE,
    GrowthCache,
    SectionToolParser,
    SectionView,
    expect,
    skip_ws,
)

PYTHON_TAG = "<|python_tag|>"


class LlamaJsonToolParser(SectionToolParser):
    markers = (PYTHON_TAG,)
    start_markers = ("{",)
    needs_special_tokens = True

    def scan(self, section: str, *, final: bool) -> SectionView:
        view = SectionView(status="incomplete")
        i = len(PYTHON_TAG) if section.startswith(PYTHON_TAG) else 0
        while True:
            i = skip_ws(section, i)
            if i == len(section):
                if view.calls and final:
                    view.status, view.end = "complete", i
                return view
            if section[i] != "{":
                return SectionView(status="invalid")
            try:
                call, end = call_object_view(section, i, self.cache(final))
            except ValueError:
                return SectionView(status="invalid")
            view.calls.append(call)
            if end is None:
                return view
            j = skip_ws(section, end)
            if j == len(section):
                if final:
                    view.status, view.end = "complete", j
                return view
            if section[j] == ";":
                i = j + 1
                continue
            if expect(section, j, PYTHON_TAG) == INCOMPLETE and not final:
                return view
            if section.startswith(PYTHON_TAG, j):
                i = j + len(PYTHON_TAG)
                continue
            view.status, view.end = "complete", end  # text after the call is content
            return view


class JsonToolParser(SectionToolParser):
    """Plain JSON: the reply is one call object or an array of them (SMG's ``json``)."""

    start_markers = ("{", "[")

    def scan(self, section: str, *, final: bool) -> SectionView:
        return scan_call_list(section, 0, final=final, cache=self.cache(final))


def scan_call_list(
    section: str, i: int, *, final: bool, cache: GrowthCache | None = None
) -> SectionView:
    """A call object, or a ``[`` array of call objects, starting at ``section[i]``."""
    view = SectionView(status="incomplete")
    i = skip_ws(section, i)
    if i == len(section):
        return view
    if section[i] == "{":
        try:
            call, end = call_object_view(section, i, cache)
        except ValueError:
            return SectionView(status="invalid")
        view.calls.append(call)
        if end is not None:
            view.status, view.end = "complete", end
        return view
    if section[i] != "[":
        return SectionView(status="invalid")
    i += 1
    while True:
        i = skip_ws(section, i)
        if i == len(section):
            return view
        if section[i] == "]" and not view.calls:
            view.status, view.end = "complete", i + 1
            return view
        try:
            call, end = call_object_view(section, i, cache)
        except ValueError:
            return SectionView(status="invalid")
        view.calls.append(call)
        if end is None:
            return view
        j = skip_ws(section, end)
        if j == len(section):
            return view
        if section[j] == ",":
            i = j + 1
            continue
        if section[j] == "]":
            view.status, view.end = "complete", j + 1
            return view
        return SectionView(status="invalid")
