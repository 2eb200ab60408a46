"""/v1/chat/completions: template, tokenize, generate, then split reasoning and tool calls.

Each choice runs its text through a reasoning parser (``<think>…</think>``) and
then a tool-call parser, streaming or whole; both are pure text machines from
``gateway.parsers``. Streams yield typed events (``protocol.stream``) that each
front door serializes once; a request with neither parser skips both per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gateway.endpoints.chat_parsers import ChatParsers, choose_parsers, template_kwargs
from gateway.endpoints.completions import piece_fn, stream_usage
from gateway.endpoints.events import Answer, Direct, Events, FrameWriter
from gateway.endpoints.long_lists import STEP_ITEMS, map_in_steps
from gateway.parsers.base import ReasoningParser, ToolCallDelta, ToolCallParser
from gateway.parsers.reasoning_tokens import ReasoningTokenCounter
from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine
from gateway.pipeline.generation import Generation, SampleDelta
from gateway.pipeline.limits import check_tools
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.running_loop import running_loop
from gateway.pipeline.tenancy import effective_salt
from gateway.protocol.chat import ChatCompletionRequest, ChatMessage
from gateway.protocol.errors import GatewayError
from gateway.protocol.logprobs import chat_logprobs
from gateway.protocol.responses import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionResponse,
    now,
    openai_finish_reason,
    shaped,
    usage_dict,
)
from gateway.protocol.sampling import sampling_from_chat
from gateway.protocol.stream import (
    CHAT_CHUNK,
    ChatDelta,
    StreamChunk,
    StreamHead,
    ToolCallFragment,
    text_events,
)


@dataclass
class _Choice:
    """Per-choice parser state."""

    reasoning: ReasoningParser | None
    tools: ToolCallParser | None
    counter: ReasoningTokenCounter | None  # the choice's reasoning tokens (None: no reasoning parsed)
    max_calls: int | None = None  # parallel_tool_calls false: only the first call
    sent_role: bool = False
    ids: list[int] = field(default_factory=list)
    reply: list[str] | None = None  # streamed content kept for --reply-token-reuse; None: not kept

    @property
    def reasoning_tokens(self) -> int:
        return self.counter.count if self.counter is not None else 0

    def count(self, token_ids: list[int]) -> None:
        if self.counter is not None:
            self.counter.feed(token_ids)

    def split(self, text: str, *, final: bool) -> tuple[str, str, list[ToolCallDelta]]:
        """(reasoning, content, tool call deltas) for new text."""
        reasoning = ""
        content = text
        if self.reasoning is not None:
            r, content = self.reasoning.feed(text)
            reasoning += r
            if final:
                r2, c2 = self.reasoning.finish()
                reasoning += r2
                content += c2
        calls: list[ToolCallDelta] = []
        if self.tools is not None:
            out = self.tools.feed(content)
            content = out.content
            calls = list(out.tool_calls)
            if final:
                tail = self.tools.finish()
                content += tail.content
                calls.extend(tail.tool_calls)
            if self.max_calls is not None:  # parallel_tool_calls: false keeps the first call only
                calls = [c for c in calls if c.index < self.max_calls]
        return reasoning, content, calls


async def _start(engine: Engine, req: ChatCompletionRequest, ctx: RequestContext) -> tuple[ModelEntry, Generation, str, ChatParsers]:
    await ctx.reserve(req.n)  # one admission slot per sample, before any templating
    entry = engine.catalog.get(req.model)
    kwargs = template_kwargs(req)
    check_tools(req.tools_json(), engine.limits)
    parsers = choose_parsers(entry, req)
    sampling = sampling_from_chat(req, entry.facts.default_sampling).with_constraint(parsers.constraint)
    if parsers.keep_special_tokens and sampling.skip_special_tokens:
        # The model's tool-call / channel markers are special tokens: the parsers need them.
        sampling = dataclasses.replace(sampling, skip_special_tokens=False)
    salt = effective_salt(ctx.cache_salt, req.cache_salt)
    if len(req.messages) > STEP_ITEMS:  # thousands of messages: loop turns between their parts
        messages = await map_in_steps(ChatMessage.to_template, req.messages)
        await asyncio.sleep(0)
    else:
        messages = req.template_messages()
    text, ids = await engine.render_chat(
        entry, messages, tools=req.template_tools(), chat_template_kwargs=kwargs or None, cache_salt=salt,
    )
    prepared = engine.prepare(
        entry, ids, sampling, stream=req.stream, request_id=ctx.request_id, prompt_text=text,
        routing_key=ctx.routing_key, target_worker=ctx.target_worker,
        require_reasoning=parsers.reasoning_enabled, prompt_param="messages",
        cache_salt=salt,
    )
    gen = await (engine.start(prepared) if ctx.journal_ids is None else engine.start_from_journal(prepared, ctx.journal_ids))
    ctx.worker_ids = [gen.worker_id]
    return entry, gen, text, parsers


def _choices(gen: Generation, prompt_text: str, parsers: ChatParsers) -> list[_Choice]:
    max_calls = None if parsers.parallel_tool_calls else 1
    out = []
    for _ in range(gen.prepared.sampling.n):
        reasoning = parsers.new_reasoning(prompt_text)
        out.append(_Choice(reasoning, parsers.new_tools(), parsers.reasoning_counter(reasoning), max_calls))
    return out


def _reasoning_total(choices: list[_Choice]) -> int:
    return sum(c.reasoning_tokens for c in choices)


def _record_reply(entry: ModelEntry, gen: Generation, req: ChatCompletionRequest, ctx: RequestContext, index: int, content: str) -> None:
    """Remember a finished plain reply's generated ids (``tokenization.reply_cache``), so
    the next turn that sends it back is tokenized as what the worker cached."""
    if entry.reply_cache is not None and content:
        entry.reply_cache.record(
            effective_salt(ctx.cache_salt, req.cache_salt), content, gen.output_ids(index),
            gen.prepared.stop_plan.token_stops,
        )


async def open(
    engine: Engine, req: ChatCompletionRequest, ctx: RequestContext, frame: tuple[bytes, bytes] | None = None,
    *, typed: bool = False,
) -> Answer | Events:
    """The chat API's one entry point (``endpoints.events``): the whole answer, or, for
    ``req.stream``, the started generation's chunks. With ``frame`` (the two bytes a door
    writes around each event's JSON; SSE: ``data: `` and a blank line) the common
    request's ordinary tokens (no tool parser, one sample, no logprobs, no stop string,
    no continuous usage: ``Generation.deltas(texts=True)``; content once a reasoning split
    is decided) come already written, ``frame[0] + to_json() + frame[1]`` byte for byte,
    from a template around the text; with ``typed`` (a door that builds its own messages)
    the texts of tokens that arrived together come as one chunk (``text_events``)."""
    entry, gen, prompt_text, parsers = await _start(engine, req, ctx)
    if req.stream:
        direct = Direct() if frame is not None else None
        return Events(_chunks(req, entry, gen, prompt_text, parsers, ctx, frame, typed, direct), [gen], direct)
    return await _answer(req, ctx, entry, gen, prompt_text, parsers)


async def _answer(
    req: ChatCompletionRequest, ctx: RequestContext, entry: ModelEntry, gen: Generation, prompt_text: str, parsers: ChatParsers
) -> dict[str, Any]:
    choices = _choices(gen, prompt_text, parsers)
    texts: dict[int, list[str]] = {}
    lps: dict[int, tuple[list[int], list[float], list[Any]]] = {}
    finish: dict[int, SampleDelta] = {}
    async for d in gen.deltas():
        texts.setdefault(d.index, []).append(d.text)
        choices[d.index].count(d.token_ids)
        if d.logprobs is not None:
            ids, values, tops = lps.setdefault(d.index, ([], [], []))
            lp_ids = d.logprob_ids
            ids.extend(lp_ids)
            values.extend(d.logprobs)
            tops.extend(d.top_logprobs or [[] for _ in lp_ids])
        if d.finish_reason is not None:
            finish[d.index] = d
    out: list[dict[str, Any]] = []
    for i, choice in enumerate(choices):
        text = "".join(texts.get(i, []))
        reasoning: str | None = None
        content: str | None = text
        if choice.reasoning is not None:
            reasoning, content = choice.reasoning.parse(text)
        calls = None
        if choice.tools is not None:
            content, parsed = choice.tools.parse(content or "")
            if choice.max_calls is not None:
                parsed = parsed[: choice.max_calls]
            calls = [c.to_protocol() for c in parsed] or None
        last = finish.get(i)
        if last is not None and not reasoning and not calls and content and entry.reply_cache is not None:
            # For the next turn, which cannot come before this answer: recorded right after
            # the answer is written (a decode of the reply), not before it.
            running_loop().call_soon(_record_reply, entry, gen, req, ctx, i, content)
        finish_reason = openai_finish_reason(last.finish_reason if last else None, tool_calls=bool(calls))
        matched_stop = last.matched_stop if last else None
        message_content = content if (content or not calls) else None
        if not calls and not gen.prepared.sampling.logprobs and _plain_values(message_content, reasoning, matched_stop):
            # The common answer: its dict built straight from the models' shape (no pydantic).
            message = shaped(ChatCompletionMessage, {"content": message_content, "reasoning_content": reasoning or None})
            out.append(shaped(ChatCompletionChoice, {
                "index": i, "message": message, "finish_reason": finish_reason, "matched_stop": matched_stop,
            }))
            continue
        logprobs = None
        if gen.prepared.sampling.logprobs:
            ids, values, tops = lps.get(i, ([], [], []))
            logprobs = chat_logprobs(ids, values, tops if gen.prepared.sampling.top_logprobs else None, piece_fn(entry))
        out.append(
            ChatCompletionChoice(
                index=i,
                message=ChatCompletionMessage(content=message_content, reasoning_content=reasoning or None, tool_calls=calls),
                logprobs=logprobs,
                finish_reason=finish_reason,
                matched_stop=matched_stop,
            ).to_dict()
        )
    u = gen.usage
    reasoning_tokens = _reasoning_total(choices)  # never the worker's count (parsers.reasoning_tokens)
    return shaped(ChatCompletionResponse, {
        "id": ctx.response_id("chatcmpl"), "created": now(), "model": entry.name, "choices": out,
        "usage": usage_dict(u.prompt_tokens, u.completion_tokens, cached_tokens=u.cached_tokens,
                            reasoning_tokens=reasoning_tokens if parsers.reasoning_enabled else None),
    })


def _plain_values(content: str | None, reasoning: str | None, matched_stop: Any) -> bool:
    """The answer's values are of the exact types the response model holds (nothing for
    pydantic to validate or convert), so ``shaped`` builds the same dict."""
    return (
        (content is None or type(content) is str)
        and (reasoning is None or type(reasoning) is str)
        and (matched_stop is None or type(matched_stop) in (int, str))
    )


def _settled(c: _Choice) -> bool:
    """The choice's reasoning split is decided: every later text is content as generated
    and its reasoning-token count is final, so the loop's per-token work would only copy
    each text into a content-only chunk."""
    return (
        c.reasoning is not None and c.reasoning.passes_through
        and (c.counter is None or c.counter.done)
    )  # fmt: skip


@dataclass(slots=True)
class _Split:
    """The text path's reasoning split while it is undecided, shared by the stream's loop and
    its push sink: whether it still splits, and choice 0's output ids already fed to the
    reasoning counter."""

    splitting: bool = False
    counted: int = 0

    def take(self, gen: Generation, first: _Choice, texts: list[str]) -> tuple[str, str]:
        """A list's text through the parser as one piece and its tokens (empty texts'
        included) through the counter: (reasoning, content) to send."""
        ids = gen.output_ids(0)
        first.count(ids[self.counted:])
        self.counted = len(ids)
        reasoning, content, _ = first.split("".join(texts), final=False)
        if first.reply is not None:
            if reasoning:
                first.reply = None
            elif content:
                first.reply.append(content)
        self.splitting = not _settled(first)
        return reasoning, content


class _ChatPush:
    """``Generation.push_to``'s sink on the chat text path: a delivery's texts become the
    bytes the loop would write for that list (content as generated once the reasoning split
    is settled, before that the parser's chunk), written with the door's writer."""

    __slots__ = ("event", "first", "frame", "gen", "head", "ready", "split", "writer")

    def __init__(
        self, writer: FrameWriter, frame: tuple[bytes, bytes], head: StreamHead, event: Any, gen: Generation,
        first: _Choice, split: _Split,
    ) -> None:
        self.writer = writer
        self.ready: Any = writer.writable  # asked once per delivery: no call of ours around it
        self.frame = frame
        self.head = head
        self.event = event
        self.gen = gen
        self.first = first
        self.split = split

    def write(self, texts: list[str]) -> None:
        if not self.split.splitting:
            reply = self.first.reply
            if reply is not None:
                reply.extend(texts)
            data = self.event(texts)
        else:
            reasoning, content = self.split.take(self.gen, self.first, texts)
            if not (reasoning or content):
                return
            chunk = StreamChunk(self.head, [ChatDelta(0, None, content or None, reasoning or None)])
            data = b"".join((self.frame[0], chunk.to_json(), self.frame[1]))
        self.writer.push(data)  # ``ready`` said it would write, in this same step


def _fragments(calls: list[ToolCallDelta]) -> list[ToolCallFragment]:
    return list(calls)  # a parser's delta is the stream's fragment: no copy per delta


async def _chunks(
    req: ChatCompletionRequest, entry: ModelEntry, gen: Generation, prompt_text: str, parsers: ChatParsers, ctx: RequestContext,
    frame: tuple[bytes, bytes] | None = None, typed: bool = False, direct: Direct | None = None,
) -> AsyncGenerator[StreamChunk | Any, None]:
    head = StreamHead(ctx.response_id("chatcmpl"), CHAT_CHUNK, now(), entry.name)
    choices = _choices(gen, prompt_text, parsers)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    want_lp = gen.prepared.sampling.logprobs
    top_n = gen.prepared.sampling.top_logprobs
    piece = piece_fn(entry) if want_lp else None
    plain = all(c.reasoning is None and c.tools is None for c in choices)  # text goes straight to content
    if entry.reply_cache is not None:
        for c in choices:
            c.reply = []

    source: AsyncIterator[Any] = gen.deltas()
    role = b""  # a framed text path: the role event, written with the first text's
    first = choices[0]  # the only choice whenever text lists come
    # The text path: ordinary tokens come as lists of texts (``Generation.deltas(texts=True)``),
    # for one choice with text only (no tool parser, logprobs or continuous usage). With no
    # reasoning parser, or once its split is decided (``_settled``), a list is content as
    # generated and becomes the door's event directly; before that, the list's text goes
    # through the parser as one piece, its ids through the reasoning counter.
    lists = (frame is not None or typed) and first.tools is None and piece is None and not continuous and gen.plain
    event: Any = None
    if lists:
        source = gen.deltas(texts=True)
        event = text_events(head, lambda text: ChatDelta(0, content=text), frame)
        first.sent_role = True
        opening = StreamChunk(head, [ChatDelta(0, role="assistant", content="")])
        if frame is not None:
            role = frame[0] + opening.to_json() + frame[1]
        else:
            yield opening
    else:
        for i, c in enumerate(choices):
            c.sent_role = True
            yield StreamChunk(head, [ChatDelta(i, role="assistant", content="")], stream_usage(gen.usage) if continuous else None)
    split = _Split(splitting=lists and first.reasoning is not None and not _settled(first))
    try:
        async for d in source:
            if type(d) is list:
                if not split.splitting:
                    if first.reply is not None:
                        first.reply.extend(d)
                    out = event(d)
                    if role:
                        out = role + out
                        role = b""
                    yield out
                else:
                    reasoning, content = split.take(gen, first, d)
                    if reasoning or content:
                        if role:
                            yield role
                            role = b""
                        yield StreamChunk(head, [ChatDelta(0, None, content or None, reasoning or None)])
                if direct is not None and direct.writer is not None and frame is not None:
                    # The door wrote its first event: later lists go straight to the client.
                    gen.push_to(_ChatPush(direct.writer, frame, head, event, gen, first, split))
                    direct = None
                continue
            if role:  # the first event is not a token's text: the role goes out on its own first
                yield role
                role = b""
            c = choices[d.index]
            final = d.finish_reason is not None
            calls: list[ToolCallDelta] = []
            if plain:
                reasoning, content = "", d.text
            else:
                if split.splitting:  # tokens with empty texts that came in no list, then the delta's
                    ids = gen.output_ids(0)
                    c.count(ids[split.counted:d.at])
                    split.counted = len(ids)
                c.count(d.token_ids)
                reasoning, content, calls = c.split(d.text, final=final)
            logprobs = None
            if piece is not None and d.token_ids:
                # Streamed, the stop token's row is not sent: SGLang's own server attaches a
                # step's rows to its text, and the stop token's text is trimmed.
                logprobs = chat_logprobs(d.token_ids, d.logprobs or [], d.top_logprobs if top_n else None, piece)
            if c.reply is not None:
                if reasoning or calls:
                    c.reply = None  # not a plain reply: never recorded
                elif content:
                    c.reply.append(content)
            if not (reasoning or content or calls) and not final and logprobs is None:
                continue
            delta = ChatDelta(d.index, None, content or None, reasoning or None, _fragments(calls) if calls else None, logprobs)
            if final:
                used_tools = c.tools is not None and c.tools.calls_started > 0
                delta.finish_reason = openai_finish_reason(d.finish_reason, tool_calls=used_tools)
                delta.final = True
                delta.matched_stop = d.matched_stop
                if c.reply:
                    _record_reply(entry, gen, req, ctx, d.index, "".join(c.reply))
            yield StreamChunk(head, [delta], stream_usage(gen.usage) if continuous else None)
            if split.splitting:
                split.splitting = not _settled(c)
    except GatewayError:
        if role:
            yield role  # the role event before the error's, as on the general path
        raise
    if role:
        yield role
    if include_usage:
        u = gen.usage
        usage = stream_usage(u)
        if parsers.reasoning_enabled:
            usage.reasoning_tokens = _reasoning_total(choices)
        yield StreamChunk(head, [], usage)
