"""The streaming driver shared by the marker-delimited tool-call formats.

Most open models write tool calls as a *section* that opens with a marker
(``<tool_call>``, ``[TOOL_CALLS]``, ``<｜tool▁calls▁begin｜>``...) and holds one
or more calls. A format only says where sections may start and how to read
one (``scan``): given the section text so far it reports the calls it can see
(name once complete, the arguments JSON text known so far) and whether the
section is still open, closed, or not a tool call after all.

The driver turns those views into OpenAI-shaped deltas with the same rules for
every format:

* Text that could still become the start of a section (a partial marker,
  whitespace before one) is held back; everything else is content at once.
* A call's first fragment (id, name) goes out once its name is complete;
  argument text follows as it grows. Formats only ever report argument text
  that is a prefix of the final text, so the fragments concatenate to exactly
  the one-shot ``arguments``.
* A section that turns out not to be a tool call before anything of it was
  streamed is handed back as content, marker included, and scanning resumes
  after the marker - malformed output is never lost and never an error. If it
  breaks after a call was streamed, the calls streamed so far stand and the
  unreadable rest is content.
* One-shot ``parse`` is the streaming result over the whole text, so the two
  modes agree by construction; tests check that every split of a text gives
  the same result as the whole.

Rescanning the open section on every delta is linear in the section's size;
sections are tool calls, short next to the rest of an output.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.parsers.base import (
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolStreamDelta,
    new_tool_call_id,
    partial_suffix,
)

Status = Literal["incomplete", "complete", "invalid"]


@dataclass(slots=True)
class CallView:
    """One call as far as it is known: ``arguments`` only ever grows by appending."""

    name: str | None = None
    arguments: str = ""
    done: bool = False


@dataclass(slots=True)
class SectionView:
    """What ``scan`` sees in a section: its calls, content it carries, where it ends."""

    status: Status
    calls: list[CallView] = field(default_factory=list)
    end: int = 0  # complete: how many characters of the section text it spans
    content: str = ""  # text of the section that is content (Harmony's final channel)
    open_value: bool = False  # a value is streaming: every delta matters (no structure skip)


INCOMPLETE = -1
MISMATCH = -2


def expect(text: str, i: int, literal: str) -> int:
    """Index after ``literal`` at ``text[i:]``; INCOMPLETE if the text stops inside it."""
    if text.startswith(literal, i):
        return i + len(literal)
    rest = text[i:]
    if len(rest) < len(literal) and literal.startswith(rest):
        return INCOMPLETE
    return MISMATCH


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


def hold_back(text: str, markers: Iterable[str]) -> int:
    """Characters at the end of ``text`` that may be the start of one of ``markers``."""
    return max((partial_suffix(text, m) for m in markers), default=0)


class GrowthCache:
    """Remembers, per start index, how far an unfinished JSON value was looked at.

    A streaming section is re-read on every delta while its text only grows. An
    unfinished object can only close at a ``}``, so it is re-decoded only when a
    ``}`` arrived, and its prefix is re-validated (``partial-json-parser``, pure
    Python) only when it has doubled since the last check: total work stays
    linear in the size of the call instead of quadratic. Invalid text is still
    caught (a little later) and always at the end, when the section is read as
    final without the cache.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, int]] = {}  # start -> (scanned up to, validated length)

    def clear(self) -> None:
        self._seen.clear()

    def skip(self, text: str, i: int) -> tuple[bool, bool]:
        """(may skip decoding, may skip validation) for the value at ``i``."""
        seen = self._seen.get(i)
        if seen is None:
            return False, False
        scanned, validated = seen
        no_close = "}" not in text[scanned:] and "]" not in text[scanned:]
        return no_close, len(text) - i < 2 * validated

    def note(self, text: str, i: int, *, validated: bool) -> None:
        old = self._seen.get(i, (0, 0))
        self._seen[i] = (len(text), len(text) - i if validated else old[1])


