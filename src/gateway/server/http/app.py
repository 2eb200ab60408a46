"""The HTTP front door: the inference routes on one ASGI path, FastAPI for the rest.

Every inference route (``inference_routes``) runs on ``server.http.inference``'s path;
FastAPI serves admin, health, parse, ``/v1/models`` and the OpenAPI document, one
router per route group (``door.HttpDoor``). The request pipeline lives in
``pipeline/`` and the OpenAI / SGLang response shaping in ``endpoints/``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.protocol.errors import GatewayError
from gateway.server.http.admin import admin_router
from gateway.server.http.agents import agents_router
from gateway.server.http.door import HttpDoor
from gateway.server.http.health import health_router
from gateway.server.http.inference import InferencePath
from gateway.server.http.inference_routes import inference_routes
from gateway.server.http.openai import openai_router
from gateway.server.http.openapi import describe_request_bodies
from gateway.server.http.parse import parse_router
from gateway.server.http.util import error_response
from gateway.server.observability import ObservabilityMiddleware, install_observability
from gateway.server.security import is_loopback
from gateway.server.state import GatewayState


def metrics_guard(state: GatewayState) -> Callable[[Mapping[str, str]], None] | None:
    """/metrics names every worker and its address: behind a key unless the gateway is on
    loopback (``--metrics-access auto``) or the operator opens it."""
    access = state.config.security.metrics_access
    if access == "open" or (access == "auto" and is_loopback(state.config.server.host)):
        return None
    return state.auth.metrics


class GatewayApp(FastAPI):
    """FastAPI, except that the inference routes (``server.http.inference``) skip its stack."""

    inference: InferencePath
    inference_stack: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.inference.match(scope):
            scope["app"] = self
            await self.inference_stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(state: GatewayState, *, manage_lifecycle: bool = True) -> FastAPI:
    """The HTTP app of one gateway process."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await state.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await state.stop()

    app = GatewayApp(title="token-gateway", version="0.1.0", lifespan=lifespan)
    app.state.gateway = state
    door = HttpDoor(state)
    app.inference = InferencePath(door, inference_routes(state))
    for path in app.inference.routes:
        # In FastAPI's router too: its other methods get 405, and metrics get the route's path.
        route = Route(path, app.inference, methods=["POST"], include_in_schema=False)
        app.router.routes.append(route)
        app.inference.labels[path] = route
    app.include_router(openai_router(door))
    app.include_router(health_router(state))
    app.include_router(admin_router(door))
    app.include_router(parse_router(door))
    app.include_router(agents_router(door))
    for get in app.inference.gets:  # FastAPI's own route of that path reads the stored object: a label only
        app.inference.labels[get.path] = Route(get.path, app.inference, methods=["GET"], include_in_schema=False)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        status = exc.status_code
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return error_response(GatewayError(str(exc.detail), status=status, type=kind))

    install_observability(app, state.metrics, access_log=state.config.server.access_log, guard=metrics_guard(state))
    describe_request_bodies(app, app.inference.routes.values())
    app.inference_stack = ObservabilityMiddleware(app.inference, state.metrics, access_log=state.config.server.access_log)
    return app
