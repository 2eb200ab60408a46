"""/v1/completions: token-id or text prompts (batched), streamed or whole.

Streams yield typed, slotted events (``gateway.protocol.stream``), built once per
token batch and serialized once by each front door; the shapes are checked against
the official ``openai`` client types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable
from typing import Any

from gateway.endpoints.events import Answer, Direct, Events, TextPush
from gateway.pipeline.catalog import ModelEntry
from gateway.pipeline.engine import Engine
from gateway.pipeline.fanout import merged
from gateway.pipeline.generation import Generation, SampleDelta, UsageCounts
from gateway.pipeline.limits import check_batch
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.tenancy import effective_salt
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.errors import ModelNotFoundError
from gateway.protocol.logprobs import completion_logprobs
from gateway.protocol.responses import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
    new_id,
    now,
)
from gateway.protocol.sampling import sampling_from_completion
from gateway.protocol.stream import (
    TEXT_COMPLETION,
    CompletionDelta,
    StreamChunk,
    StreamHead,
    StreamUsage,
    text_events,
)
from gateway.protocol.stream import text_template as stream_text_template


def piece_fn(entry: ModelEntry) -> Any:
    tok = entry.tokenizer
    return lambda token_id: tok.decode([token_id], skip_special_tokens=False)


def stream_usage(u: UsageCounts) -> StreamUsage:
    return StreamUsage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)


def sum_usage(gens: list[Generation]) -> UsageCounts:
    total = UsageCounts()
    for g in gens:
        total.prompt_tokens += g.usage.prompt_tokens
        total.completion_tokens += g.usage.completion_tokens
        total.cached_tokens += g.usage.cached_tokens
        total.reasoning_tokens += g.usage.reasoning_tokens
    return total


def refuse_long_prompts(engine: Engine, model: object, lengths: Iterable[int]) -> None:
    """Refuse token-id prompts too long for their model from their lengths alone
    (``Engine.check_prompt_length``), with the error the whole request's checks would give
    them. A front door calls it before the request is validated: a prompt of hundreds of
    thousands of ids would otherwise be type-checked, copied and scanned for its range on
    the event loop only to be refused for its length. A model this gateway does not know
    is left to the request's own checks (their errors come in their order)."""
    if model is not None and type(model) is not str:
        return
    try:
        entry = engine.catalog.get(model)
    except ModelNotFoundError:
        return
    for length in lengths:
        engine.check_prompt_length(entry, length)


def refuse_long_body(engine: Engine, body: Any, field: str = "prompt") -> None:
    """``refuse_long_prompts`` on a body as parsed, before its validation: its ``field``
    (``prompt``; ``/generate``: ``input_ids``) when that is a list of ids or of id lists (by
    the first item's type: the validation refuses a mixed list anyway)."""
    if type(body) is not dict:
        return
    prompt = body.get(field)
    if type(prompt) is not list or not prompt:
        return
    first = prompt[0]
    if type(first) is int:
        refuse_long_prompts(engine, body.get("model"), (len(prompt),))
    elif type(first) is list:
        refuse_long_prompts(engine, body.get("model"), [len(p) for p in prompt if type(p) is list])


async def prompt_ids(engine: Engine, entry: ModelEntry, prompt: str | list[int]) -> tuple[list[int], str]:
    """A text or token-id prompt as (ids, text). Text gets the tokenizer's special
    tokens (BOS), as SGLang's own server does for completions and /generate."""
    if isinstance(prompt, str):
        return await engine.encode_prompt(entry, prompt), prompt
    return list(prompt), ""


async def prepare_completions(
    engine: Engine, req: CompletionRequest, ctx: RequestContext
) -> tuple[ModelEntry, list[PreparedRequest]]:
    entry = engine.catalog.get(req.model)
    sampling = sampling_from_completion(req)
    prepared: list[PreparedRequest] = []
    prompts: list[str | list[int]] = list(req.prompts())
    check_batch(len(prompts), engine.limits)
    await ctx.reserve(len(prompts) * req.n)  # one admission slot per sample, before any tokenization
    for i, prompt in enumerate(prompts):
        ids, text = await prompt_ids(engine, entry, prompt)
        prepared.append(
            engine.prepare(
                entry, ids, sampling,
                stream=req.stream,
                request_id=ctx.sub_id(i),
                prompt_text=text,
                routing_key=ctx.routing_key,
                target_worker=ctx.target_worker,
                cache_salt=effective_salt(ctx.cache_salt, req.cache_salt),
                prompts=len(prompts),
            )
        )
    return entry, prepared


