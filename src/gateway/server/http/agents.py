"""The agents' routes: Anthropic ``/v1/messages``, OpenAI ``/v1/responses`` and ``/v1/conversations``.

Thin on purpose: parse, authenticate, admit and frame through ``HttpDoor`` like every
other route; the shaping lives in ``endpoints.messages`` / ``endpoints.responses`` /
``endpoints.conversations`` and the state in ``pipeline.store``. Two things differ from
the OpenAI routes on ``/v1/messages``: Anthropic's SDK sends its key as ``x-api-key``
(taken as a bearer token), and errors there have Anthropic's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from gateway.endpoints import conversations as conversations_route
from gateway.endpoints import messages as messages_route
from gateway.endpoints.responses import sse_stream
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import GatewayError, InvalidRequestError
from gateway.protocol.messages import CountTokensRequest, MessagesRequest, anthropic_error
from gateway.protocol.responses_api import (
    ConversationCreate,
    ConversationUpdate,
    ItemsCreate,
    ResponsesRequest,
)
from gateway.server.http.door import HttpDoor
from gateway.server.http.util import EventStream, JSONResponse, parse_model, read_json

ANTHROPIC_KEY = "x-api-key"


def _with_bearer(headers: Mapping[str, str]) -> Mapping[str, str]:
    """Anthropic's ``x-api-key`` as the bearer token the authenticator reads."""
    if "authorization" in headers or ANTHROPIC_KEY not in headers:
        return headers
    return {**dict(headers.items()), "authorization": f"Bearer {headers[ANTHROPIC_KEY]}"}


def _anthropic_shape(response: Response) -> Response:
    """An error answered in OpenAI's shape (by the door: auth, admission, bad input)
    rewritten in Anthropic's, same status and headers."""
    if response.status_code < 400 or not isinstance(response, JSONResponse):
        return response
    try:
        body = orjson.loads(bytes(response.body))
        message = body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response
    shaped = anthropic_error(GatewayError(str(message), status=response.status_code))
    headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
    return JSONResponse(shaped, status_code=response.status_code, headers=headers)


def _paging(request: Request) -> tuple[str | None, int, str]:
    """``after``, ``limit`` (1-100, default 20) and ``order`` (default ``desc``) of a list route."""
    q = request.query_params
    raw = q.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise InvalidRequestError("limit must be an integer from 1 to 100", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
    return q.get("after"), int(raw), order


def agents_router(door: HttpDoor) -> APIRouter:
    router = APIRouter()
    state, max_body = door.state, door.max_body

    def anthropic_auth(headers: Mapping[str, str]) -> str | None:
        return state.auth.inference(_with_bearer(headers))

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(MessagesRequest, await read_json(request, max_body))
            if req.stream:
                events = await messages_route.stream_message(state.engine, req, ctx)
                return EventStream(events, headers=door.headers_for(ctx))
            return await messages_route.create_message(state.engine, req, ctx)

        return _anthropic_shape(await door.handle(request, run, admit=True, auth=anthropic_auth))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(CountTokensRequest, await read_json(request, max_body))
            return await messages_route.count_tokens(state.engine, req, ctx)

        return _anthropic_shape(await door.handle(request, run, auth=anthropic_auth))

    responses, background = state.responses, state.background

    @router.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(ResponsesRequest, await read_json(request, max_body))
            if req.background:
                if req.stream:
                    raise InvalidRequestError("stream a background response with GET /v1/responses/{id}?stream=true", param="stream")
                # The run outlives this request: it holds its own admission slot until it ends.
                ticket = await state.admission.acquire(ctx.api_key_id, 1)
                try:
                    return await background.start(req, ctx, on_end=ticket.release)
                except BaseException:
                    ticket.release()
                    raise
            await ctx.reserve(1)
            if req.stream:
                return EventStream(await responses.stream(req, ctx), headers=door.headers_for(ctx))
            return await responses.create(req, ctx)

        return await door.handle(request, run, admit="batch")  # one slot, taken once the body says for what

    @router.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            q = request.query_params
            if q.get("stream", "false").lower() != "true":
                return await responses.retrieve(ctx, response_id)
            raw = q.get("starting_after", "-1")
            if not raw.lstrip("-").isdigit():
                raise InvalidRequestError("starting_after must be an integer", param="starting_after")
            events = await background.replay(ctx, response_id, int(raw))
            return EventStream(sse_stream(events), headers=door.headers_for(ctx))

        return await door.handle(request, run)

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

    async def store() -> Any:
        return await state.history.store()

    @router.post("/v1/conversations")
    async def create_conversation(request: Request) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(ConversationCreate, await read_json(request, max_body))
            return await conversations_route.create(await store(), req, ctx)

        return await door.handle(request, run)

    @router.get("/v1/conversations/{conversation_id}")
    async def get_conversation(request: Request, conversation_id: str) -> Response:
        return await door.handle(request, lambda ctx: _with_store(conversations_route.retrieve, ctx, conversation_id))

    @router.post("/v1/conversations/{conversation_id}")
    async def update_conversation(request: Request, conversation_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(ConversationUpdate, await read_json(request, max_body))
            return await conversations_route.update(await store(), req, ctx, conversation_id)

        return await door.handle(request, run)

    @router.delete("/v1/conversations/{conversation_id}")
    async def delete_conversation(request: Request, conversation_id: str) -> Response:
        return await door.handle(request, lambda ctx: _with_store(conversations_route.delete, ctx, conversation_id))

    @router.post("/v1/conversations/{conversation_id}/items")
    async def add_items(request: Request, conversation_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            req = parse_model(ItemsCreate, await read_json(request, max_body))
            return await conversations_route.add_items(await store(), req, ctx, conversation_id)

        return await door.handle(request, run)

    @router.get("/v1/conversations/{conversation_id}/items")
    async def list_items(request: Request, conversation_id: str) -> Response:
        async def run(ctx: RequestContext) -> Any:
            after, limit, order = _paging(request)
            return await conversations_route.list_items(await store(), ctx, conversation_id, after=after, limit=limit, order=order)

        return await door.handle(request, run)

    @router.get("/v1/conversations/{conversation_id}/items/{item_id}")
    async def get_item(request: Request, conversation_id: str, item_id: str) -> Response:
        return await door.handle(request, lambda ctx: _with_store(conversations_route.get_item, ctx, conversation_id, item_id))

    @router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
    async def delete_item(request: Request, conversation_id: str, item_id: str) -> Response:
        return await door.handle(request, lambda ctx: _with_store(conversations_route.delete_item, ctx, conversation_id, item_id))

    async def _with_store(fn: Any, ctx: RequestContext, *args: str) -> Any:
        return await fn(await store(), ctx, *args)

    return router
