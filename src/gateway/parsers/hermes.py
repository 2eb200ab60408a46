"""Hermes / Qwen tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

One-shot ``parse`` and streaming ``feed``/``finish`` follow the same rules:

* Any number of ``<tool_call>`` blocks, with normal text before, between or
  after them. A block runs to the first ``</tool_call>`` (or the end of the
  output). It is a call when its body is exactly one JSON object with a
  non-empty string ``name`` (one of ``tool_names`` if given) and an object
  ``arguments`` (or ``parameters``; missing means ``{}``). Anything else - bad
  JSON, junk after the object, an unknown function - leaves the whole block,
  tags included, in the content as plain text.
* ``arguments`` is the model's own JSON text for that object, unchanged; the
  streamed argument fragments concatenate to exactly that string.
* Content is all text outside valid call blocks; whitespace directly before or
  after a call block is dropped.

Streaming never emits as content text that could still become part of a call:
a partial ``<tool_call>`` tag and whitespace that may precede one are held back.
A call's first fragment (id, name, arguments so far) goes out once its name is
complete and its arguments object has begun. If the JSON turns invalid after
that point (or the output is cut off inside the call) the fragments already
sent cannot be recalled: streaming then keeps the call as far as it was sent,
while one-shot ``parse`` returns the block as content. For well-formed output
the two modes agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from gateway.parsers.base import (
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolStreamDelta,
    new_tool_call_id,
    partial_suffix,
)
from gateway.parsers.json_scan import parse_call, scan_call

_State = Literal["text", "call", "invalid_block"]


class HermesToolParser(ToolCallParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def __init__(self, tool_names: Iterable[str] | None = None) -> None:
        self.tool_names = frozenset(tool_names) if tool_names is not None else None
        self.calls_started = 0
        self.completed: list[ToolCall] = []
        self._state: _State = "text"
        self._buf = ""  # text: undecided tail; call: the block body so far; invalid: tail
        self._ws_hold = ""  # trailing whitespace of the content, not yet emitted
        self._strip_leading = False  # just after a call: drop the content's leading whitespace
        self._reset_call()

    @property
    def held(self) -> str:
        return self._buf

    def _reset_call(self) -> None:
        self._call_id = ""
        self._header_sent = False
        self._args_sent = 0
        self._checked_len = 0
        self._broken = False
        self._end_from = 0  # where to resume looking for the end tag in the body
        self._scanned_to = 0  # body length at the last progress step
        self._args_from: int | None = None  # start of still-open arguments, once announced

    # ------------------------------------------------------------------ one-shot

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        segments: list[str] = []
        calls: list[ToolCall] = []
        segment = ""
        pos = 0
        while True:
            start = text.find(self.start_tag, pos)
            if start == -1:
                segments.append(segment + text[pos:])
                break
            body_start = start + len(self.start_tag)
            end = text.find(self.end_tag, body_start)
            body_end = end if end != -1 else len(text)
            block_end = end + len(self.end_tag) if end != -1 else len(text)
            call = self._valid_call(text[body_start:body_end])
            if call is None:
                segment += text[pos:block_end]
            else:
                segments.append(segment + text[pos:start])
                segment = ""
                calls.append(ToolCall(id=new_tool_call_id(), name=call[0], arguments=call[1]))
            pos = block_end
        last = len(segments) - 1
        content = "".join(
            _trim(seg, leading=k > 0, trailing=k < last) for k, seg in enumerate(segments)
        )
        return content, calls

    def _valid_call(self, body: str) -> tuple[str, str] | None:
        call = parse_call(body)
        if call is None or (self.tool_names is not None and call[0] not in self.tool_names):
            return None
        return call

    # ------------------------------------------------------------------ streaming

    def feed(self, delta: str) -> ToolStreamDelta:
        out = ToolStreamDelta()
        self._buf += delta
        self._run(out)
        return out

    def finish(self) -> ToolStreamDelta:
        out = ToolStreamDelta()
        self._run(out)
        if self._state == "call":
            self._close_call(out, self._buf, closed=False)
            self._buf = ""
            self._state = "text"
        self._emit_text(out, self._buf)
        self._buf = ""
        out.content += self._ws_hold
        self._ws_hold = ""
        return out

    def _run(self, out: ToolStreamDelta) -> None:
        while True:
            if self._state == "text":
                start = self._buf.find(self.start_tag)
                if start == -1:
                    ready = len(self._buf) - partial_suffix(self._buf, self.start_tag)
                    self._emit_text(out, self._buf[:ready])
                    self._buf = self._buf[ready:]
                    return
                self._emit_text(out, self._buf[:start])
                self._buf = self._buf[start + len(self.start_tag) :]
                self._state = "call"
                self._reset_call()
            elif self._state == "call":
                end = self._buf.find(self.end_tag, self._end_from)
                if end != -1:
                    self._close_call(out, self._buf[:end], closed=True)
                    self._buf = self._buf[end + len(self.end_tag) :]
                    self._state = "text"
                    continue
                self._end_from = max(0, len(self._buf) - len(self.end_tag) + 1)
                limit = len(self._buf) - partial_suffix(self._buf, self.end_tag)
                if self._progress_call(out, limit):
                    return
                # The block is not a call: replay it as content up to here.
                self._emit_text(out, self.start_tag + self._buf[:limit])
                self._buf = self._buf[limit:]
                self._state = "invalid_block"
            else:
                end = self._buf.find(self.end_tag)
                if end == -1:
                    ready = len(self._buf) - partial_suffix(self._buf, self.end_tag)
                    self._emit_text(out, self._buf[:ready])
                    self._buf = self._buf[ready:]
                    return
                self._emit_text(out, self._buf[: end + len(self.end_tag)])
                self._buf = self._buf[end + len(self.end_tag) :]
                self._state = "text"

    def _progress_call(self, out: ToolStreamDelta, limit: int) -> bool:
        """Stream what the body up to ``limit`` settles; False when it cannot be a call."""
        if self._broken:
            return True
        new_text = self._buf[self._scanned_to : limit]
        self._scanned_to = limit
        if self._args_from is not None and "}" not in new_text:
            # Announced arguments that are still open can only close at a "}": the new
            # text is all arguments, no need to re-scan the body (keeps long calls linear).
            args = self._buf[self._args_from + self._args_sent : limit]
            if args:
                out.add_call_fragment(ToolCallDelta(index=self._index, arguments=args))
                self._args_sent += len(args)
            return True
        body = self._buf[:limit]
        # Before the header every step is checked; afterwards the unfinished arguments
        # are re-validated only when they have doubled, keeping long calls linear.
        check = not self._header_sent or len(body) >= 2 * self._checked_len
        scan = scan_call(body, check_args_prefix=check)
        if check:
            self._checked_len = len(body)
        bad = scan.status == "invalid" or (
            scan.name is not None
            and self.tool_names is not None
            and scan.name not in self.tool_names
        )
        if scan.status == "complete" and scan.end is not None and body[scan.end :].strip():
            bad = True
        if bad:
            if self._header_sent:
                self._broken = True  # already streamed: keep what was sent, ignore the rest
                return True
            return False
        if scan.args_start is None:
            args = ""
        else:
            args = body[scan.args_start : scan.args_end if scan.args_end is not None else len(body)]
        if not self._header_sent:
            if scan.name is None or not (scan.args_started or scan.status == "complete"):
                return True
            self._send_header(out, scan.name, args)
        elif len(args) > self._args_sent:
            out.add_call_fragment(
                ToolCallDelta(index=self._index, arguments=args[self._args_sent :])
            )
            self._args_sent = len(args)
        open_args = scan.args_start is not None and scan.args_end is None
        self._args_from = scan.args_start if self._header_sent and open_args else None
        return True

    def _send_header(self, out: ToolStreamDelta, name: str, args: str) -> None:
        self._call_id = new_tool_call_id()
        self._header_sent = True
        self._args_sent = len(args)
        self._ws_hold = ""  # whitespace before a call block is dropped
        out.add_call_fragment(
            ToolCallDelta(index=self.calls_started, id=self._call_id, name=name, arguments=args)
        )
        self.calls_started += 1

    @property
    def _index(self) -> int:
        return self.calls_started - 1

    def _close_call(self, out: ToolStreamDelta, body: str, *, closed: bool) -> None:
        call = None if self._broken else self._valid_call(body)
        if call is not None:
            name, args = call
            if not self._header_sent:
                self._send_header(out, name, args)
            elif len(args) > self._args_sent:
                out.add_call_fragment(
                    ToolCallDelta(index=self._index, arguments=args[self._args_sent :])
                )
                self._args_sent = len(args)
            self.completed.append(ToolCall(id=self._call_id, name=name, arguments=args))
            self._strip_leading = True
        elif self._header_sent:
            self._strip_leading = True  # a broken call still consumed its block
        else:
            self._emit_text(out, self.start_tag + body + (self.end_tag if closed else ""))
        self._reset_call()

    def _emit_text(self, out: ToolStreamDelta, text: str) -> None:
        if not text:
            return
        if self._strip_leading:
            text = text.lstrip()
            if not text:
                return
            self._strip_leading = False
        combined = self._ws_hold + text
        visible = combined.rstrip()
        self._ws_hold = combined[len(visible) :]
        out.content += visible


def _trim(segment: str, *, leading: bool, trailing: bool) -> str:
    if leading:
        segment = segment.lstrip()
    if trailing:
        segment = segment.rstrip()
    return segment
