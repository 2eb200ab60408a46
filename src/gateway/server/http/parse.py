"""Parser debugging routes: ``POST /parse/tool_calls``, ``POST /parse/reasoning``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.endpoints import parse as parse_route
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.parse import ParseReasoningRequest, ParseToolCallsRequest
from gateway.server.http.door import HttpDoor
from gateway.server.http.util import parse_model, read_json


def parse_router(door: HttpDoor) -> APIRouter:
    router = APIRouter()
    max_body = door.max_body

    @router.post("/parse/tool_calls")
    async def tool_calls(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            return parse_route.parse_tool_calls(parse_model(ParseToolCallsRequest, await read_json(request, max_body, door.max_values)))

        return await door.handle(request, run)

    @router.post("/parse/reasoning")
    async def reasoning(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            return parse_route.parse_reasoning(parse_model(ParseReasoningRequest, await read_json(request, max_body, door.max_values)))

        return await door.handle(request, run)

    return router
