"""What an API's one entry point returns: a whole answer, or the events of a started stream.

Each API module (``chat``, ``completions``, ``native``) has one ``open``-style entry
point that every front door calls. A request that is not streamed gets its answer as
JSON-able data; a streamed one gets ``Events``: its generations are already started (so
an error before the first output is raised by the entry point, and a door still answers
it with a status), and the events come as the door iterates. A door that writes SSE may
ask for the common events already framed (``bytes``); a door that converts each event
(gRPC) asks for typed events only.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any, Protocol

from gateway.pipeline.generation import Generation

# A whole answer: the JSON-able body the door writes (OpenAI and SGLang answers are
# objects; a batch of ``/generate`` prompts is a list).
Answer = dict[str, Any] | list[Any]


class FrameWriter(Protocol):
    """A door's straight write of framed events to its client (the HTTP door's ``ChunkWriter``)."""

    def writable(self) -> bool: ...  # ``write`` would write now (else the door's own send must wait)

    def write(self, data: bytes) -> bool: ...  # False: not written (not ``writable``)

    def push(self, data: bytes) -> None: ...  # ``write`` right after ``writable`` said True, nothing written since


class Direct:
    """Where a door tells a framed text path it may write events itself: ``writer`` is set
    once the door's first event went out its own way (which timed it)."""

    __slots__ = ("writer",)

    def __init__(self) -> None:
        self.writer: FrameWriter | None = None


class TextPush:
    """``Generation.push_to``'s sink on a framed text path: the texts of tokens that
    arrived together become ``event(texts)`` (the bytes the door would write for that list
    from ``deltas``), written there and then; ``kept`` (a reply being recorded) gets them too."""

    __slots__ = ("event", "kept", "ready", "writer")

    def __init__(self, writer: FrameWriter, event: Callable[[list[str]], bytes], kept: list[str] | None = None) -> None:
        self.writer = writer
        self.event = event
        self.kept = kept
        self.ready: Callable[[], bool] = writer.writable  # asked once per delivery: no call of ours around it

    def write(self, texts: list[str]) -> None:
        if self.kept is not None:
            self.kept.extend(texts)
        self.writer.push(self.event(texts))  # ``ready`` said it would write, in this same step


class Events:
    """A started stream: iterate for its events; ``aclose`` (or leaving ``async with``)
    ends it however the door stops reading, and the worker requests with it. ``direct``:
    the stream's text path can write ordinary tokens' events itself (``Direct``)."""

    __slots__ = ("direct", "events", "gens")

    def __init__(self, events: AsyncGenerator[Any, None], gens: list[Generation], direct: Direct | None = None) -> None:
        self.events = events
        self.gens = gens
        self.direct = direct

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        return self.events

    async def aclose(self) -> None:
        """Close the events' generator, then abort any generation still open: a client that
        left mid-stream frees its worker's slot now, not when the generator is collected."""
        await self.events.aclose()
        for gen in self.gens:
            if not gen.stream.closed:
                await gen.stream.abort("client gone")

    async def __aenter__(self) -> Events:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def answer_of(result: Answer | Events) -> dict[str, Any]:
    """The answer of a chat or completions request sent with ``stream`` false (for a door
    that knows which it asked for)."""
    if not isinstance(result, dict):
        raise TypeError("a request that was not streamed did not return one answer")
    return result


def events_of(result: Answer | Events) -> Events:
    """The events of a request sent with ``stream`` true."""
    if not isinstance(result, Events):
        raise TypeError("a streamed request returned a whole answer")
    return result
