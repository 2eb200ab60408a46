"""The agents' stored-state routes: ``/v1/responses/{id}`` and ``/v1/conversations``.

Thin on purpose: parse, authenticate and frame through ``HttpDoor`` like every other
FastAPI route; the shaping lives in ``endpoints.responses`` / ``endpoints.background``
/ ``endpoints.conversations`` and the state in ``pipeline.store``; the routes go through
``server.responses_entry`` and ``server.conversations_entry``, the paths the gRPC door
shares. The inference routes of these APIs (``POST /v1/messages``,
``/v1/messages/count_tokens``, ``/v1/responses``) run on the one inference path
(``inference_routes``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.pipeline.request_context import RequestContext
from gateway.server.http.door import HttpDoor
from gateway.server.http.util import read_json


def _paging(request: Request) -> tuple[str | None, str | None, str | None]:
    q = request.query_params
    return q.get("after"), q.get("limit"), q.get("order")


def agents_router(door: HttpDoor) -> APIRouter:
    router = APIRouter()
    state, max_body = door.state, door.max_body
    responses = state.responses_entry

    @router.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str) -> Response:
        # With ``stream=true`` the request never gets here: the one inference path replays the
        # stored stream (``inference_routes``), with the SSE writer and disconnect watch of a live one.
        return await door.handle(request, lambda ctx: responses.retrieve(ctx, response_id))

    @router.delete("/v1/responses/{response_id}")
    async def delete_response(request: Request, response_id: str) -> Response:
        return await door.handle(request, lambda ctx: responses.delete(ctx, response_id))

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> Response:
        return await door.handle(request, lambda ctx: responses.cancel(ctx, response_id))

    @router.get("/v1/responses/{response_id}/input_items")
    async def response_input_items(request: Request, response_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            after, limit, order = _paging(request)
            return await responses.input_items(ctx, response_id, after=after, limit=limit, order=order)

        return await door.handle(request, run)

    conversations = state.conversations_entry

    @router.post("/v1/conversations")
    async def create_conversation(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            return await conversations.create(ctx, await read_json(request, max_body, door.max_values))

        return await door.handle(request, run)

    @router.get("/v1/conversations/{conversation_id}")
    async def get_conversation(request: Request, conversation_id: str) -> Response:
        return await door.handle(request, lambda ctx: conversations.retrieve(ctx, conversation_id))

    @router.post("/v1/conversations/{conversation_id}")
    async def update_conversation(request: Request, conversation_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            return await conversations.update(ctx, conversation_id, await read_json(request, max_body, door.max_values))

        return await door.handle(request, run)

    @router.delete("/v1/conversations/{conversation_id}")
    async def delete_conversation(request: Request, conversation_id: str) -> Response:
        return await door.handle(request, lambda ctx: conversations.delete(ctx, conversation_id))

    @router.post("/v1/conversations/{conversation_id}/items")
    async def add_items(request: Request, conversation_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            return await conversations.add_items(ctx, conversation_id, await read_json(request, max_body, door.max_values))

        return await door.handle(request, run)

    @router.get("/v1/conversations/{conversation_id}/items")
    async def list_items(request: Request, conversation_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            after, limit, order = _paging(request)
            return await conversations.list_items(ctx, conversation_id, after=after, limit=limit, order=order)

        return await door.handle(request, run)

    @router.get("/v1/conversations/{conversation_id}/items/{item_id}")
    async def get_item(request: Request, conversation_id: str, item_id: str) -> Response:
        return await door.handle(request, lambda ctx: conversations.get_item(ctx, conversation_id, item_id))

    @router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
    async def delete_item(request: Request, conversation_id: str, item_id: str) -> Response:
        return await door.handle(request, lambda ctx: conversations.delete_item(ctx, conversation_id, item_id))

    return router
