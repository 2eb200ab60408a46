"""gpt-oss reasoning: the Harmony ``analysis`` channel, read at the text level.

gpt-oss writes its reasoning as ``<|channel|>analysis<|message|>…<|end|>`` and
its answer as ``<|start|>assistant<|channel|>final<|message|>…`` (see
``tool_calls/harmony.py`` for the message shape and why the ``openai-harmony``
library is not used). This parser turns:

* ``analysis`` bodies into reasoning;
* ``final`` bodies, and ``commentary`` bodies without a recipient (preambles),
  into plain content;
* messages addressed to a recipient (``to=functions.NAME``: tool calls) into
  content *with their markup*, so the Harmony tool-call parser that runs next
  sees them whole.

Output that does not start with Harmony markup is content as it is. The
message markup itself (``<|start|>assistant``, channel headers, end markers) is
never part of reasoning or content.
"""

from __future__ import annotations

import re
from typing import Literal

from gateway.parsers.base import ReasoningParser, partial_suffix

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER_STARTS = (START, CHANNEL, " to=", "to=")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")

_State = Literal["header", "reasoning", "content", "raw", "passthrough"]


class HarmonyReasoningParser(ReasoningParser):
    def __init__(
        self,
        *,
        starts_in_reasoning: bool | None = None,
        enable_thinking: bool = True,
        separate_reasoning: bool = True,
    ) -> None:
        del starts_in_reasoning, enable_thinking  # gpt-oss always reasons; effort is a prompt matter
        self._state: _State = "header" if separate_reasoning else "passthrough"
        self._buf = ""
        self._first = True

    @property
    def held(self) -> str:
        return self._buf

    def parse(self, text: str) -> tuple[str | None, str]:
        fresh = HarmonyReasoningParser(separate_reasoning=self._state != "passthrough")
        r1, c1 = fresh.feed(text)
        r2, c2 = fresh.finish()
        reasoning = r1 + r2
        return reasoning or None, c1 + c2

    @property
    def in_reasoning(self) -> bool:
        return self._state in ("header", "reasoning")

    def feed(self, delta: str) -> tuple[str, str]:
        if self._state == "passthrough":
            return "", delta
        self._buf += delta
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        if self._state == "passthrough":
            return "", ""
        reasoning, content = self._run(final=True)
        rest, self._buf = self._buf, ""
        if self._state == "reasoning":
            reasoning += rest
        elif self._state in ("content", "raw"):
            content += rest
        elif rest.strip() and not any(m in rest for m in (START, CHANNEL)):
            content += rest  # plain text outside any message is not dropped
        return reasoning, content

    def _run(self, *, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            if self._state == "header":
                if self._first:
                    head = self._buf.lstrip()
                    if head and not any(h.startswith(head[: len(h)]) for h in _HEADER_STARTS):
                        self._state = "passthrough"
                        content.append(self._buf)
                        self._buf = ""
                        break
                at = self._buf.find(MESSAGE)
                if at == -1:
                    break
                header = self._buf[: at + len(MESSAGE)]
                self._buf = self._buf[at + len(MESSAGE) :]
                self._first = False
                recipient = _RECIPIENT.search(header)
                channel = _CHANNEL_NAME.search(header)
                if recipient is not None:
                    self._state = "raw"
                    content.append(header)
                elif channel is not None and channel.group(1) == "analysis":
                    self._state = "reasoning"
                else:
                    self._state = "content"
                continue
            found = [(self._buf.find(e), e) for e in ENDS]
            hits = [(at, e) for at, e in found if at != -1]
            target = reasoning if self._state == "reasoning" else content
            if hits:
                at, marker = min(hits)
                target.append(self._buf[:at])
                if self._state == "raw":
                    content.append(marker)
                self._buf = self._buf[at + len(marker) :]
                self._state = "header"
                continue
            hold = 0 if final else max(partial_suffix(self._buf, e) for e in ENDS)
            ready = len(self._buf) - hold
            target.append(self._buf[:ready])
            self._buf = self._buf[ready:]
            break
        return "".join(reasoning), "".join(content)