@dataclass(frozen=True, slots=True)
class ToolSpecs:
    """The request's tools: which names count as calls, and each one's parameter schema."""

    schemas: Mapping[str, Mapping[str, Any]] | None = None  # None: any name is accepted

    @classmethod
    def from_tools(
        cls, tools: Sequence[Mapping[str, Any]] | None = None, tool_names: Iterable[str] | None = None
    ) -> ToolSpecs:
        if tools is not None:
            out: dict[str, Mapping[str, Any]] = {}
            for tool in tools:
                fn = tool.get("function", tool)
                out[str(fn.get("name"))] = fn.get("parameters") or {}
            return cls(out)
        if tool_names is not None:
            return cls({name: {} for name in tool_names})
        return cls(None)

    def accepts(self, name: str) -> bool:
        return self.schemas is None or name in self.schemas

    def property_schema(self, function: str, parameter: str) -> Mapping[str, Any] | None:
        if self.schemas is None:
            return None
        props = self.schemas.get(function, {}).get("properties")
        if not isinstance(props, Mapping):
            return None
        schema = props.get(parameter)
        return schema if isinstance(schema, Mapping) else None


class SectionToolParser(ToolCallParser):
    """A tool-call parser defined by its section markers and ``scan``; see the module doc."""

    markers: tuple[str, ...] = ()
    """Texts that open a section anywhere in the output."""
    start_markers: tuple[str, ...] = ()
    """Texts that open a section only at the very start of the output (after whitespace)."""
    needs_special_tokens = False
    """The format's markers are special tokens: decode with ``skip_special_tokens=False``."""
    calls_need_a_call = True
    """A closed section with no call in it is text (Harmony's content messages are not)."""
    structure_chars: frozenset[str] | None = None
    """Characters without which new text cannot change what ``scan`` reports (XML
    formats: ``<>``): while streaming, a delta without any of them is not rescanned,
    which keeps long parameter values linear."""

    def __init__(
        self,
        tool_names: Iterable[str] | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.specs = ToolSpecs.from_tools(tools, tool_names)
        self.json_cache = GrowthCache()
        self._init_args = (tool_names, tools)
        self.calls_started = 0
        self.completed: list[ToolCall] = []
        self._buf = ""
        self._in_section = False
        self._at_start = True  # nothing but whitespace seen so far
        self._ws_hold = ""
        self._strip_leading = False
        self._reset_section()

    @property
    def held(self) -> str:
        return self._buf

    def _reset_section(self) -> None:
        self._marker_len = 0
        self._sent: list[tuple[int, str, str]] = []  # per call of the section: (index, id, args sent)
        self._names: dict[str, str] = {}
        self._content_sent = 0
        self._good_len = 0
        self.json_cache.clear()
        self._last_view: tuple[int, SectionView] | None = None

    def cache(self, final: bool) -> GrowthCache | None:
        """The section's JSON growth cache while streaming; none for the final read."""
        return None if final else self.json_cache

    @abstractmethod
    def scan(self, section: str, *, final: bool) -> SectionView:
        """Read the section text (it starts with its marker) as far as it goes."""

    # ------------------------------------------------------------------ one-shot

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        # The whole text is final from the start: a call cut off or broken anywhere
        # is content here, while a stream keeps what it had already sent.
        fresh = self._fresh()
        fresh._buf = text
        out = fresh.finish()
        return out.content, list(fresh.completed)

    def _fresh(self) -> SectionToolParser:
        return type(self)(self._init_args[0], tools=self._init_args[1])

    # ------------------------------------------------------------------ streaming

    def feed(self, delta: str) -> ToolStreamDelta:
        out = ToolStreamDelta()
        self._buf += delta
        self._run(out, final=False)
        return out

    def finish(self) -> ToolStreamDelta:
        out = ToolStreamDelta()
        self._run(out, final=True)
        self._emit_text(out, self._buf)
        self._buf = ""
        out.content += self._ws_hold
        self._ws_hold = ""
        return out

    def _find_start(self, final: bool) -> tuple[int, int] | None:
        """(start, marker length) of the first section in the buffer, or None."""
        best: tuple[int, int] | None = None
        for marker in self.markers:
            at = self._buf.find(marker)
            if at != -1 and (best is None or at < best[0]):
                best = (at, len(marker))
        if self._at_start and self.start_markers:
            head = self._buf.lstrip()
            off = len(self._buf) - len(head)
            for marker in self.start_markers:
                if head.startswith(marker) and (best is None or off <= best[0]):
                    best = (off, len(marker))
        return best

    def _text_hold(self) -> int:
        hold = hold_back(self._buf, self.markers)
        if self._at_start and self.start_markers:
            head = self._buf.lstrip()
            if not head or any(m.startswith(head) for m in self.start_markers):
                return len(self._buf)
        return hold

    def _run(self, out: ToolStreamDelta, *, final: bool) -> None:
        while True:
            if not self._in_section:
                start = self._find_start(final)
                if start is None:
                    ready = len(self._buf) if final else len(self._buf) - self._text_hold()
                    if ready <= 0:
                        return
                    self._emit_text(out, self._buf[:ready])
                    self._buf = self._buf[ready:]
                    return
                at, marker_len = start
                self._emit_text(out, self._buf[:at])
                self._buf = self._buf[at:]
                self._in_section = True
                self._reset_section()
                self._marker_len = marker_len
            if not self._step_section(out, final=final):
                return

    def _step_section(self, out: ToolStreamDelta, *, final: bool) -> bool:
        """Advance the open section; True when it closed and scanning should go on."""
        last = self._last_view
        if (
            not final
            and last is not None
            and not last[1].open_value
            and self.structure_chars is not None
            and self.structure_chars.isdisjoint(self._buf[last[0] :])
        ):
            self._last_view = (len(self._buf), last[1])
            return False
        view = self.scan(self._buf, final=final)
        self._last_view = (len(self._buf), view)
        if view.status != "invalid":
            view = self._check_names(view)
        if view.status == "complete" and not view.calls and self.calls_need_a_call and not self._sent:
            view = SectionView(status="invalid")  # e.g. "[]": a section without a call is text
        if view.status == "invalid" or (final and view.status == "incomplete"):
            self._in_section = False
            if not self._sent and self._content_sent == 0:
                # Never streamed: the marker is text, and scanning resumes after it.
                self._emit_text(out, self._buf[: self._marker_len])
                self._buf = self._buf[self._marker_len :]
            else:
                for _, call_id, args in self._sent:  # streamed calls stand as sent
                    self.completed.append(ToolCall(id=call_id, name=self._names[call_id], arguments=args))
                self._strip_leading = True
                self._buf = self._buf[self._good_len :]
            self._at_start = False
            self._reset_section()
            return True
        self._good_len = len(self._buf)
        self._stream(out, view)
        if view.status == "complete":
            for (_, call_id, args), call in zip(self._sent, view.calls, strict=False):
                if call.name is not None:
                    self.completed.append(ToolCall(id=call_id, name=call.name, arguments=args))
            self._buf = self._buf[view.end :]
            self._in_section = False
            self._at_start = False
            self._strip_leading = True
            self._reset_section()
            return True
        return False

    def _check_names(self, view: SectionView) -> SectionView:
        for call in view.calls:
            if call.name is not None and (not call.name or not self.specs.accepts(call.name)):
                return SectionView(status="invalid")
        return view

    def _stream(self, out: ToolStreamDelta, view: SectionView) -> None:
        if len(view.content) > self._content_sent:
            self._emit_text(out, view.content[self._content_sent :])
            self._content_sent = len(view.content)
        for k, call in enumerate(view.calls):
            if call.name is None:
                break
            if k == len(self._sent):
                call_id = new_tool_call_id()
                self._ws_hold = ""  # whitespace before a call is dropped
                out.add_call_fragment(
                    ToolCallDelta(
                        index=self.calls_started, id=call_id, name=call.name, arguments=call.arguments
                    )
                )
                self._sent.append((self.calls_started, call_id, call.arguments))
                self._names[call_id] = call.name
                self.calls_started += 1
                continue
            index, call_id, sent = self._sent[k]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                out.add_call_fragment(
                    ToolCallDelta(index=index, arguments=call.arguments[len(sent) :])
                )
                self._sent[k] = (index, call_id, call.arguments)

    def _emit_text(self, out: ToolStreamDelta, text: str) -> None:
        if not text:
            return
        if self._strip_leading:
            text = text.lstrip()
            if not text:
                return
            self._strip_leading = False
        if self._at_start and text.strip():
            self._at_start = False
        combined = self._ws_hold + text
        visible = combined.rstrip()
        self._ws_hold = combined[len(visible) :]
        out.content += visible
