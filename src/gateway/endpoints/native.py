"""SGLang-native /generate, plus embeddings and tokenize/detokenize."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from gateway.endpoints.completions import prompt_ids, start_all
from gateway.endpoints.events import Answer, Events
from gateway.pipeline.engine import Engine
from gateway.pipeline.fanout import merged
from gateway.pipeline.generation import Generation, SampleDelta
from gateway.pipeline.limits import check_batch
from gateway.pipeline.prepared import PreparedRequest
from gateway.pipeline.request_context import RequestContext
from gateway.pipeline.tenancy import effective_salt
from gateway.proto import sglang_scheduler_pb2 as pb
from gateway.protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.sampling import sampling_from_generate
from gateway.protocol.stream import JsonEvent
from gateway.protocol.tokens import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)


async def prepare_generate(engine: Engine, req: GenerateRequest, ctx: RequestContext) -> list[PreparedRequest]:
    """One prepared request per prompt of a /generate request (shared by the gRPC Generate)."""
    entry = engine.catalog.get(req.model)
    prepared = []
    prompts: list[str | list[int]] = list(req.prompts())
    check_batch(len(prompts), engine.limits)
    samplings = [sampling_from_generate(req, i) for i in range(len(prompts))]
    await ctx.reserve(sum(s.n for s in samplings))  # one admission slot per sample, before any tokenization
    for i, prompt in enumerate(prompts):
        ids, text = await prompt_ids(engine, entry, prompt)
        prepared.append(
            engine.prepare(
                entry, ids, samplings[i], stream=req.stream, prompts=len(prompts),
                request_id=req.rid_for(i) or ctx.sub_id(i), prompt_text=text,
                routing_key=ctx.routing_key, target_worker=ctx.target_worker,
                cache_salt=effective_salt(ctx.cache_salt, req.cache_salt),
            )
        )
    return prepared


class _Acc:
    """One output (prompt x sample) being assembled."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.ids: list[int] = []
        self.logprobs: list[tuple[float, int, None]] = []
        self.finish: dict[str, Any] | None = None

    def add(self, d: SampleDelta) -> None:
        self.text.append(d.text)
        self.ids.extend(d.token_ids)
        if d.logprobs is not None:
            self.logprobs.extend((lp, t, None) for lp, t in zip(d.logprobs, d.logprob_ids, strict=False))
        if d.finish_reason is not None:
            self.finish = _finish_reason(d, len(self.ids))


def _finish_reason(d: SampleDelta, length: int) -> dict[str, Any]:
    if d.finish_reason == "length":
        return {"type": "length", "length": length}
    if d.finish_reason == "abort":
        return {"type": "abort"}
    out: dict[str, Any] = {"type": "stop"}
    if d.matched_stop is not None:
        out["matched"] = d.matched_stop
    return out


def _result(gen: Generation, acc: _Acc, index: int) -> dict[str, Any]:
    usage = gen.usage
    meta: dict[str, Any] = {
        "id": gen.prepared.request_id if gen.prepared.sampling.n == 1 else f"{gen.prepared.request_id}-{index}",
        "finish_reason": acc.finish,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": len(acc.ids),
        "cached_tokens": usage.cached_tokens,
        "worker_id": gen.worker_id,
    }
    if gen.prepared.sampling.logprobs:
        meta["output_token_logprobs"] = acc.logprobs
    return {"text": "".join(acc.text), "output_ids": acc.ids, "meta_info": meta}


async def start_generate(engine: Engine, req: GenerateRequest, ctx: RequestContext) -> list[Generation]:
    """Prepare and start every prompt's generation (the gRPC Generate frames them itself)."""
    gens = await start_all(engine, await prepare_generate(engine, req, ctx))
    ctx.worker_ids = [g.worker_id for g in gens]
    return gens


