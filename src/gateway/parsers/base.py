"""The parser interfaces and the small value types they exchange with the pipeline.

Parsers are pure text machines: one instance per generated choice, fed the
decoded text delta by delta (``feed``) and closed with ``finish()``, or given a
whole text at once (``parse``). For valid model output the two modes agree: the
streamed pieces concatenate to the one-shot result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from gateway.protocol.ids import random_hex
from gateway.protocol.responses import DeltaFunctionCall, DeltaToolCall, FunctionCall
from gateway.protocol.responses import ToolCall as ProtocolToolCall
from gateway.protocol.stream import ToolCallFragment


def new_tool_call_id() -> str:
    """``call_`` + 24 random hex digits, the shape OpenAI clients expect."""
    return "call_" + random_hex(12)


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ``text`` ends with.

    That many trailing characters must be held back: the next delta may
    complete them into ``tag``.
    """
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call; ``arguments`` is JSON text exactly as the model wrote it."""

    id: str
    name: str
    arguments: str

    def to_protocol(self) -> ProtocolToolCall:
        return ProtocolToolCall(
            id=self.id, function=FunctionCall(name=self.name, arguments=self.arguments)
        )


@dataclass(slots=True)
class ToolCallDelta(ToolCallFragment):
    """One streamed fragment of tool call ``index``.

    The first fragment of a call carries ``id``, ``name`` (and ``type`` in the
    OpenAI shape) plus any arguments text already known; later fragments carry
    only ``index`` and the next piece of ``arguments``.
    """

    def to_openai(self) -> dict[str, Any]:
        """The ``choices[].delta.tool_calls[]`` entry of a chat.completion.chunk."""
        return self.to_dict()

    def to_protocol(self) -> DeltaToolCall:
        return DeltaToolCall(
            index=self.index,
            id=self.id,
            type="function" if self.id is not None else None,
            function=DeltaFunctionCall(name=self.name, arguments=self.arguments),
        )


@dataclass(slots=True)
class ToolStreamDelta:
    """What one ``feed``/``finish`` of a tool-call parser yields: content and call fragments."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)

    def add_call_fragment(self, fragment: ToolCallDelta) -> None:
        """Append, merging with the previous fragment of the same call (fewer, fuller chunks)."""
        if self.tool_calls and self.tool_calls[-1].index == fragment.index and fragment.id is None:
            self.tool_calls[-1].arguments += fragment.arguments
            return
        self.tool_calls.append(fragment)


class ReasoningParser(ABC):
    """Split reasoning ("thinking") text from the answer.

    ``parse(text) -> (reasoning or None, content)``; streaming ``feed(delta) ->
    (reasoning_delta, content_delta)`` and ``finish()`` for what was held back
    at the end.
    """

    @abstractmethod
    def parse(self, text: str) -> tuple[str | None, str]: ...

    @abstractmethod
    def feed(self, delta: str) -> tuple[str, str]: ...

    @abstractmethod
    def finish(self) -> tuple[str, str]: ...

    @property
    def passes_through(self) -> bool:
        """True once every later ``feed(delta)`` is ``("", delta)`` and ``finish()`` is
        ``("", "")``: the split is decided and the rest is content as generated (a relay may
        then skip the parser). False unless a parser knows it."""
        return False

    # Capabilities only some parsers have, with defaults here, so callers read and set
    # them on every parser instead of probing for them.

    starts_in_reasoning: bool = False
    """The text starts inside the reasoning block (the prompt opened it). Parsers that do
    not split on a start tag ignore it."""

    @property
    def held(self) -> str:
        """Text the parser holds, not yet decided (what a failed parser's guard hands over as content)."""
        return ""


class ToolCallParser(ABC):
    """Pull tool calls out of the answer text.

    ``parse(text) -> (content, calls)``; streaming ``feed(delta) ->
    ToolStreamDelta`` and ``finish()``. ``calls_started`` counts calls whose
    first fragment has been streamed (finish_reason becomes ``tool_calls``).
    """

    calls_started: int = 0

    @abstractmethod
    def parse(self, text: str) -> tuple[str, list[ToolCall]]: ...

    @abstractmethod
    def feed(self, delta: str) -> ToolStreamDelta: ...

    @abstractmethod
    def finish(self) -> ToolStreamDelta: ...

    @property
    def held(self) -> str:
        """Text the parser holds, not yet decided (what a failed parser's guard hands over
        as content); empty unless the parser holds text back."""
        return ""
