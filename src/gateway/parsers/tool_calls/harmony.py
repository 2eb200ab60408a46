"""gpt-oss tool calls in OpenAI's Harmony format, read at the text level.

A Harmony reply is a sequence of messages, each ``[<|start|>ROLE]<|channel|>
CHANNEL [to=RECIPIENT] [<|constrain|>json]<|message|>BODY`` ended by ``<|end|>``,
``<|call|>`` (a tool call) or ``<|return|>`` (the final answer). A message whose
header names a recipient ``to=functions.NAME`` (in the channel part or right
after the role, both occur) is a call of NAME with BODY as its JSON arguments;
other messages are text: ``final`` and ``commentary`` bodies are content and,
when no reasoning parser took it already, so is ``analysis``.

Why not the ``openai-harmony`` library: its ``StreamableParser`` works on token
ids of the o200k vocabulary, which it downloads on first use; offline (as here
and in many clusters) ``load_harmony_encoding`` fails with "error downloading
or loading vocab file". Parsers in this gateway are text machines anyway (the
pipeline hands them decoded text with special tokens kept), so the channel
markup is read directly; the markup is fixed by the Harmony spec. ``<|call|>``
and ``<|return|>`` are stop tokens and usually trimmed from the text, so a
message also ends at the end of the output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.parsers.tool_calls.json_calls import arguments_view
from gateway.parsers.tool_calls.section import SectionToolParser, SectionView, hold_back

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


@dataclass(slots=True)
class HarmonyMessage:
    """One message as far as the text goes: header parts and body so far."""

    channel: str
    recipient: str | None
    body: str  # without a possible partial end marker
    header_done: bool
    closed: bool
    end: int  # index after the message (after its end marker when closed)


def read_message(text: str, *, final: bool) -> HarmonyMessage | None:
    """The message at the start of ``text``; None while its header is unfinished."""
    header_end = text.find(MESSAGE)
    if header_end == -1:
        return None
    header = text[:header_end]
    channel = _CHANNEL_NAME.search(header)
    recipient = _RECIPIENT.search(header)
    body_start = header_end + len(MESSAGE)
    stops = [(text.find(e, body_start), e) for e in ENDS]
    found = [(at, e) for at, e in stops if at != -1]
    if found:
        at, marker = min(found)
        closed, body, end = True, text[body_start:at], at + len(marker)
    else:
        hold = 0 if final else hold_back(text, (*ENDS, START, CHANNEL))
        closed, body, end = final, text[body_start : len(text) - hold], len(text)
    return HarmonyMessage(
        channel=channel.group(1) if channel else "",
        recipient=recipient.group(1) if recipient else None,
        body=body,
        header_done=True,
        closed=closed,
        end=end,
    )


def tool_name(recipient: str) -> str:
    return recipient.removeprefix("functions.")


class HarmonyToolParser(SectionToolParser):
    markers = (START, CHANNEL)
    calls_need_a_call = False  # a final-channel message is a section of content
    start_markers = (" to=", "to=")  # the prompt ended with "<|start|>assistant"
    needs_special_tokens = True

    def scan(self, section: str, *, final: bool) -> SectionView:
        message = read_message(section, final=final)
        if message is None:
            if final:
                return SectionView(status="invalid")
            return SectionView(status="incomplete")
        if message.recipient is None:
            view = SectionView(status="complete" if message.closed else "incomplete", content=message.body)
            view.end = message.end
            return view
        body_at = section.find(MESSAGE) + len(MESSAGE)
        body = section[body_at : body_at + len(message.body)]
        lead = len(body) - len(body.lstrip())
        try:
            call, args_end = arguments_view(body, lead, tool_name(message.recipient), self.cache(final))
        except ValueError:
            return SectionView(status="invalid")
        if args_end is None:
            return SectionView(status="invalid" if message.closed else "incomplete", calls=[call])
        if body[args_end:].strip():
            return SectionView(status="invalid")
        if not message.closed:
            return SectionView(status="incomplete", calls=[call])
        return SectionView(status="complete", calls=[call], end=message.end)
