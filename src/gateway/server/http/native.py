"""SGLang-native routes: ``/generate``, ``/v1/tokenize``, ``/v1/detokenize``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.endpoints import native as native_route
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.generate import GenerateRequest
from gateway.protocol.tokens import DetokenizeRequest, TokenizeRequest
from gateway.server.http.door import HttpDoor
from gateway.server.http.util import parse_model, read_json


def native_router(door: HttpDoor) -> APIRouter:
    router = APIRouter()
    state, max_body = door.state, door.max_body

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(GenerateRequest, await read_json(request, max_body))
            if req.stream:
                return door.sse_stream(await native_route.stream_generate(state.engine, req, ctx), ctx)
            return await native_route.generate(state.engine, req, ctx)

        return await door.handle(request, run, admit="batch")

    @router.post("/v1/tokenize")
    async def tokenize(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(TokenizeRequest, await read_json(request, max_body))
            return await native_route.tokenize(state.engine, req)

        return await door.handle(request, run, admit=True)  # a tokenization costs CPU like a prompt

    @router.post("/v1/detokenize")
    async def detokenize(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(DetokenizeRequest, await read_json(request, max_body))
            return native_route.detokenize(state.engine, req)

        return await door.handle(request, run, admit=True)

    return router