async def start_all(engine: Engine, prepared: list[PreparedRequest]) -> list[Generation]:
    """Start every prompt's generation; if one cannot start, abort those that did."""
    if len(prepared) == 1:
        return [await engine.start(prepared[0])]
    results = await asyncio.gather(*(engine.start(p) for p in prepared), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for r in results:
            if isinstance(r, Generation):
                await r.stream.aclose()
        raise errors[0]
    return list(results)  # type: ignore[arg-type]


def _echo_text(p: PreparedRequest, entry: ModelEntry) -> str:
    return p.prompt_text or entry.tokenizer.decode(p.prompt_ids, skip_special_tokens=False)


def _prompt_logprobs(gen: Generation, entry: ModelEntry) -> CompletionLogprobs | None:
    lp = gen.input_logprobs
    if lp is None:
        return None
    values = [v.value if v.HasField("value") else None for v in lp.token_logprobs]
    tops = [list(zip(r.token_ids, r.values, strict=False)) for r in lp.top_logprobs] or None
    return completion_logprobs(list(lp.token_ids), values, tops, piece_fn(entry), top_n=gen.prepared.sampling.top_logprobs)


async def open(
    engine: Engine, req: CompletionRequest, ctx: RequestContext, frame: tuple[bytes, bytes] | None = None,
    *, typed: bool = False,
) -> Answer | Events:
    """The completions API's one entry point (``endpoints.events``): the whole answer, or,
    for ``req.stream``, the started generations' chunks. With ``frame`` (the two bytes a
    door writes around each event's JSON; SSE: ``data: `` and a blank line) the common
    request's ordinary tokens come already written, ``frame[0] + to_json() + frame[1]``
    byte for byte, built from a template around the text (``json_events``); with ``typed``
    (a door that builds its own messages) the texts of tokens that arrived together come as
    one chunk (``protocol.stream.text_events``)."""
    entry, prepared = await prepare_completions(engine, req, ctx)
    gens = await start_all(engine, prepared)
    ctx.worker_ids = [g.worker_id for g in gens]
    if not req.stream:
        return await _answer(req, ctx, entry, gens)
    if frame is not None or typed:
        direct = Direct() if frame is not None else None
        return Events(json_events(req, entry, gens, ctx, frame, direct), gens, direct)
    return Events(_chunks(req, entry, gens, ctx), gens)


async def _answer(req: CompletionRequest, ctx: RequestContext, entry: ModelEntry, gens: list[Generation]) -> dict[str, Any]:
    n = gens[0].prepared.sampling.n
    texts: dict[int, list[str]] = {}
    ids: dict[int, list[int]] = {}
    lps: dict[int, list[float]] = {}
    tops: dict[int, list[Any]] = {}
    finish: dict[int, tuple[str | None, Any]] = {}
    async for g_index, d in merged(gens):
        k = g_index * n + d.index
        texts.setdefault(k, []).append(d.text)
        ids.setdefault(k, []).extend(d.logprob_ids)
        if d.logprobs is not None:
            lps.setdefault(k, []).extend(d.logprobs)
            tops.setdefault(k, []).extend(d.top_logprobs or [[] for _ in d.logprob_ids])
        if d.finish_reason is not None:
            finish[k] = (d.finish_reason, d.matched_stop)
    choices: list[CompletionChoice] = []
    piece = piece_fn(entry)
    for k in range(len(gens) * n):
        gen = gens[k // n]
        text = "".join(texts.get(k, []))
        logprobs = None
        if gen.prepared.sampling.logprobs:
            logprobs = completion_logprobs(
                ids.get(k, []), lps.get(k, []), tops.get(k) if gen.prepared.sampling.top_logprobs else None, piece,
            )
        if req.echo:
            prefix = _echo_text(gen.prepared, entry)
            if logprobs is not None:
                head = _prompt_logprobs(gen, entry) or CompletionLogprobs()
                offset = len(prefix)
                logprobs.text_offset = [o + offset for o in logprobs.text_offset]
                head.extend(logprobs)
                logprobs = head
            text = prefix + text
        reason, matched = finish.get(k, (None, None))
        choices.append(CompletionChoice(index=k, text=text, logprobs=logprobs, finish_reason=reason, matched_stop=matched))  # type: ignore[arg-type]
    u = sum_usage(gens)
    response = CompletionResponse(
        id=ctx.response_id("cmpl"), model=entry.name, choices=choices,
        usage=Usage.build(u.prompt_tokens, u.completion_tokens, cached_tokens=u.cached_tokens),
    )
    return response.to_dict()


def json_events(
    req: CompletionRequest, entry: ModelEntry, gens: list[Generation], ctx: RequestContext,
    frame: tuple[bytes, bytes] | None = (b"", b""), direct: Direct | None = None,
) -> AsyncGenerator[StreamChunk | bytes, None]:
    """The started generations' events for a door that takes text batches (a JSON door's
    ``frame``; None: typed chunks): the template path when it applies (``direct``: where
    the door says it writes framed events itself)."""
    if len(gens) == 1 and gens[0].plain and not req.echo and not _continuous(req):
        return _plain_json(req, entry, gens[0], ctx, frame, direct)
    return _chunks(req, entry, gens, ctx)


def _continuous(req: CompletionRequest) -> bool:
    return bool(req.stream_options and req.stream_options.continuous_usage_stats)


def text_template(head: StreamHead) -> tuple[bytes, bytes]:
    """The JSON of a one-choice ``text_completion`` chunk of choice 0 with only text, cut
    around the text (``protocol.stream.text_template``)."""
    return stream_text_template(head, lambda text: CompletionDelta(0, text))


async def _plain_json(
    req: CompletionRequest, entry: ModelEntry, gen: Generation, ctx: RequestContext, frame: tuple[bytes, bytes] | None,
    direct: Direct | None = None,
) -> AsyncGenerator[StreamChunk | bytes, None]:
    """One plain prompt (``Generation.plain``; no echo, no continuous usage): each list of
    texts from ``Generation.deltas(texts=True)`` becomes the door's event for it
    (``protocol.stream.text_events``: framed events from the template in one write, or one
    typed chunk); every other delta goes through ``_chunks``'s rules (``_emit_plain`` is its ``emit``
    for this case) and comes as a typed event for the door to frame."""
    head = StreamHead(ctx.response_id("cmpl"), TEXT_COMPLETION, now(), entry.name)
    event = text_events(head, lambda text: CompletionDelta(0, text), frame)
    async for d in gen.deltas(texts=True):
        if type(d) is list:
            yield event(d)
            if direct is not None and direct.writer is not None:
                # The door wrote its first event: later lists go straight to the client.
                gen.push_to(TextPush(direct.writer, event))
                direct = None
        else:
            chunk = _emit_plain(head, d)  # type: ignore[arg-type]
            if chunk is not None:
                yield chunk
    if req.stream_options and req.stream_options.include_usage:
        yield StreamChunk(head, [], stream_usage(sum_usage([gen])))


def _emit_plain(head: StreamHead, d: SampleDelta) -> StreamChunk | None:
    """``_chunks``'s ``emit`` with one prompt, one sample, no logprobs, no echo, no continuous usage."""
    if not d.text and d.finish_reason is None:
        return None
    return StreamChunk(head, [CompletionDelta(d.index, d.text, None, d.finish_reason, d.matched_stop)])


async def _chunks(
    req: CompletionRequest, entry: ModelEntry, gens: list[Generation], ctx: RequestContext
) -> AsyncGenerator[StreamChunk, None]:
    head = StreamHead(ctx.response_id("cmpl"), TEXT_COMPLETION, now(), entry.name)
    n = gens[0].prepared.sampling.n
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    piece = piece_fn(entry)
    offsets: dict[int, int] = {}
    echoed: set[int] = set()
    want_logprobs = [g.prepared.sampling.logprobs for g in gens]
    echo = req.echo

    def emit(g_index: int, d: SampleDelta) -> StreamChunk | None:
        k = g_index * n + d.index
        text = d.text
        prefix = ""
        if echo and k not in echoed:
            echoed.add(k)
            prefix = _echo_text(gens[g_index].prepared, entry)
        logprobs: CompletionLogprobs | None = None
        if want_logprobs[g_index] and (lp_ids := d.logprob_ids):
            gen = gens[g_index]
            logprobs = completion_logprobs(
                lp_ids, d.logprobs or [], d.top_logprobs if gen.prepared.sampling.top_logprobs else None,
                piece, text_offset=offsets.get(k, 0) + len(prefix),
            )
        if prefix and want_logprobs[g_index]:
            # The prompt's logprobs open the sample's first chunk, as in a whole answer.
            opening = _prompt_logprobs(gens[g_index], entry) or CompletionLogprobs()
            if logprobs is not None:
                opening.extend(logprobs)
            logprobs = opening
        text = prefix + text
        offsets[k] = offsets.get(k, 0) + len(text)
        if not text and d.finish_reason is None and logprobs is None:
            return None
        choice = CompletionDelta(k, text, logprobs, d.finish_reason, d.matched_stop)
        return StreamChunk(head, [choice], stream_usage(sum_usage(gens)) if continuous else None)

    if len(gens) == 1:  # one prompt: read it directly, without merge's generator layer per token
        async for d in gens[0].deltas():
            chunk = emit(0, d)
            if chunk is not None:
                yield chunk
    else:
        async for g_index, d in merged(gens):
            chunk = emit(g_index, d)
            if chunk is not None:
                yield chunk
    if include_usage:
        yield StreamChunk(head, [], stream_usage(sum_usage(gens)))


__all__ = ["json_events", "new_id", "open", "refuse_long_body", "refuse_long_prompts", "text_template"]