async def generate(engine: Engine, req: GenerateRequest, ctx: RequestContext) -> Answer | Events:
    """The /generate API's one entry point (``endpoints.events``): the whole answer (one
    result, or a list for a batch or ``n`` > 1), or, for ``req.stream``, SGLang's stream
    of cumulative results."""
    gens = await start_generate(engine, req, ctx)
    if req.stream:
        return Events(_stream(gens), gens)
    accs = {(g, s): _Acc() for g in range(len(gens)) for s in range(gens[g].prepared.sampling.n)}
    async for g, d in merged(gens):
        accs[(g, d.index)].add(d)
    results = [_result(gens[g], acc, s) for (g, s), acc in accs.items()]
    return results if (req.is_batch or len(results) > 1) else results[0]


async def _stream(gens: list[Generation]) -> AsyncGenerator[JsonEvent, None]:
    # SGLang's native stream sends the cumulative text and ids in every event.
    accs = {(g, s): _Acc() for g in range(len(gens)) for s in range(gens[g].prepared.sampling.n)}
    async for g, d in merged(gens):
        acc = accs[(g, d.index)]
        acc.add(d)
        out = _result(gens[g], acc, d.index)
        out["index"] = g * gens[g].prepared.sampling.n + d.index
        yield JsonEvent(out)


async def embed(engine: Engine, req: EmbeddingRequest, ctx: RequestContext) -> dict[str, Any]:
    entry = engine.catalog.get(req.model)
    engine.observer.model_resolved(entry.name)
    vectors: list[list[float]] = []
    prompt_tokens = 0

    async def one(i: int, item: str | list[int]) -> tuple[list[float], int]:
        ids = await engine.encode(entry, item, add_special_tokens=True) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequestError("input must not be empty", param="input")
        rid = ctx.sub_id(i)
        route = engine.prepare_embed(
            entry, ids, rid, routing_key=ctx.routing_key, target_worker=ctx.target_worker
        )
        done = await engine.embed(route, pb.EmbedRequest(request_id=rid, tokenized=pb.TokenizedInput(input_ids=ids)))
        ctx.worker_ids.append(done.worker_id)
        vector = list(done.reply.embedding)
        if req.dimensions is not None:
            vector = vector[: req.dimensions]
        return vector, done.reply.prompt_tokens or len(ids)

    inputs: list[str | list[int]] = list(req.inputs())
    check_batch(len(inputs), engine.limits, param="input")
    await ctx.reserve(len(inputs))  # one admission slot per input, before any tokenization
    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(inputs)))
    for vector, count in results:
        vectors.append(vector)
        prompt_tokens += count
    return EmbeddingResponse.build(
        vectors, model=entry.name, prompt_tokens=prompt_tokens, encoding_format=req.encoding_format
    ).to_dict()


async def tokenize(engine: Engine, req: TokenizeRequest) -> dict[str, Any]:
    entry = engine.catalog.get(req.model)
    engine.observer.model_resolved(entry.name)
    if req.messages is not None:
        # As the chat endpoint tokenizes them (bad messages, e.g. arguments that are not JSON: a 400).
        text, ids = await engine.render_chat(
            entry, req.template_messages(), tools=None, chat_template_kwargs=req.chat_template_kwargs,
            add_generation_prompt=req.add_generation_prompt,
        )
        if req.special_tokens:  # the template writes its own special tokens
            ids = await engine.encode(entry, text, add_special_tokens=True)
    else:
        ids = await engine.encode(entry, req.prompt or "", add_special_tokens=req.special_tokens)
    return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=entry.max_context_length or None).to_dict()


async def detokenize(engine: Engine, req: DetokenizeRequest) -> dict[str, Any]:
    entry = engine.catalog.get(req.model)
    engine.observer.model_resolved(entry.name)
    vocab = entry.tokenizer.vocab_size
    if max(req.tokens, default=-1) >= vocab:
        raise InvalidRequestError(f"tokens must be below the vocabulary size {vocab}", param="tokens")
    text = await engine.decode(entry, req.tokens, skip_special_tokens=False)
    return DetokenizeResponse(text=text).to_dict()
