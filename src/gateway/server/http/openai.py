"""OpenAI routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.endpoints import chat as chat_route
from gateway.endpoints import completions as completions_route
from gateway.endpoints import native as native_route
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.chat import ChatCompletionRequest
from gateway.protocol.completions import CompletionRequest
from gateway.protocol.embeddings import EmbeddingRequest
from gateway.protocol.responses import ModelCard, ModelList
from gateway.server.http.door import HttpDoor
from gateway.server.http.util import parse_model, read_json


def openai_router(door: HttpDoor) -> APIRouter:
    router = APIRouter()
    state, max_body = door.state, door.max_body

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(ChatCompletionRequest, await read_json(request, max_body))
            if req.stream:
                return door.sse_stream(await chat_route.stream_chat(state.engine, req, ctx), ctx)
            return await chat_route.complete_chat(state.engine, req, ctx)

        return await door.handle(request, run, admit="batch")  # the route reserves one slot per sample (n)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(CompletionRequest, await read_json(request, max_body))
            if req.stream:
                _, chunks = await completions_route.stream_completions(state.engine, req, ctx)
                return door.sse_stream(chunks, ctx)
            return await completions_route.complete(state.engine, req, ctx)

        return await door.handle(request, run, admit="batch")

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(EmbeddingRequest, await read_json(request, max_body))
            return await native_route.embed(state.engine, req, ctx)

        return await door.handle(request, run, admit="batch")

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            cards = [
                ModelCard(
                    id=e.name, root=e.name, max_model_len=e.max_context_length or None,
                    tool_call_parser=e.tool_call_parser, reasoning_parser=e.reasoning_parser,
                )
                for e in state.catalog.entries()
            ]
            return ModelList(data=cards).to_dict()

        return await door.handle(request, run)

    return router
