"""Typed stream events: what the OpenAI endpoints yield, one object per streamed chunk.

Endpoints build these slotted objects once per relayed token batch; each front door
turns them into its own wire form exactly once: the HTTP door into SSE bytes
(``to_json``, orjson, the per-stream head pre-serialized), the gRPC door into proto
messages field by field (``server/grpc/convert.py``). No dicts are read back by key
between layers. The JSON shapes are OpenAI's ``chat.completion.chunk`` and streamed
``text_completion`` objects (the openai-client compatibility tests check them):

* a choice's ``logprobs`` and ``finish_reason`` are always present (``null`` until known);
* a chat delta carries only the keys it has (``role``, ``content``, ``reasoning_content``,
  ``tool_calls``);
* SGLang's ``matched_stop`` appears on a choice's last chunk only;
* ``usage`` appears only on usage chunks (the final one, or every chunk with
  ``continuous_usage_stats``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.protocol.responses import ChoiceLogprobs, CompletionLogprobs

CHAT_CHUNK = "chat.completion.chunk"
TEXT_COMPLETION = "text_completion"


@dataclass(slots=True)
class StreamHead:
    """What every chunk of one stream repeats: id, object, created, model.

    ``prefix`` is their JSON, serialized once per stream: each chunk's bytes are this
    prefix, its choices and its usage."""

    id: str
    object: str
    created: int
    model: str
    prefix: bytes = b""

    def __post_init__(self) -> None:
        head = orjson.dumps({"id": self.id, "object": self.object, "created": self.created, "model": self.model})
        self.prefix = head[:-1] + b',"choices":'


@dataclass(slots=True)
class StreamUsage:
    """Token counts of a usage chunk; ``reasoning_tokens`` None leaves the detail out."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out


@dataclass(slots=True)
class ToolCallFragment:
    """A streamed tool-call piece: the first names the call (id, name), later ones add arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            out["function"] = {"name": self.name, "arguments": self.arguments}
        else:
            out["function"] = {"arguments": self.arguments}
        return out


@dataclass(slots=True)
class ChatDelta:
    """One choice of a ``chat.completion.chunk``."""

    index: int
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallFragment] | None = None
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    final: bool = False  # the choice's last chunk: carries matched_stop
    matched_stop: int | str | None = None

    def to_json(self) -> bytes:
        """This choice's JSON: ``orjson.dumps(self.to_dict())``, built directly for the
        relay's common chunk (content only, no logprobs, not the last)."""
        if (
            self.role is None and self.reasoning_content is None and not self.tool_calls
            and self.logprobs is None and self.finish_reason is None and not self.final
            and self.content is not None
        ):  # fmt: skip
            return b"".join((
                b'{"index":', str(self.index).encode(), b',"delta":{"content":', orjson.dumps(self.content),
                b'},"logprobs":null,"finish_reason":null}',
            ))  # fmt: skip
        return orjson.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        content, reasoning = self.content, self.reasoning_content
        if self.role is None and reasoning is None and not self.tool_calls:
            delta: dict[str, Any] = {} if content is None else {"content": content}  # the common case
        else:
            delta = {}
            if self.role is not None:
                delta["role"] = self.role
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if content is not None:
                delta["content"] = content
            if self.tool_calls:
                delta["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        logprobs = self.logprobs
        out: dict[str, Any] = {
            "index": self.index,
            "delta": delta,
            "logprobs": None if logprobs is None else logprobs.to_dict(),
            "finish_reason": self.finish_reason,
        }
        if self.final:
            out["matched_stop"] = self.matched_stop
        return out


@dataclass(slots=True)
class CompletionDelta:
    """One choice of a streamed ``text_completion``."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None

    def to_json(self) -> bytes:
        """This choice's JSON: ``orjson.dumps(self.to_dict())``, built directly for the
        relay's common chunk (no logprobs, not the last)."""
        if self.logprobs is None and self.finish_reason is None:
            return b"".join((
                b'{"index":', str(self.index).encode(), b',"text":', orjson.dumps(self.text),
                b',"logprobs":null,"finish_reason":null}',
            ))  # fmt: skip
        return orjson.dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "text": self.text,
            "logprobs": None if self.logprobs is None else self.logprobs.to_dict(),
            "finish_reason": self.finish_reason,
        }
        if self.finish_reason is not None:
            out["matched_stop"] = self.matched_stop
        return out


@dataclass(slots=True)
class StreamChunk:
    """One streamed event: a ``chat.completion.chunk`` or a ``text_completion``."""

    head: StreamHead
    choices: list[ChatDelta] | list[CompletionDelta] = field(default_factory=list)
    usage: StreamUsage | None = None

    def to_json(self) -> bytes:
        """The event's JSON, built from the stream's pre-serialized head."""
        choices = self.choices
        if self.usage is None:
            if len(choices) == 1:  # the relay's common case: one choice, no usage
                return b"".join((self.head.prefix, b"[", choices[0].to_json(), b"]}"))
            return b"".join((self.head.prefix, orjson.dumps([c.to_dict() for c in choices]), b"}"))
        return b"".join((
            self.head.prefix, orjson.dumps([c.to_dict() for c in choices]),
            b',"usage":', orjson.dumps(self.usage.to_dict()), b"}",
        ))  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The same object as a dict (tests, and callers that want to inspect it)."""
        out: dict[str, Any] = orjson.loads(self.to_json())
        return out


@dataclass(slots=True)
class JsonEvent:
    """An already-shaped JSON object (SGLang's native ``/generate`` stream)."""

    data: dict[str, Any]

    def to_json(self) -> bytes:
        return orjson.dumps(self.data)


def text_template(head: StreamHead, choice: Callable[[str], ChatDelta | CompletionDelta]) -> tuple[bytes, bytes]:
    """A one-choice chunk's JSON cut around its text's JSON string: ``prefix +
    orjson.dumps(text) + suffix`` is ``StreamChunk(head, [choice(text)]).to_json()`` for any
    ``text`` (cut from a real chunk around a probe text, so it cannot drift from it)."""
    probe = "\x00"
    whole = StreamChunk(head, [choice(probe)]).to_json()  # type: ignore[arg-type]
    marker = orjson.dumps(probe)
    if whole.count(marker) != 1:
        raise ValueError("the probe text must appear exactly once in the chunk")
    at = whole.index(marker)
    return whole[:at], whole[at + len(marker):]


def text_events(
    head: StreamHead, choice: Callable[[str], ChatDelta | CompletionDelta], frame: tuple[bytes, bytes] | None,
) -> Callable[[list[str]], Any]:
    """What a door gets for the texts of tokens that arrived together (``Generation.deltas(
    texts=True)``) on a one-choice stream whose chunks carry text only: one event whose text
    is theirs, joined (one message per batch, not per token; no logprobs ride on these).
    With ``frame`` (a JSON door's bytes around each event) its framed bytes, built from the
    ``text_template``; without it (a door that builds its own messages) the typed chunk."""
    if frame is None:
        return lambda texts: StreamChunk(head, [choice(texts[0] if len(texts) == 1 else "".join(texts))])  # type: ignore[arg-type]
    prefix, suffix = text_template(head, choice)
    prefix, suffix = frame[0] + prefix, suffix + frame[1]
    dumps = orjson.dumps
    return lambda texts: b"".join((prefix, dumps(texts[0] if len(texts) == 1 else "".join(texts)), suffix))
