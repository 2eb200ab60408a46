"""The gRPC front door: service ``token_gateway.v1.TokenGateway``.

Handlers only authenticate, translate and frame, exactly as the HTTP handlers in
``server/app.py`` do: each request becomes the HTTP API's request model and runs
through the same pipeline functions in ``endpoints/`` (chat, completions, native;
the Responses and Conversations calls through ``server.responses_entry`` and
``server.conversations_entry``, in ``server/grpc/responses.py`` and ``conversations.py``),
so validation, routing, retries, load accounting and stop handling are shared.
A client's deadline bounds the worker calls; a client that cancels or runs out
of time cancels the handler, which aborts the worker request and frees its slot.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from grpc import aio

from gateway.endpoints import chat as chat_route
from gateway.endpoints import completions as completions_route
from gateway.endpoints import native as native_route
from gateway.endpoints.events import Events, answer_of, events_of
from gateway.endpoints.inspect import Inspector
from gateway.endpoints.long_lists import parse_model_in_steps
from gateway.observability.request_log import RequestRecord
from gateway.pipeline.fanout import merged
from gateway.pipeline.generation import Generation, SampleDelta
from gateway.pipeline.request_context import RequestContext
from gateway.proto import gateway_pb2 as gpb
from gateway.proto import gateway_pb2_grpc as gpb_grpc
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.embeddings import EmbeddingRequest
from gateway.protocol.errors import GatewayError
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.tokens import DetokenizeRequest, TokenizeRequest
from gateway.server.grpc import convert as convert
from gateway.server.grpc.conversations import ConversationsRpcs
from gateway.server.grpc.inspect import inspect_prefix
from gateway.server.grpc.responses import ResponsesRpcs
from gateway.server.grpc.util import (
    CallContextReader,
    Role,
    abort_with,
    call_scope,
    client_deadline,
    reply_metadata,
)
from gateway.server.http.util import parse_model
from gateway.server.state import GatewayState

log = logging.getLogger(__name__)

T = TypeVar("T")


StartFn = Callable[[Any, Any, RequestContext], Awaitable[Events]]


def _streaming(
    method: str, start: StartFn, to_message: Callable[[Any], Any] | None, *, name_workers: bool = True
) -> Callable[..., AsyncGenerator[Any, None]]:
    """A server-streaming handler: start the generation (errors before output become
    the call's status), send the reply metadata, then relay each pipeline chunk as a
    message. Whatever ends the call (end of output, error, cancel, deadline) ends its
    worker requests. One generator frame per message: the relay is the hot path."""

    async def handler(self: TokenGatewayService, request: Any, context: aio.ServicerContext) -> AsyncGenerator[Any, None]:
        try:
            ctx = self.auth.context(context)
            with client_deadline(context):
                async with self.admitted(ctx, method) as record:
                    events = await start(self, request, ctx)
                    async with events:  # however the call ends, its worker requests end with it
                        await context.send_initial_metadata(reply_metadata(ctx))
                        workers = list(dict.fromkeys(ctx.worker_ids)) if name_workers else []
                        async for chunk in events.events:
                            message = to_message(chunk) if to_message is not None else chunk
                            if workers:
                                message.worker_ids.extend(workers)  # the first message names the workers
                                workers = []
                                record.ttft_s = time.perf_counter() - record.started
                            yield message
        except GatewayError as exc:
            log.info("gRPC %s failed: %s", method, exc.message)
            await abort_with(context, exc)

    handler.__name__ = handler.__qualname__ = method
    return handler


class TokenGatewayService(ResponsesRpcs, ConversationsRpcs, gpb_grpc.TokenGatewayServicer):
    def __init__(self, state: GatewayState, auth: CallContextReader) -> None:
        self.state = state
        self.responses_entry = state.responses_entry
        self.conversations_entry = state.conversations_entry
        self.engine = state.engine
        self.auth = auth
        self.inspector = Inspector(state.engine, state.config.policy)

    # ---------------------------------------------------------------- framing
    def admitted(self, ctx: RequestContext, method: str) -> contextlib.AbstractAsyncContextManager[RequestRecord]:
        """Admission, metrics and the access log around every call, shared with the HTTP front door."""
        state = self.state
        return call_scope(state.metrics, state.admission, ctx, method, access_log=state.config.server.access_log)

    async def _unary(
        self, context: aio.ServicerContext, method: str, run: Callable[[RequestContext], Awaitable[T]],
        role: Role = "inference",
    ) -> T:
        try:
            ctx = self.auth.context(context, role)
            with client_deadline(context):
                async with self.admitted(ctx, method):
                    result = await run(ctx)
        except GatewayError as exc:
            await abort_with(context, exc)
            raise  # unreachable: abort raises
        await context.send_initial_metadata(reply_metadata(ctx))
        return result

    # ---------------------------------------------------------------- chat
    async def ChatCompletion(self, request: gpb.ChatCompletionRequest, context: aio.ServicerContext) -> gpb.ChatCompletionResponse:
        async def run(ctx: RequestContext) -> gpb.ChatCompletionResponse:
            req = await parse_model_in_steps(ChatCompletionRequest, convert.chat_request(request, stream=False))
            out = answer_of(await chat_route.open(self.engine, req, ctx))
            return convert.chat_response(out, list(dict.fromkeys(ctx.worker_ids)))

        return await self._unary(context, "ChatCompletion", run)

    async def _start_chat_stream(self, request: gpb.ChatCompletionRequest, ctx: RequestContext) -> Events:
        req = await parse_model_in_steps(ChatCompletionRequest, convert.chat_request(request, stream=True))
        return events_of(await chat_route.open(self.engine, req, ctx, typed=True))

    # ---------------------------------------------------------------- completion
    async def Completion(self, request: gpb.CompletionRequest, context: aio.ServicerContext) -> gpb.CompletionResponse:
        async def run(ctx: RequestContext) -> gpb.CompletionResponse:
            completions_route.refuse_long_prompts(self.engine, request.model, convert.token_prompt_lengths(request))
            req = parse_model(CompletionRequest, convert.completion_request(request, stream=False))
            out = answer_of(await completions_route.open(self.engine, req, ctx))
            return convert.completion_response(out, list(dict.fromkeys(ctx.worker_ids)))

        return await self._unary(context, "Completion", run)

    async def _start_completion_stream(self, request: gpb.CompletionRequest, ctx: RequestContext) -> Events:
        completions_route.refuse_long_prompts(self.engine, request.model, convert.token_prompt_lengths(request))
        req = parse_model(CompletionRequest, convert.completion_request(request, stream=True))
        return events_of(await completions_route.open(self.engine, req, ctx, typed=True))

    # ---------------------------------------------------------------- generate
    async def _start_generate(self, request: gpb.GenerateRequest, ctx: RequestContext) -> Events:
        """The gateway API's Generate sends each sample's deltas (or one whole message per
        sample), not SGLang's cumulative results: its messages are framed here."""
        completions_route.refuse_long_prompts(self.engine, request.model, (len(request.input_ids),))
        req = parse_model(GenerateRequest, convert.generate_request(request))
        gens = await native_route.start_generate(self.engine, req, ctx)
        return Events(_generate_messages(gens, stream=req.stream), gens)

    # ---------------------------------------------------------------- tokens, embeddings
    async def Tokenize(self, request: gpb.TokenizeRequest, context: aio.ServicerContext) -> gpb.TokenizeResponse:
        async def run(ctx: RequestContext) -> gpb.TokenizeResponse:
            req = await parse_model_in_steps(TokenizeRequest, convert.tokenize_request(request))
            return convert.tokenize_response(await native_route.tokenize(self.engine, req))

        return await self._unary(context, "Tokenize", run)

    async def Detokenize(self, request: gpb.DetokenizeRequest, context: aio.ServicerContext) -> gpb.DetokenizeResponse:
        async def run(ctx: RequestContext) -> gpb.DetokenizeResponse:
            req = parse_model(DetokenizeRequest, convert.detokenize_request(request))
            return gpb.DetokenizeResponse(text=(await native_route.detokenize(self.engine, req))["text"])

        return await self._unary(context, "Detokenize", run)

    async def Embed(self, request: gpb.EmbedRequest, context: aio.ServicerContext) -> gpb.EmbedResponse:
        async def run(ctx: RequestContext) -> gpb.EmbedResponse:
            req = parse_model(EmbeddingRequest, convert.embed_request(request))
            out = await native_route.embed(self.engine, req, ctx)
            return convert.embed_response(out, list(dict.fromkeys(ctx.worker_ids)))

        return await self._unary(context, "Embed", run)

    # ---------------------------------------------------------------- fleet
    async def ListModels(self, request: gpb.ListModelsRequest, context: aio.ServicerContext) -> gpb.ListModelsResponse:
        async def run(ctx: RequestContext) -> gpb.ListModelsResponse:
            catalog = self.state.catalog
            workers = self.state.registry.all()
            out = gpb.ListModelsResponse()
            for entry in catalog.entries():
                count = sum(1 for w in workers if catalog.public_name(w.model) == entry.name)
                out.models.add(id=entry.name, max_context_length=entry.max_context_length, worker_count=count)
            return out

        return await self._unary(context, "ListModels", run)

    async def ListWorkers(self, request: gpb.ListWorkersRequest, context: aio.ServicerContext) -> gpb.ListWorkersResponse:
        async def run(ctx: RequestContext) -> gpb.ListWorkersResponse:
            return gpb.ListWorkersResponse(
                workers=[convert.worker_status(w.describe()) for w in self.state.registry.all()]
            )

        return await self._unary(context, "ListWorkers", run)

    async def InspectPrefix(self, request: gpb.InspectPrefixRequest, context: aio.ServicerContext) -> gpb.InspectPrefixResponse:
        async def run(ctx: RequestContext) -> gpb.InspectPrefixResponse:
            return await inspect_prefix(self.inspector, request)

        return await self._unary(context, "InspectPrefix", run, role="inspect")

    StreamChatCompletion = _streaming("StreamChatCompletion", _start_chat_stream, convert.chat_chunk)
    StreamCompletion = _streaming("StreamCompletion", _start_completion_stream, convert.completion_chunk)
    Generate = _streaming("Generate", _start_generate, None, name_workers=False)  # each message has worker_id


def _generate_message(gen: Generation, d: SampleDelta, count: int) -> gpb.GenerateResponse:
    usage = gen.usage
    out = gpb.GenerateResponse(
        request_id=gen.prepared.request_id, index=d.index, token_ids=d.token_ids, text=d.text,
        logprobs=d.logprobs or (), finish_reason=d.finish_reason or "",
        prompt_tokens=usage.prompt_tokens, completion_tokens=count, cached_tokens=usage.cached_tokens,
        worker_id=gen.worker_id,
    )
    convert.matched_stop(out.matched_stop, d.matched_stop)
    return out


async def _generate_messages(gens: list[Generation], *, stream: bool) -> AsyncGenerator[gpb.GenerateResponse, None]:
    """Deltas as they come (stream), or one whole message per sample when it finishes."""
    counts: dict[tuple[int, int], int] = {}
    parts: dict[tuple[int, int], SampleDelta] = {}
    async for g, d in merged(gens):
        key = (g, d.index)
        counts[key] = counts.get(key, 0) + len(d.token_ids)
        if stream:
            yield _generate_message(gens[g], d, counts[key])
            continue
        acc = parts.setdefault(key, SampleDelta(d.index, logprobs=[] if d.logprobs is not None else None))
        acc.text += d.text
        acc.token_ids.extend(d.token_ids)
        if d.logprobs is not None:
            acc.logprobs = (acc.logprobs or []) + d.logprobs
        if d.finish_reason is not None:
            acc.finish_reason, acc.matched_stop = d.finish_reason, d.matched_stop
            yield _generate_message(gens[g], acc, counts[key])
