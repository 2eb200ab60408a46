"""``<think>…</think>`` reasoning parsers (Qwen3, DeepSeek-R1).

Rules, identical for one-shot and streaming:

* A reasoning block is recognised only at the very start of the output
  (leading whitespace allowed), as ``<think>`` … ``</think>``.
* ``starts_in_reasoning``: the chat template already opened the block (the
  prompt ends with ``<think>``), so the output is ``reasoning</think>answer``;
  a stray leading ``<think>`` is tolerated.
* Without ``</think>`` (generation cut short) everything after the opening is
  reasoning and the content is empty.
* Reasoning is stripped of surrounding whitespace (``None`` when empty); the
  content loses the whitespace right after ``</think>``. Output without a
  reasoning block is returned as content unchanged.
* ``separate_reasoning=False`` or ``enable_thinking=False``: no splitting at
  all, the text is content as generated (with thinking disabled the Qwen3
  template writes an empty think block into the prompt, so none is expected).
"""

from __future__ import annotations

from typing import Literal

from gateway.parsers.base import ReasoningParser, partial_suffix

_State = Literal["start", "reasoning", "content", "passthrough"]


def prompt_opens_think_block(prompt: str, start_tag: str = "<think>") -> bool:
    """True when a rendered prompt ends inside an opened think block.

    Templates such as Qwen3-Thinking-2507 and DeepSeek-R1's end the prompt with
    ``<think>\\n``; the server passes the result as ``starts_in_reasoning``.
    """
    return prompt.rstrip().endswith(start_tag)


