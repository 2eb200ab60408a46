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

from gateway.endpoints import messages as messages_route
from gateway.pipeline.request_context import RequestContext
from gateway.protocol.errors import GatewayError
from gateway.protocol.messages import CountTokensRequest, MessagesRequest, anthropic_error
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

    return router
