"""``passthrough``: tool calls are not parsed; the model's text is content as written.

For models whose format the gateway does not know, or operators who parse
calls themselves (SMG ships the same name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.parsers.base import ToolCall, ToolCallParser, ToolStreamDelta


class PassthroughToolParser(ToolCallParser):
    def __init__(
        self, tool_names: Iterable[str] | None = None, *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        del tool_names, tools
        self.calls_started = 0

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, []

    def feed(self, delta: str) -> ToolStreamDelta:
        return ToolStreamDelta(content=delta)

    def finish(self) -> ToolStreamDelta:
        return ToolStreamDelta()