class ThinkTagReasoningParser(ReasoningParser):
    """Reasoning delimited by a start and an end tag; see the module doc for the rules."""

    start_tag = "<think>"
    end_tag = "</think>"
    default_starts_in_reasoning = False

    def __init__(
        self,
        *,
        starts_in_reasoning: bool | None = None,
        enable_thinking: bool = True,
        separate_reasoning: bool = True,
    ) -> None:
        self.starts_in_reasoning = (
            self.default_starts_in_reasoning if starts_in_reasoning is None else starts_in_reasoning
        )
        self.active = enable_thinking and separate_reasoning
        self._state: _State = "start" if self.active else "passthrough"
        self._buf = ""  # text held back (start: undecided prefix; reasoning: tail)
        self._reasoning_started = False  # some reasoning text already emitted
        self._content_started = False  # some content after </think> already emitted

    @property
    def held(self) -> str:
        return self._buf

    # ------------------------------------------------------------------ one-shot

    def parse(self, text: str) -> tuple[str | None, str]:
        if not self.active:
            return None, text
        stripped = text.lstrip()
        if stripped.startswith(self.start_tag):
            body = stripped[len(self.start_tag) :]
        elif self.starts_in_reasoning:
            body = text
        else:
            return None, text
        end = body.find(self.end_tag)
        if end == -1:
            return body.strip() or None, ""
        reasoning = body[:end].strip()
        return reasoning or None, body[end + len(self.end_tag) :].lstrip()

    # ------------------------------------------------------------------ streaming

    def feed(self, delta: str) -> tuple[str, str]:
        if self._state == "passthrough":
            return "", delta
        if self._state == "content":
            return "", self._content(delta)
        self._buf += delta
        if self._state == "start":
            decided = self._decide_start()
            if decided is not None:
                return decided
        return self._advance_reasoning()

    def finish(self) -> tuple[str, str]:
        if self._state == "start":
            held, self._buf = self._buf, ""
            if self.starts_in_reasoning:
                self._state = "reasoning"
                reasoning = self._strip_reasoning_edges(held.lstrip().removeprefix(self.start_tag))
                return reasoning.rstrip(), ""
            self._state = "passthrough"
            return "", held
        if self._state == "reasoning":
            tail, self._buf = self._buf, ""
            return self._strip_reasoning_edges(tail).rstrip(), ""
        return "", ""

    @property
    def in_reasoning(self) -> bool:
        """True while the stream is still inside the reasoning block (or undecided)."""
        return self._state in ("start", "reasoning") and self.active

    @property
    def passes_through(self) -> bool:
        """No block (or thinking off), or past ``</think>`` with the answer's first
        character out (the whitespace after the tag is no longer dropped)."""
        return self._state == "passthrough" or (self._state == "content" and self._content_started)

    def _decide_start(self) -> tuple[str, str] | None:
        """Leave the start state once the buffer shows whether a ``<think>`` opens the output.

        Returns the (reasoning, content) to emit when the output turned out to be
        plain content, None when the caller should go on in the reasoning state
        (or keep waiting, the state then still being "start").
        """
        head = self._buf.lstrip()
        if len(head) < len(self.start_tag) and self.start_tag.startswith(head):
            return "", ""  # all whitespace or a partial "<think": wait
        if head.startswith(self.start_tag):
            self._buf = head[len(self.start_tag) :]
            self._state = "reasoning"
            return None
        if self.starts_in_reasoning:
            self._state = "reasoning"
            return None
        self._state = "passthrough"
        text, self._buf = self._buf, ""
        return "", text

    def _advance_reasoning(self) -> tuple[str, str]:
        end = self._buf.find(self.end_tag)
        if end != -1:
            reasoning = self._strip_reasoning_edges(self._buf[:end]).rstrip()
            rest = self._buf[end + len(self.end_tag) :]
            self._buf = ""
            self._state = "content"
            return reasoning, self._content(rest)
        # Hold a possible partial end tag and trailing whitespace (it is dropped if
        # "</think>" follows, emitted if more reasoning does).
        keep = partial_suffix(self._buf, self.end_tag)
        ready = self._buf[: len(self._buf) - keep]
        emit = ready.rstrip()
        self._buf = ready[len(emit) :] + self._buf[len(ready) :]
        return self._strip_reasoning_edges(emit), ""

    def _strip_reasoning_edges(self, text: str) -> str:
        """Drop leading whitespace until the first reasoning character has been emitted."""
        if not self._reasoning_started:
            text = text.lstrip()
            if text:
                self._reasoning_started = True
        return text

    def _content(self, text: str) -> str:
        if not self._content_started:
            text = text.lstrip()
            if text:
                self._content_started = True
        return text


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Qwen3 hybrid models write ``<think>`` themselves; thinking-only templates open it
    in the prompt (pass ``starts_in_reasoning=True``, see ``prompt_opens_think_block``)."""

    default_starts_in_reasoning = False


class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """DeepSeek-R1's template opens ``<think>`` in the prompt, so output starts in reasoning."""

    default_starts_in_reasoning = True


class ThinkingModelReasoningParser(ThinkTagReasoningParser):
    """Thinking-only models (Qwen3-Thinking-2507, MiniMax-M2): their templates open
    ``<think>`` in the prompt, so the output starts inside the reasoning."""

    default_starts_in_reasoning = True


class KimiReasoningParser(ThinkTagReasoningParser):
    """Kimi-VL / Kimi-1.5 thinking: ``◁think▷ … ◁/think▷`` (K2-Thinking uses ``<think>``)."""

    start_tag = "◁think▷"
    end_tag = "◁/think▷"


class MiniMaxAppendThinkReasoningParser(ReasoningParser):
    """MiniMax-M2 with its thinking kept in the answer, as MiniMax recommends for
    multi-turn use: the template opened ``<think>`` in the prompt, so it is put
    back in front of the output and nothing is split off."""

    def __init__(self, **_: object) -> None:
        self._started = False

    def parse(self, text: str) -> tuple[str | None, str]:
        return None, "<think>" + text

    def feed(self, delta: str) -> tuple[str, str]:
        if not self._started:
            self._started = True
            return "", "<think>" + delta
        return "", delta

    def finish(self) -> tuple[str, str]:
        if not self._started:
            self._started = True
            return "", "<think>"
        return "", ""
