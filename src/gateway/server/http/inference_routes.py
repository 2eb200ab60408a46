"""The inference routes the HTTP front door serves on its one path (``server.http.inference``).

Adding an inference API is one row here: its path, its body's model, its entry point
in ``endpoints/`` (``(req, ctx) -> Answer | Events``), its admission and a summary for
the OpenAPI document. The body limit, auth, the disconnect watch, the error shape and
SSE come with the path; the OpenAPI document describes the row's body.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gateway.endpoints import chat as chat_route
from gateway.endpoints import completions as completions_route
from gateway.endpoints import messages as messages_route
from gateway.endpoints import native as native_route
from gateway.endpoints.events import Answer, Events
from gateway.endpoints.inspect import Inspector
from gateway.endpoints.responses import sse_stream
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.embeddings import EmbeddingRequest
from gateway.protocol.errors import InvalidRequestError
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.inspect import InspectRequest
from gateway.protocol.messages import CountTokensRequest, MessagesRequest, anthropic_error
from gateway.protocol.responses_api import ResponsesRequest
from gateway.protocol.tokens import DetokenizeRequest, TokenizeRequest
from gateway.server.http.inference import InferenceRoute, StoredRef
from gateway.server.http.sse import SSE_FRAME
from gateway.server.state import GatewayState


def inference_routes(state: GatewayState) -> tuple[InferenceRoute, ...]:
    engine = state.engine
    inspector = Inspector(engine, state.config.policy)

    async def embeddings(req: EmbeddingRequest, ctx: RequestContext) -> dict[str, Any]:
        return await native_route.embed(engine, req, ctx)

    async def tokenize(req: TokenizeRequest, ctx: RequestContext) -> dict[str, Any]:
        return await native_route.tokenize(engine, req)

    async def detokenize(req: DetokenizeRequest, ctx: RequestContext) -> dict[str, Any]:
        return await native_route.detokenize(engine, req)

    async def inspect(req: InspectRequest, ctx: RequestContext) -> dict[str, Any]:
        return (await inspector.inspect(req)).to_dict()

    async def count_tokens(req: CountTokensRequest, ctx: RequestContext) -> dict[str, Any]:
        return await messages_route.count_tokens(engine, req, ctx)

    async def responses(req: ResponsesRequest, ctx: RequestContext) -> Answer | Events:
        return await state.responses_entry.create(req, ctx, sse=True)

    async def replay(ref: StoredRef, ctx: RequestContext) -> Events:
        raw = ref.query.get("starting_after", "-1")
        if not raw.lstrip("-").isdigit():
            raise InvalidRequestError("starting_after must be an integer", param="starting_after")
        return Events(sse_stream(await state.responses_entry.replay(ctx, ref.id, int(raw))), [])

    return (
        InferenceRoute("/v1/chat/completions", ChatCompletionRequest, partial(chat_route.open, engine, frame=SSE_FRAME),
                       admit="batch", summary="Chat completion (OpenAI)"),  # one slot per sample (n)
        InferenceRoute("/v1/completions", CompletionRequest, partial(completions_route.open, engine, frame=SSE_FRAME),
                       admit="batch", summary="Completion (OpenAI)",
                       precheck=partial(completions_route.refuse_long_body, engine)),
        InferenceRoute("/generate", GenerateRequest, partial(native_route.generate, engine),
                       admit="batch", summary="Generate (SGLang native)",
                       precheck=partial(completions_route.refuse_long_body, engine, field="input_ids")),
        InferenceRoute("/v1/embeddings", EmbeddingRequest, embeddings, admit="batch", summary="Embeddings (OpenAI)"),
        # A tokenization costs CPU like a prompt: one admission slot.
        InferenceRoute("/v1/tokenize", TokenizeRequest, tokenize, admit=True, summary="Tokenize"),
        InferenceRoute("/v1/detokenize", DetokenizeRequest, detokenize, admit=True, summary="Detokenize"),
        # The admin key by default (the answer reveals what other tenants' prompts cached);
        # an admission slot, as it costs a tokenization.
        InferenceRoute("/admin/inspect", InspectRequest, inspect, admit=True, summary="Inspect a prompt's routing",
                       auth="inspector"),
        InferenceRoute("/v1/messages", MessagesRequest, partial(messages_route.open, engine), admit=True,
                       summary="Messages (Anthropic)", auth="anthropic", error_body=anthropic_error, done=b""),
        InferenceRoute("/v1/messages/count_tokens", CountTokensRequest, count_tokens, admit=True,
                       summary="Count a message's tokens (Anthropic)", auth="anthropic", error_body=anthropic_error, done=b""),
        # One slot, taken once the body says whether the run outlives the request (``server.responses_entry``).
        InferenceRoute("/v1/responses", ResponsesRequest, responses, admit="batch", summary="Create a response (OpenAI)",
                       done=b""),
        # A background response's events again, from ``starting_after`` (``?stream=true``; without it, FastAPI's
        # plain read of the stored response).
        InferenceRoute("/v1/responses/{response_id}", None, replay, admit=False, summary="Stream a stored response",
                       done=b"", method="GET"),
    )  # fmt: skip
