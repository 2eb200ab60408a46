"""One assistant turn through the chat pipeline, as a sequence of content blocks.

The Anthropic Messages and OpenAI Responses endpoints are other shapes of a chat
completion: their requests become a ``ChatCompletionRequest`` and run through the
chat endpoint's stream (template, tokenization with reply-token reuse, routing,
reasoning and tool-call parsers, stops, usage), never a fork of it. What they need
from that stream is the same: the answer as blocks (reasoning, text, one per tool
call) that start, grow and stop, and how the turn ended. ``TurnBlocks`` turns chat
deltas into those block events; each endpoint renders them in its own wire form,
streamed or collected into one object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from gateway.endpoints import chat as chat_route
from gateway.endpoints.events import Events, events_of
from gateway.pipeline.engine import Engine
from gateway.pipeline.generation import Generation
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.responses import TokenLogprob
from gateway.protocol.stream import ChatDelta, StreamChunk

BlockKind = Literal["reasoning", "text", "tool_call"]


@dataclass(slots=True)
class Block:
    """A block of the answer: its text so far (a tool call's arguments JSON)."""

    index: int
    kind: BlockKind
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # a text block's tokens, when asked for


@dataclass(slots=True)
class BlockStart:
    block: Block


@dataclass(slots=True)
class BlockDelta:
    block: Block
    text: str
    logprobs: list[TokenLogprob] | None = None  # the tokens of ``text`` (a text block's, when asked for)


@dataclass(slots=True)
class BlockStop:
    block: Block


@dataclass(slots=True)
class TurnEnd:
    """How the turn ended: the chat finish reason (``stop``, ``length``, ``tool_calls``,
    ``abort``) and the stop that matched (a stop string, or a token id)."""

    finish_reason: str | None
    matched_stop: int | str | None


BlockEvent = BlockStart | BlockDelta | BlockStop | TurnEnd


@dataclass
class TurnBlocks:
    """Chat deltas of one choice -> block events. A block stops when another kind
    starts (reasoning comes before text; each tool call is its own block)."""

    blocks: list[Block] = field(default_factory=list)
    _open: Block | None = None
    _calls: dict[int, Block] = field(default_factory=dict)
    _logprobs: list[TokenLogprob] = field(default_factory=list)  # text tokens whose text is not out yet

    def _text_block(self, kind: BlockKind, out: list[BlockEvent]) -> Block:
        """The open block if it is of ``kind`` (not a call), else a new one (the open one stops)."""
        cur = self._open
        if cur is not None and cur.kind == kind:
            return cur
        if cur is not None:
            out.append(BlockStop(cur))
        block = Block(len(self.blocks), kind)
        self.blocks.append(block)
        self._open = block
        out.append(BlockStart(block))
        return block

    def feed(self, delta: ChatDelta) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        if delta.logprobs is not None and delta.logprobs.content and not delta.reasoning_content:
            self._logprobs.extend(delta.logprobs.content)  # tokens of text (held back, or in this delta)
        for kind, text in (("reasoning", delta.reasoning_content), ("text", delta.content)):
            if text:
                block = self._text_block(kind, out)  # type: ignore[arg-type]
                block.text += text
                lps = None
                if kind == "text" and self._logprobs:
                    lps, self._logprobs = self._logprobs, []
                    block.logprobs.extend(lps)
                out.append(BlockDelta(block, text, lps))
        for frag in delta.tool_calls or ():
            call = self._calls.get(frag.index)
            if call is None:
                if self._open is not None:
                    out.append(BlockStop(self._open))
                call = Block(len(self.blocks), "tool_call", call_id=frag.id, name=frag.name)
                self.blocks.append(call)
                self._calls[frag.index] = call
                self._open = call
                out.append(BlockStart(call))
            if frag.arguments:
                call.text += frag.arguments
                out.append(BlockDelta(call, frag.arguments))
        if delta.finish_reason is not None or delta.final:
            if self._logprobs and self._open is not None and self._open.kind == "text":
                self._open.logprobs.extend(self._logprobs)  # tokens that ended without text of their own
            self._logprobs = []
            if self._open is not None:
                out.append(BlockStop(self._open))
                self._open = None
            out.append(TurnEnd(delta.finish_reason, delta.matched_stop))
        return out


@dataclass
class Turn:
    """A started turn: its generation (usage, output ids) and its block events."""

    gen: Generation
    blocks: TurnBlocks
    events: AsyncIterator[BlockEvent]


async def start_turn(engine: Engine, req: ChatCompletionRequest, ctx: RequestContext) -> Turn:
    """Start the chat generation (errors before output raise here), then stream block events."""
    req = req.model_copy(update={"stream": True, "n": 1, "stream_options": None})
    chunks = events_of(await chat_route.open(engine, req, ctx))  # typed chunks: no frame
    blocks = TurnBlocks()
    return Turn(chunks.gens[0], blocks, _events(chunks, blocks))


async def _events(chunks: Events, blocks: TurnBlocks) -> AsyncIterator[BlockEvent]:
    try:
        async for chunk in chunks:
            if not isinstance(chunk, StreamChunk):
                continue
            for delta in chunk.choices:
                if isinstance(delta, ChatDelta):
                    for event in blocks.feed(delta):
                        yield event
    finally:
        await chunks.aclose()  # the generation ends (and its worker request) with the turn
