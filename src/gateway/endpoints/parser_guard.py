"""A parser that fails is a bug, never a 500: the rest of that choice becomes plain content.

Parsers are tested to never raise (every format, every split, fuzzed), but they
read model output, the least predictable input there is. These wrappers catch
an exception, log it once with the parser's name, hand back as content what the
parser was still holding, and pass the rest of the choice through untouched.
"""

from __future__ import annotations

import logging

from gateway.parsers.base import ReasoningParser, ToolCall, ToolCallParser, ToolStreamDelta

log = logging.getLogger(__name__)


class GuardedToolParser(ToolCallParser):
    def __init__(self, inner: ToolCallParser) -> None:
        self.inner: ToolCallParser | None = inner
        self.calls_started = 0

    def _fail(self, exc: Exception, delta: str) -> ToolStreamDelta:
        inner, self.inner = self.inner, None
        log.error("tool-call parser %s failed (%r); the rest of the output is content", type(inner).__name__, exc)
        held = inner.held if inner is not None else ""
        return ToolStreamDelta(content=held if held.endswith(delta) else held + delta)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.inner is None:
            return text, []
        try:
            return self.inner.parse(text)
        except Exception as exc:
            log.error("tool-call parser %s failed (%r); the output is content", type(self.inner).__name__, exc)
            return text, []

    def feed(self, delta: str) -> ToolStreamDelta:
        if self.inner is None:
            return ToolStreamDelta(content=delta)
        try:
            out = self.inner.feed(delta)
        except Exception as exc:
            return self._fail(exc, delta)
        self.calls_started = self.inner.calls_started
        return out

    @property
    def held(self) -> str:
        return self.inner.held if self.inner is not None else ""

    def finish(self) -> ToolStreamDelta:
        if self.inner is None:
            return ToolStreamDelta()
        try:
            out = self.inner.finish()
        except Exception as exc:
            return self._fail(exc, "")
        self.calls_started = self.inner.calls_started
        return out


class GuardedReasoningParser(ReasoningParser):
    def __init__(self, inner: ReasoningParser) -> None:
        self.inner: ReasoningParser | None = inner

    def _fail(self, exc: Exception, delta: str) -> tuple[str, str]:
        inner, self.inner = self.inner, None
        log.error("reasoning parser %s failed (%r); the rest of the output is content", type(inner).__name__, exc)
        held = inner.held if inner is not None else ""
        return "", held if held.endswith(delta) else held + delta

    def parse(self, text: str) -> tuple[str | None, str]:
        if self.inner is None:
            return None, text
        try:
            return self.inner.parse(text)
        except Exception as exc:
            log.error("reasoning parser %s failed (%r); the output is content", type(self.inner).__name__, exc)
            return None, text

    def feed(self, delta: str) -> tuple[str, str]:
        if self.inner is None:
            return "", delta
        try:
            return self.inner.feed(delta)
        except Exception as exc:
            return self._fail(exc, delta)

    def finish(self) -> tuple[str, str]:
        if self.inner is None:
            return "", ""
        try:
            return self.inner.finish()
        except Exception as exc:
            return self._fail(exc, "")

    @property
    def passes_through(self) -> bool:
        """The inner parser's (a failed one's output is content from then on)."""
        return self.inner is None or self.inner.passes_through

    @property
    def starts_in_reasoning(self) -> bool:
        """The inner parser's (False once it failed: the rest is content)."""
        return self.inner is not None and self.inner.starts_in_reasoning

    @starts_in_reasoning.setter
    def starts_in_reasoning(self, on: bool) -> None:
        if self.inner is not None:
            self.inner.starts_in_reasoning = on

    @property
    def held(self) -> str:
        return self.inner.held if self.inner is not None else ""
